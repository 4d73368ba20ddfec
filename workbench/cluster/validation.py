"""The simulator checked against real rollouts it was not calibrated on.

Why: a prediction at 1024 GPUs is only worth what the simulator gets right where it can be
measured. So real rollout steps of a policy are run here, the step costs are taken from some
of them (the *calibration*), and every other run (*held out*: another seed, another N,
another number of requests per worker, Ray's wall clock) is predicted from its own response
lengths and the calibration's costs alone, then compared with its measured makespan.

Glossary:

run          one real rollout step (``RunSpec``): ``workers`` x ``per_worker`` requests, the
             prompts a seeded draw of the pool, ``samples_per_prompt`` each, every worker's
             shard decoded in one batch (``max_batch_size=None``, as the simulator assumes).
             ``backend`` ``"local"``: the workers one after another in this process, the
             *sim* clock; ``"ray"``: one Ray actor per worker, really in parallel, the *wall*
             clock (from the driver's submit to the last worker's last step).
calibration  the runs whose steps tables give the ``StepCost``. On a shared machine the cost of
             a step drifts with the load by tens of percent within minutes, so each held-out
             run is bracketed: a plain *pass* of the calibration runs just before it and
             one just after, and it is predicted with the costs of those two passes. The
             costs of the what-ifs pool every pass, and with a drafter the calibration runs
             again with SD on every decode step (its strategy's costs and tau), first and
             last.
spread       how much the workers' speeds differ: the standard deviation, within each plain
             calibration run (every pass), of log(measured / simulated) busy time per
             worker, pooled over the runs (``worker_spread``; the SD runs' workers differ in
             their drafts' acceptance too, which the simulator's mean tau leaves out). Here it is the
             machine's load moving under the sim clock's one-after-another workers; on a
             cluster, stragglers. Its mean per run (the load's level) is left out: the
             costs carry that.
repeats      each held-out run is run ``repeats`` times (the same seed: the same tokens and
             lengths), each repeat bracketed by its own passes (pass, run, pass, run, ...
             pass). A makespan of 0.2-0.7 s on a shared CPU moves by 10-20% from one
             repeat to the next (two quiet runs of the same validation, one repeat each, gave
             one run's error as -8% and +17%), which no cost model can predict; the
             per-repeat errors' median is what the simulator gets wrong, their range the
             machine's noise around it.
prediction   ``simulate_rollout`` of the run's requests on the workers that held them,
             plain, with a repeat's bracketing passes' costs and the spread: the mean
             makespan over ``SPREAD_DRAWS`` seeded draws of the workers' speeds (with
             stragglers the makespan, the slowest worker's end, grows with N).
error        per repeat ``(predicted - measured) / measured``; a run's ``error`` is the
             median over its repeats (``error_low``, ``error_high``: their range) and the
             notebook reports the median of its absolute value per clock.
busy error   the same of the mean worker's busy time (``busy_s``, no stragglers drawn): the
             cost model's own error, apart from where the slow workers fell.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ..checks import check_choice, check_int
from ..rollout import RolloutConfig, RolloutEngine, make_backend
from ..rollout.timeline import Timeline, usage_shares
from .cost import StepCost
from .importers import trace_from_timeline
from .simulate import Layout, layout, plain_makespan, simulate_rollout
from .trace import Trace

__all__ = ["RunSpec", "Validation", "real_rollout", "worker_spread",
           "predicted_makespan", "validation_table", "run_validation", "VALIDATION_COLUMNS"]

BACKEND_CLOCKS = {"local": "sim", "ray": "wall"}
VALIDATION_COLUMNS = ("run", "clock", "workers", "per_worker", "seed", "repeats", "measured_s",
                      "predicted_s", "error", "error_low", "error_high", "measured_busy_s",
                      "predicted_busy_s", "busy_error")
"""The columns of the validation table (`validation_table`), in order."""
SPREAD_DRAWS = 16
WARM_UP_TOKENS = 4  # tokens of each engine's warm-up rollout (``_warm_up``)


@dataclass(frozen=True)
class RunSpec:
    """One real rollout step to run: its name in the table, N ``workers``, ``per_worker``
    requests each, the ``seed`` of its prompt draw and sampling, and its ``backend``."""

    run: str
    workers: int
    per_worker: int
    seed: int = 0
    backend: str = "local"

    def __post_init__(self):
        check_int("RunSpec.workers", self.workers, 1)
        check_int("RunSpec.per_worker", self.per_worker, 1)
        check_int("RunSpec.seed", self.seed, 0)
        check_choice("RunSpec.backend", self.backend, tuple(BACKEND_CLOCKS))

    @property
    def requests(self) -> int:
        return self.workers * self.per_worker

    def prompts(self, pool: list, samples_per_prompt: int) -> list:
        """The run's prompts: ``requests / samples_per_prompt`` drawn from ``pool`` without
        replacement, seeded by the run's seed."""
        need = self.requests // samples_per_prompt
        picks = np.random.default_rng(self.seed).choice(len(pool), need, replace=False)
        return [pool[i] for i in sorted(picks)]


def _check_plan(specs: list[RunSpec], pool: list, config: RolloutConfig) -> None:
    """Every run fits its prompts, before any runs."""
    g = config.samples_per_prompt
    for spec in specs:
        if spec.requests % g or spec.requests // g > len(pool):
            raise ValueError(f"run {spec.run!r}: {spec.workers} x {spec.per_worker} = "
                             f"{spec.requests} requests must be a multiple of samples_per_prompt "
                             f"{g} and need at most {len(pool)} prompts (the pool's size)")


def real_rollout(engine: RolloutEngine, pool: list, spec: RunSpec, config: RolloutConfig,
                 drafter=None) -> Timeline:
    """One real rollout step of ``spec`` on ``engine`` (its backend must be the spec's):
    ``config`` with the spec's workers and seed, each shard in one batch; with ``drafter``,
    SD on every decode step (``config.spec_k`` drafts)."""
    run = replace(config, workers=spec.workers, seed=spec.seed, max_batch_size=None)
    prompts = spec.prompts(pool, config.samples_per_prompt)
    return engine.rollout(prompts, run, progress=False, drafter=drafter).timeline


def _layout(timeline: Timeline) -> Layout:
    """``timeline``'s requests (their lengths, on the workers that held them): all of a run
    the simulator is given."""
    return layout(trace_from_timeline(timeline))


def worker_spread(timelines: list[Timeline], cost: StepCost) -> float:
    """The workers' log-speed spread the runs show at ``cost`` (module docstring): 0 when
    no run has two workers."""
    deviations = []
    for timeline in timelines:
        measured = timeline.worker_summary()["busy_s"].to_numpy()
        simulated = simulate_rollout(_layout(timeline), cost).worker_summary()["busy_s"].to_numpy()
        logs = np.log(measured / simulated)
        deviations += list(logs - logs.mean()) if len(logs) > 1 else []
    n = len(deviations) - sum(t.num_workers > 1 for t in timelines)  # a mean per run
    return float(np.sqrt(np.sum(np.square(deviations)) / n)) if n > 0 else 0.0


def predicted_makespan(timeline: Timeline, cost: StepCost, spread: float = 0.0) -> float:
    """The simulator's plain makespan of ``timeline``'s requests at ``cost``: with
    ``spread``, the mean over ``SPREAD_DRAWS`` draws of the workers' speeds."""
    lay = _layout(timeline)
    draws = SPREAD_DRAWS if spread > 0 else 1
    return float(np.mean([plain_makespan(lay, cost, spread, seed) for seed in range(draws)]))


def validation_table(runs: list[tuple[RunSpec, list[Timeline]]],
                     cost: StepCost | dict[str, list[StepCost]],
                     spread: float = 0.0) -> pd.DataFrame:
    """One row per held-out run (``VALIDATION_COLUMNS``) from its repeats' timelines: the
    medians over repeats of the measured makespan, of its prediction (from the run's lengths,
    the repeat's ``cost``, one for all or per run name and repeat, and ``spread``) and of the
    relative error, with the errors' range; the same medians of the mean worker's busy
    time."""
    rows = []
    for spec, timelines in runs:
        per_repeat = [_repeat_row(t, cost if isinstance(cost, StepCost) else cost[spec.run][i],
                                  spread) for i, t in enumerate(timelines)]
        r = pd.DataFrame(per_repeat)
        rows.append({"run": spec.run, "clock": timelines[0].clock, "workers": spec.workers,
                     "per_worker": spec.per_worker, "seed": spec.seed,
                     "repeats": len(timelines), **r.median().to_dict(),
                     "error_low": r["error"].min(), "error_high": r["error"].max()})
    return pd.DataFrame(rows, columns=list(VALIDATION_COLUMNS))


def _repeat_row(timeline: Timeline, cost: StepCost, spread: float) -> dict[str, float]:
    """One repeat's measured and predicted makespan and mean busy time, and their errors."""
    measured, predicted = timeline.makespan_s, predicted_makespan(timeline, cost, spread)
    busy = timeline.worker_summary()["busy_s"].mean()
    busy_predicted = simulate_rollout(_layout(timeline), cost).worker_summary()["busy_s"].mean()
    return {"measured_s": measured, "predicted_s": predicted,
            "error": (predicted - measured) / measured, "measured_busy_s": busy,
            "predicted_busy_s": busy_predicted, "busy_error": (busy_predicted - busy) / busy}


@dataclass
class Validation:
    """What ``run_validation`` measured: the pooled ``cost`` (every pass, SD included: what
    the what-ifs take), each held-out repeat's ``costs`` (its bracketing passes; by run name,
    a list over repeats), the workers' ``spread``, the ``table`` of held-out errors, and
    every real run's timeline (``calibration``: the plain passes in order, then the SD runs;
    ``held_out``: by run name, a list over repeats)."""

    cost: StepCost
    costs: dict[str, list[StepCost]]
    spread: float
    table: pd.DataFrame
    calibration: list[Timeline]
    held_out: dict[str, list[Timeline]]

    def median_error(self, clock: str, column: str = "error") -> float:
        """The median absolute relative error (``column``: ``"error"`` of the makespan,
        ``"busy_error"`` of the mean worker) of the held-out runs on ``clock`` (NaN: none)."""
        errors = self.table.loc[self.table["clock"] == clock, column].abs()
        return float(errors.median()) if len(errors) else float("nan")

    def disturbed_share(self, clock: str) -> float:
        """The share of the held-out runs' measured seconds on ``clock`` that other work on
        the machine disturbed (``Timeline.usage_s``, ``workbench.clock``): a wall-clock error
        measured on a busy machine says so (NaN: no runs, or none recorded it)."""
        usages = [t.usage_s() for runs in self.held_out.values() for t in runs
                  if t.clock == clock]
        return usage_shares(usages)["disturbed_share"]

    def metrics(self) -> dict[str, float]:
        """notebook 10's validation figures: the median absolute errors per clock, of the
        makespan and of the mean worker's busy time (NaN for a clock without runs), the
        share of each clock's measured seconds that were disturbed, and the workers' spread."""
        return {"sim_error_small_n": self.median_error("sim"),
                "sim_error_wall": self.median_error("wall"),
                "busy_error_small_n": self.median_error("sim", "busy_error"),
                "busy_error_wall": self.median_error("wall", "busy_error"),
                "disturbed_share_small_n": self.disturbed_share("sim"),
                "disturbed_share_wall": self.disturbed_share("wall"),
                "worker_spread": self.spread,
                "validation_runs": int(len(self.table))}

    def lengths(self) -> Trace:
        """Every plain run's requests as one trace (group: run and prompt), the recorded
        lengths a what-if draws from."""
        parts = []
        for i, t in enumerate([self.calibration[0], *[r[0] for r in self.held_out.values()]]):
            r = trace_from_timeline(t).requests
            parts.append(r.assign(group=f"{i}/" + r["group"]).drop(columns="worker"))
        return Trace(pd.concat(parts, ignore_index=True))


def _warm_up(engine: RolloutEngine, pool, spec: RunSpec, config: RolloutConfig) -> None:
    """One short rollout of ``spec``'s shape: an engine's first pays one-off costs
    (allocations, lazy imports, a Ray actor's first call) that no run should measure."""
    real_rollout(engine, pool, spec, replace(config, max_new_tokens=WARM_UP_TOKENS))


def _rollouts(engine: RolloutEngine, pool, specs, config, drafter=None) -> list[Timeline]:
    return [real_rollout(engine, pool, spec, config, drafter) for spec in specs]


def _bracketed(run_once, repeats: int, calibration_pass, passes: list) -> tuple[list, list]:
    """``repeats`` runs of ``run_once()``, each followed by a ``calibration_pass()`` (appended
    to ``passes``, whose last is the pass just before the first run): (the runs' timelines,
    each run's costs from the passes just before and just after it)."""
    timelines, costs = [], []
    for _ in range(repeats):
        timelines.append(run_once())
        passes.append(calibration_pass())
        costs.append(StepCost.from_timelines(passes[-2] + passes[-1]))
    return timelines, costs


def _ray_runs(model, tokenizer, pool, spec, config, ray_address, run_dir, repeats,
              calibration_pass, passes) -> tuple[list, list]:
    """One Ray run's repeats: its actors (one torch thread each) started and warmed up, a
    ``calibration_pass()`` (local, the actors idle) just before the clock first runs, then
    ``_bracketed``; the actors closed after it (and the local Ray it started with them)."""
    backend = make_backend("ray", ray_address, run_dir=run_dir, threads_per_worker=1)
    try:
        engine = RolloutEngine(model, tokenizer, backend=backend)
        engine.start(spec.workers)
        _warm_up(engine, pool, spec, config)
        passes.append(calibration_pass())
        return _bracketed(lambda: real_rollout(engine, pool, spec, config), repeats,
                          calibration_pass, passes)
    finally:
        backend.close()


def _check_validation(pool, calibration, held_out, config) -> None:
    _check_plan([*calibration, *held_out], pool, config)
    if not calibration or any(s.backend != "local" for s in calibration):
        raise ValueError(f"calibration needs at least one run, all on the local backend; got "
                         f"{[(s.run, s.backend) for s in calibration]}")
    names = [s.run for s in held_out]
    if len(set(names)) < len(names):
        raise ValueError(f"held-out runs need distinct names; got {names}")


def run_validation(model, tokenizer, pool: list, calibration: list[RunSpec],
                   held_out: list[RunSpec], config: RolloutConfig, drafter=None,
                   ray_address: str | None = None, run_dir=None,
                   repeats: int = 3) -> Validation:
    """Run every ``held_out`` run ``repeats`` times, each repeat bracketed by plain passes of
    the ``calibration`` runs (the Ray ones last, each on a Ray of its own: ``ray_address``,
    else a local one with its logs under ``run_dir/ray``), the calibration runs with
    ``drafter`` first and last, and predict each repeat from its lengths with its passes'
    costs (module docstring). Every plan is checked before anything runs; calibration runs
    must be local."""
    check_int("repeats", repeats, 1)
    _check_validation(pool, calibration, held_out, config)
    engine = RolloutEngine(model, tokenizer)
    _warm_up(engine, pool, calibration[0], config)

    def calibration_pass():
        return _rollouts(engine, pool, calibration, config)

    def with_drafter():
        return [] if drafter is None else _rollouts(engine, pool, calibration, config, drafter)

    speculative, passes = with_drafter(), [calibration_pass()]
    done, costs = {}, {}
    for spec in sorted(held_out, key=lambda s: s.backend == "ray"):
        if spec.backend == "ray":
            done[spec], costs[spec.run] = _ray_runs(model, tokenizer, pool, spec, config,
                                                    ray_address, run_dir, repeats,
                                                    calibration_pass, passes)
        else:
            done[spec], costs[spec.run] = _bracketed(
                lambda: real_rollout(engine, pool, spec, config), repeats, calibration_pass,
                passes)
    speculative += with_drafter()
    plain = [t for p in passes for t in p]
    cost = StepCost.from_timelines(plain + speculative)
    spread = worker_spread(plain, cost)
    runs = [(spec, done[spec]) for spec in held_out]
    return Validation(cost, costs, spread, validation_table(runs, costs, spread),
                      plain + speculative, {spec.run: t for spec, t in runs})
