"""The TLT ablation: every variant over several seeds, run in lockstep, and its measures.

Variants advance one RL step at a time in a rotating order (baseline, static SD, adaptive
drafter, TLT, then the next seed...), so that a machine that slows down for a while slows
every variant alike, the way the SD benchmarks alternate their systems inside each repeat.
All measures follow docs/design.md: step times on the sim clock (rollout makespan of N workers,
the policy update charged as its measured time / N; drafter work runs only inside idle windows
and is preempted at their end, so it never adds to a step),
rollout fraction, end-to-end speedup (sum of baseline step times over the variant's) and its
Amdahl prediction ``1 / ((1 - f) + f / s)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from ...checks import check_int, check_list
from ...clock import sim_seconds, sim_seconds_kind
from ...rollout import make_backend
from ...rollout.backend import check_capacity
from ...scalar_log import check_report_to
from ...side_by_side import width_for
from ...speculative.decisions import (BANDIT_CHOICE_COLUMNS, DECIDED_COLUMNS, bandit_choices,
                                    bandit_decisions, explore_cost, plain_share)
from ...tasks import exact_match_reward
from ..grpo import GRPO, GRPOConfig
from ..remedies.compare import remedy_metrics
from ..setup import DEFAULT_VARIANTS, RLSetup
from ..tlt import first_divergence
from ..variants import check_variants, tlt_config
from .runs import Turns, build_run, evaluate_runs, evaluation_due, lockstep
from .store import AblationStore, ablation_settings, run_folder, saved_sim_seconds

__all__ = ["Ablation", "run_ablation", "check_ablation", "coupled_first_divergence",
           "notebook_backend", "close_backend"]

SEED_MAX = 2 ** 63 - 1  # a seed seeds a torch.Generator (TrainConfig.seed's range)


def amdahl(fraction: float, speedup: float) -> float:
    """The end-to-end speedup when a ``fraction`` of the time runs ``speedup`` times faster."""
    return 1.0 / ((1.0 - fraction) + fraction / speedup)


@dataclass
class Ablation:
    """Histories of every (variant, seed), their step timelines, and held-out accuracies."""

    history: pd.DataFrame                   # one row per variant, seed, RL step
    evals: pd.DataFrame                     # variant, seed, step, accuracy (held-out, greedy)
    trainers: dict = field(default_factory=dict)   # (variant, seed) -> its RLLoop trainer
    sim_seconds: str = "thread_cpu"         # what its sim seconds are (workbench.clock)

    def timeline(self, variant: str, seed: int, step: int):
        """The timeline of one RL step of one run."""
        return self.trainers[(variant, seed)].record.timelines[step]

    def save_timelines(self, folder, seeds=None) -> list[Path]:
        """Save every RL step's timeline of ``seeds`` (default: all) of every variant as
        ``folder/<variant>-seed<seed>/step<NN>``, so a timeline explorer can read them back
        from the run's files alone. Returns the folders written."""
        known = sorted({seed for _, seed in self.trainers})
        seeds = known if seeds is None else list(seeds)
        unknown = [s for s in seeds if s not in known]
        if unknown:
            raise ValueError(f"no runs of seed(s) {unknown}; accepted: {known}")
        records = {key: tr.record for key, tr in self.trainers.items()}
        last = max((step for r in records.values() for step in r.timelines), default=0)
        width = max(2, len(str(last)))
        return [tl.save(Path(folder) / f"{v}-seed{seed}" / f"step{step:0{width}d}")
                for (v, seed), r in records.items() if seed in seeds
                for step, tl in sorted(r.timelines.items())]

    def per_variant(self) -> pd.DataFrame:
        """Per variant: summed sim step and rollout times (over seeds and steps), final reward
        (mean and standard deviation over seeds), idle fractions, acceptance length, and the
        share of its measured seconds that other work disturbed (``GRPO.usage``)."""
        h = self.history
        last = h[h["step"] == h["step"].max()]
        g = h.groupby("variant", sort=False)
        out = pd.DataFrame({
            "step_s": g["step_s"].sum(), "rollout_s": g["rollout_s"].sum(),
            "update_sim_s": g["update_sim_s"].sum(),
            "rollout_fraction": g["rollout_s"].sum() / g["step_s"].sum(),
            "idle_fraction": g["idle_fraction"].mean(),
            "wasted_fraction": g["wasted_fraction"].mean(),
            "accept_len": g["accept_len"].mean() if "accept_len" in h else np.nan,
            "reward_final": last.groupby("variant")["reward"].mean(),
            "reward_final_sd": last.groupby("variant")["reward"].std(ddof=1),
        })
        usage = pd.DataFrame({v: GRPO.usage(rows) for v, rows in g}).T
        out = out.join(usage)  # disturbed_share, cpu_share (workbench.clock)
        base = out.loc["baseline"] if "baseline" in out.index else None
        if base is not None:
            out["e2e_speedup"] = base["step_s"] / out["step_s"]
            out["rollout_speedup"] = base["rollout_s"] / out["rollout_s"]
            out["amdahl_prediction"] = [amdahl(base["rollout_fraction"], s)
                                        for s in out["rollout_speedup"]]
        return out.rename_axis("variant").reset_index()

    @property
    def variants(self) -> list[str]:
        """The variants that ran, in run order."""
        return list(dict.fromkeys(v for v, _ in self.trainers)) or \
            list(self.history["variant"].unique())

    def bandit_choices(self, variant: str = "tlt") -> pd.DataFrame:
        """The bandit's choices per batch-size bucket (``speculative.decisions.bandit_choices``)
        of every step and seed of ``variant``; empty (same columns) when it did not run."""
        tables = [bandit_choices(tl) for (v, _), tr in self.trainers.items() if v == variant
                  for tl in tr.record.timelines.values()]
        if not tables:
            return pd.DataFrame({c: pd.Series(dtype=t)
                                 for c, t in BANDIT_CHOICE_COLUMNS.items()})
        return pd.concat(tables, ignore_index=True)

    def decisions(self, variant: str = "tlt") -> pd.DataFrame:
        """Every decided decode step of every step and seed of ``variant``
        (``speculative.decisions.bandit_decisions`` with a ``seed`` and an RL ``step``
        column; empty when none)."""
        tables = [bandit_decisions(tl).assign(seed=seed, step=step)
                  for (v, seed), tr in self.trainers.items() if v == variant
                  for step, tl in tr.record.timelines.items()]
        return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(
            columns=[*DECIDED_COLUMNS, "seed", "step"])

    def learned(self, variant: str = "tlt") -> pd.DataFrame:
        """What the adaptive engine of each seed of ``variant`` learned of this machine by
        the end of its run (``AdaptiveSchedule.learned``, with a ``seed`` column): per bucket,
        plain's tokens/s, the best SD arm's, their ratio and the arm it now chooses."""
        tables = [learned.assign(seed=seed) for (v, seed), tr in self.trainers.items()
                  if v == variant and (learned := tr.record.learned) is not None]
        return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()

    def paired_speedups(self, variant: str) -> pd.Series:
        """Per (seed, RL step): the baseline's step time over ``variant``'s. The variants ran
        that step side by side, so the median of these ratios shrugs off a stall of the
        machine in one of them, which the ratio of summed times (``e2e_speedup``) carries:
        one worker stalled for 0.3 s sets a 16-worker makespan of 0.2 s."""
        steps = self.history.pivot_table(index=["seed", "step"], columns="variant",
                                         values="step_s")
        return (steps["baseline"] / steps[variant]).dropna().rename("e2e_speedup")

    def remedy_metrics(self) -> dict:
        """Notebook 11's scalars (``rl.remedies.compare.remedy_metrics``): every variant's
        speedup (the median of :meth:`paired_speedups`), off-policy share, final held-out
        accuracy and time to the baseline's final accuracy, and the variant that got there
        first."""
        speedups = {v: float(self.paired_speedups(v).median()) for v in self.variants}
        return remedy_metrics(self.history, self.evals, speedups)

    def metrics(self, variant: str | None = None) -> dict:
        """The flat scalars notebook 04 reports: ``variant`` (default: ``tlt`` when it ran,
        else the last variant that did) against the baseline, which must have run. Every key
        of one variant's figures ends with that variant's name (``reward_final_baseline``,
        ``e2e_speedup_tlt``: the variant's speedup over the baseline); ``compared_variant``
        names it too. A baseline-only ablation compares the baseline with itself (speedups
        1, and the ``_baseline`` keys once)."""
        ran = self.variants
        v = variant or ("tlt" if "tlt" in ran else ran[-1])
        for name in ("baseline", v):
            if name not in ran:
                raise ValueError(f"variant {name!r} did not run; ran: {ran}")
        pv = self.per_variant().set_index("variant")
        b, t = pv.loc["baseline"], pv.loc[v]
        ev = self.evals if len(self.evals) else pd.DataFrame(
            columns=["variant", "seed", "step", "accuracy"], dtype=float)  # none measured
        h = self.history[self.history["variant"] == v]
        decisions = self.decisions(v)
        base_ev = ev[ev["variant"] == "baseline"]
        final = base_ev[base_ev["step"] == base_ev["step"].max()]
        paired = self.paired_speedups(v)
        return {"compared_variant": v,
                f"e2e_speedup_{v}": float(t["e2e_speedup"]),
                f"e2e_speedup_median_{v}": float(paired.median()),
                f"e2e_speedup_q25_{v}": float(paired.quantile(0.25)),
                f"e2e_speedup_q75_{v}": float(paired.quantile(0.75)),
                f"amdahl_prediction_{v}": float(t["amdahl_prediction"]),
                f"e2e_over_amdahl_{v}": float(t["e2e_speedup"] / t["amdahl_prediction"]),
                f"rollout_speedup_{v}": float(t["rollout_speedup"]),
                "rollout_fraction_baseline": float(b["rollout_fraction"]),
                "accuracy_start": float(ev[ev["step"] == 0]["accuracy"].mean()),
                "accuracy_final_baseline": float(final["accuracy"].mean()),
                "accuracy_best_baseline": float(base_ev.groupby("step")["accuracy"].mean().max()),
                "reward_final_baseline": float(b["reward_final"]),
                f"reward_final_{v}": float(t["reward_final"]),
                "reward_final_sd_baseline": float(b["reward_final_sd"]),
                f"reward_final_sd_{v}": float(t["reward_final_sd"]),
                "idle_fraction_baseline": float(b["idle_fraction"]),
                f"idle_fraction_{v}": float(t["idle_fraction"]),
                f"wasted_fraction_{v}": float(t["wasted_fraction"]),
                "drafter_overrun_s_max": _max_or_zero(self.history, "drafter_overrun_s"),
                f"drafter_preempted_{v}": int(h.get("drafter_preempted", pd.Series([0])).sum()),
                f"drafter_wasted_s_{v}": float(h.get("drafter_wasted_s", pd.Series([0.0])).sum()),
                f"explore_cost_{v}": explore_cost(decisions),
                f"plain_share_{v}": plain_share(decisions),
                "disturbed_share_baseline": float(b["disturbed_share"]),
                f"disturbed_share_{v}": float(t["disturbed_share"]),
                **GRPO.usage(self.history),  # the whole run's disturbed_share and cpu_share
                "clock": _first(self.history, "clock"), "sim_seconds": self.sim_seconds,
                "rl_steps": int(self.history["step"].max() + 1),
                "seeds": int(self.history["seed"].nunique())}


def _first(history: pd.DataFrame, column: str) -> str | None:
    """The first value of ``column`` over every run (None when no run has it)."""
    values = history[column].dropna() if column in history else []
    return str(values.iloc[0]) if len(values) else None


def _max_or_zero(history: pd.DataFrame, column: str) -> float:
    """The largest value of ``column`` over every run (0 when no run has it)."""
    return float(history[column].max()) if column in history and history[column].notna().any() \
        else 0.0


def run_ablation(policy, tokenizer, problems, grpo: GRPOConfig, steps: int,
                 variants=DEFAULT_VARIANTS, seeds=(0,), drafter_head=None,
                 reward=exact_match_reward, eval_problems=None, eval_max_new_tokens=None,
                 eval_every: int | None = None, progress: bool = True, backend="local",
                 ray_address: str | None = None, run_dir=None, checkpoint_dir=None,
                 checkpoint_every: int | None = None, report_to: str = "none",
                 **tlt_kw) -> Ablation:
    """Run ``variants`` x ``seeds`` for ``steps`` RL steps each, in lockstep.

    ``variants``: any registered RL variant (``rl.variants.variant_names``): TLT's
    (``baseline``, ``static_sd``, ``adaptive_drafter``, ``tlt``), the long-tail remedies'
    (``overprovision``, ``april``, ``partial``, ``async``, ``tail_batching``, each at
    ``rl.variants.remedy_config``'s defaults), a plugin's (docs/extending.md), and TLT beside each
    composable one (``tlt+<remedy>``: TLT's SD, spot-trained drafter and adaptive engine in
    the remedy's rollouts; ``tlt_kw`` as for ``tlt``).

    Every run starts from its own copy of ``policy`` (and of ``drafter_head``); seed ``s``
    sets the GRPO seed (prompt order, sampling). ``tlt_kw`` go to every :class:`TLTConfig`
    (threshold, arms, spec_k, spot, ...). With ``eval_problems`` the held-out greedy accuracy
    of each run is measured before the first step and after the last, and also after every
    ``eval_every`` steps when set (long runs: the accuracy curve, not just its ends).

    ``backend`` says where the rollout workers run. ``"local"``: each run on its own local
    backend, its workers sharing its policy. ``"ray"`` (``ray_address`` as
    :class:`~workbench.rl.grpo.GRPO`'s) or a backend object: one backend serves every run, so
    that one Ray and one set of actors serve the whole ablation (the runs take turns, one step
    at a time): its workers hold a copy of the policy, and each run's weights go to them
    before its step. A backend object already started with ``grpo.rollout.workers`` workers
    that run on copies (``runs_copies``: Ray actors, whose policies no caller holds) is used
    as it is, so that several ablations share its actors; any other is started here. A
    backend made from a name is closed at the end; an object stays the caller's. The backend
    is checked before any run is built. ``run_dir``: the run's folder, where a local Ray
    keeps its logs (``run_dir/ray``: ``rollout.backends.make_backend``).

    ``report_to="tensorboard"``: every run's per-step scalars (``workbench.scalar_log``) in a
    log folder of its own, ``<folder>/<variant>-seed<seed>/tensorboard`` under
    ``checkpoint_dir`` (else ``run_dir``); a resumed ablation writes no step twice.

    Runs on local backends of their own go side by side, one per torch thread the process
    has (``workbench.side_by_side``): each run's sim seconds are its own thread's CPU time,
    so its figures are those of the runs one at a time, in less wall time.

    ``checkpoint_dir`` (``rl.ablation.store``): each run checkpoints there every
    ``checkpoint_every`` steps (None: at each evaluation and the end only); a call with the
    same arguments goes on where the last stopped, redoing no evaluation, a finished one
    returns without stepping, and a folder of other settings is refused before anything runs.

    Every argument (:func:`check_ablation`, the folder's settings) is checked, and every run
    built, before a file is written or Ray started: a refused call leaves ``checkpoint_dir``
    as it was (not made, when it was missing), so that the corrected call runs there.
    """
    variants, seeds = _check_runs(steps, variants, seeds, eval_every)
    logs = checkpoint_dir if checkpoint_dir is not None else run_dir
    check_report_to(report_to, logs)
    shared = _backend_for(backend, ray_address, grpo.rollout.workers, run_dir)
    max_new = eval_max_new_tokens or grpo.rollout.max_new_tokens
    # a folder saved on wall-time sim seconds resumes on them (workbench.clock)
    with sim_seconds(saved_sim_seconds(checkpoint_dir) or sim_seconds_kind()):
        store = _open_store(checkpoint_dir, checkpoint_every, steps, ablation_settings(
            variants, seeds, grpo, problems, reward, eval_problems, eval_every, max_new, backend,
            tlt_kw))
        shared = None if isinstance(backend, str) and backend == "local" else shared
        runs = {(v, seed): build_run(v, seed, policy, tokenizer, problems, reward, grpo,
                                     drafter_head, shared, tlt_kw,
                                     store.state_dir((v, seed)) if store is not None else None,
                                     report_to, None if logs is None
                                     else Path(logs) / run_folder((v, seed)))
                for seed in seeds for v in variants}
        if store is not None:
            store.restore(runs)
            store.save_settings()
        evals = store.evals if store is not None else []
        width = width_for(sim_seconds_kind(), shared is not None)
        evaluate = partial(evaluate_runs, runs, evals, eval_problems, tokenizer, max_new,
                           width=width)
        try:
            lockstep(runs, Turns(runs, shared, grpo.rollout.workers, policy), steps,
                     partial(evaluation_due, steps=steps, eval_every=eval_every), evaluate, store,
                     progress, width)
        finally:
            for run in runs.values():
                run.close_log()
            if shared is not None and isinstance(backend, str):
                shared.close()
        return _ablation_of(runs, evals, sim_seconds_kind())


def _ablation_of(runs: dict, evals: list[dict], sim_seconds: str) -> Ablation:
    """The ablation's tables from its ``runs`` (``(variant, seed)`` -> trainer, in run
    order): every run's step rows, and the evaluations by step, then in run order."""
    order = list(runs)
    evals.sort(key=lambda e: (e["step"], order.index((e["variant"], e["seed"]))))
    rows = [{"variant": v, "seed": seed, **row} for (v, seed), tr in runs.items()
            for row in tr.record.rows]
    return Ablation(pd.DataFrame(rows), pd.DataFrame(evals), runs, sim_seconds)


def check_ablation(steps: int, variants, seeds, grpo: GRPOConfig, *,
                   eval_every: int | None = None, backend="local",
                   ray_address: str | None = None, checkpoint_every: int | None = None,
                   **tlt_kw) -> None:
    """Refuse the arguments of an ablation (:func:`run_ablation`'s) that no model is needed to
    check, each with a ValueError naming the value and what is accepted, before anything is
    written or started: ``steps``, ``variants`` and ``seeds`` (non-empty lists, each item
    once), ``eval_every``, ``checkpoint_every``, TLT's arguments ``tlt_kw``, the backend and
    its capacity: ``grpo``'s workers of one Ray CPU each (``threads_per_worker``) against the
    CPUs of the Ray they would run on, where known without starting it (this process's Ray,
    or a local one yet to start: the machine's CPU count; a cluster at an address is checked
    once attached, when the first step starts the workers). ``run_ablation`` checks the same
    before it writes; an RL notebook calls this in the cell after its parameters, so that a
    bad one stops it before its setup reads it, loads a model or writes its folder."""
    _check_runs(steps, variants, seeds, eval_every)
    check_int("checkpoint_every", checkpoint_every, 1, optional=True)
    tlt_config("tlt", grpo, **tlt_kw)  # refuses bad engine and drafter arguments
    _backend_for(backend, ray_address, grpo.rollout.workers)


def _check_runs(steps: int, variants, seeds, eval_every: int | None) -> tuple[list, list]:
    """The variants and seeds as lists, after checking them, ``steps`` and ``eval_every``."""
    check_int("steps", steps, 0)
    variants = check_variants(variants)
    seeds = check_list("seeds", seeds, lambda name, seed: check_int(name, seed, 0, SEED_MAX),
                       f"integers in [0, {SEED_MAX}]")
    if eval_every is not None:
        check_int("eval_every", eval_every, 1)
    return variants, seeds


def _backend_for(backend, ray_address: str | None, workers: int, run_dir=None):
    """The backend the runs share (``make_backend``: made, not started), checked to hold
    ``workers`` workers (``rollout.backend.check_capacity``) before anything starts."""
    made = make_backend(backend, ray_address, run_dir=run_dir)
    check_capacity(made, check_int("workers", workers, 1))
    return made


def _open_store(checkpoint_dir, checkpoint_every, steps: int, settings: dict):
    """The ablation's :class:`AblationStore` in ``checkpoint_dir`` (None without one), its
    settings and ``steps`` checked against what the folder holds; nothing written yet."""
    if checkpoint_dir is None:
        if checkpoint_every is not None:
            raise ValueError(f"checkpoint_every={checkpoint_every!r} without checkpoint_dir; "
                             "accepted: None, or a checkpoint_dir to checkpoint into")
        return None
    store = AblationStore(checkpoint_dir, settings, checkpoint_every)
    store.check_steps(steps)
    return store


def notebook_backend(backend="local", ray_address: str | None = None,
                     run_dir: str | Path | None = None):
    """The rollout backend every ablation of one notebook shares: ``"local"`` as it is (each
    run on a local backend of its own), any other made here once (``make_backend``: a local
    Ray keeps its logs in ``run_dir/ray``), so that the ablation and the coupled pair after
    it run on one set of actors, started by the first call and used as it is by the next
    (``run_ablation``: an object stays the caller's). :func:`close_backend` ends it."""
    if isinstance(backend, str) and backend == "local":
        make_backend(backend, ray_address)  # refuses a Ray address given with "local"
        return backend
    return make_backend(backend, ray_address, run_dir=run_dir)


def close_backend(backend) -> None:
    """Close what :func:`notebook_backend` made (nothing to close for ``"local"``)."""
    if not isinstance(backend, str):
        backend.close()


def coupled_first_divergence(setup: RLSetup, grpo: GRPOConfig, steps: int, seed: int = 0,
                             **tlt_kw) -> int | None:
    """Run the baseline and TLT side by side for ``steps`` RL steps with coupled sampling
    and return the first step whose tokens differ (-1: none; in float64 there is none, in
    float32 a verify pass may round differently). ``None`` when not measured: ``steps`` is 0,
    or the setup has no drafter head (every variant it was made for is the baseline).
    ``tlt_kw`` go to :func:`run_ablation` (``backend`` and ``ray_address`` too).
    """
    check_int("steps", steps, 0)
    check_int("seed", seed, 0, SEED_MAX)  # checked even where the pair is skipped
    if steps == 0 or setup.drafter_head is None:
        return None
    pair = run_ablation(setup.policy, setup.tokenizer, setup.pool,
                        grpo.updated(spec_mode="coupled"), steps, variants=["baseline", "tlt"],
                        seeds=[seed], drafter_head=setup.drafter_head, reward=setup.reward,
                        progress=False, **tlt_kw)
    h = pair.history
    return first_divergence(h[h["variant"] == "baseline"], h[h["variant"] == "tlt"])
