"""The diagnosis: from a run's own logs, where its step time goes, whether SD can pay at the
batch its rollout runs at, and what each remedy would buy on these steps.

Why: "SD made the benchmark faster but not my RL run" has a handful of causes (a reward or
update that dominates the step, a live batch above where SD pays, lengths that changed with
SD, a short tail), and each one is a number the logs already hold or a prediction the
cluster simulator makes from them. The recipe:

1. **Step split** (logged times): rollout, reward, log-probs, update and the rest, each a
   share of the step; the Amdahl bound of any rollout remedy is step / (step - rollout).
2. **The rollout's long tail** (per-request lengths, where the logs hold them): each step's
   requests laid out on the workers (a workbench run: as recorded; a dump: round-robin over
   ``workers``, one batch per worker), replayed plain by ``cluster.simulate_rollout``; idle
   fraction and tail share are ``Timeline``'s, p99/p50 is of the lengths. A workbench run's
   own saved timelines give its measured ones instead.
3. **Live batch against SD's crossover**: the share of decode time (summed over workers) at
   a live batch at or above B, the smallest batch where the user's curve says SD stops paying.
4. **Remedies**: TLT with the threshold rule (SD below B) and with the bandit's limit,
   simulated on each step; the step's rollout time scales by the simulated ratio and the rest
   of the step stays as logged. The step costs: a workbench run's measured ones (its
   baseline's plain steps and static SD's); otherwise synthetic ones from the user's curve.
   Over-provisioning, APRIL, partial rollouts and tail batching are replayed over the
   simulated steps, one after another (``cluster.remedies``: they carry groups and prompts
   from step to step), at the same costs; TLT beside each, one-step async (alone and with
   TLT) and Seer's scheduling (alone and with TLT) are simulated too (``diagnose.variants``).
   Each prediction carries its model's validated error, or says that none is recorded and
   what would record it.

Each part has its own module: the replay on the simulator (``diagnose.replay``), the
remedies' predictions (``diagnose.remedies``) and the reading (``diagnose.findings``); this
one runs them in order and gathers what they return into a ``Diagnosis``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..checks import check_int, check_positive
from .findings import findings_of, undecided_of
from .remedies import MEASURED_AS, measured_speedups, predict_remedies, remedy_ratios
from .replay import layouts, measured_curve, simulate, synthetic_cost
from .sd_curve import crossover, read_sd_curve
from .steplog import PARTS, StepLog
from .validated import RESULTS, headline_error
from .variants import capped_bandit, seer_ratios, variant_rows

__all__ = ["Diagnosis", "diagnose"]


@dataclass
class Diagnosis:
    """What ``diagnose`` found: tables (``steps``: each step's parts and shares; ``tail``:
    the rollout's long tail per simulated step; ``batch``: decode time per live batch size;
    ``remedies``: each remedy's predicted end-to-end speedup, how it was got and its error),
    ``findings`` (each a ``cause`` code and its ``sentence``, the bottleneck first),
    ``undecided`` (what the logs could not decide, naming the missing field) and
    ``summary`` (the scalars of diagnosis.json)."""

    steps: pd.DataFrame
    tail: pd.DataFrame | None
    batch: pd.DataFrame | None
    remedies: pd.DataFrame
    findings: list[dict]
    undecided: list[str]
    summary: dict
    curve: pd.DataFrame | None = None
    live: pd.DataFrame | None = None  # one step's live batch per worker over time (a figure)
    measured: pd.DataFrame | None = None  # a workbench run: each variant's measured speedup
    notes: list[str] = field(default_factory=list)

    @property
    def causes(self) -> list[str]:
        return [f["cause"] for f in self.findings]

    @property
    def bottleneck(self) -> str | None:
        return self.findings[0]["cause"] if self.findings else None

    def reading(self) -> str:
        """The plain-language reading: one line per finding, then what stayed undecided."""
        lines = [f"- {f['sentence']}" for f in self.findings]
        lines += [f"- could not decide: {u}" for u in self.undecided]
        return "\n".join(lines)


def _split(log: StepLog) -> pd.DataFrame:
    steps = log.steps.copy()
    for part in (*PARTS, "other_s"):
        steps[part.replace("_s", "_share")] = steps[part] / steps["step_s"]
    if steps["response_max"].notna().any():
        steps["max_over_mean"] = steps["response_max"] / steps["response_mean"]
    return steps


def diagnose(log: StepLog, sd_curve=None, workers: int | None = None,
             baseline: StepLog | None = None, drafter_step_s: float | None = None,
             results: str = RESULTS) -> Diagnosis:
    """Diagnose one run's logs (module docstring). ``sd_curve``: SD's speedup per batch
    size (``read_sd_curve``'s inputs; a workbench run's measured costs give one where none is
    passed). ``workers``: the rollout's workers (default: what the logs tell). ``baseline``:
    the same run without SD, whose lengths the SD run's are compared with. ``drafter_step_s``:
    one drafter training step's seconds (the drafter steps the idle windows hold)."""
    workers = check_int("workers", workers, 1, optional="from the logs")
    drafter_step_s = check_positive("drafter_step_s", drafter_step_s, optional="not counted")
    curve = read_sd_curve(sd_curve) if sd_curve is not None else None
    workers = workers or log.workers
    drafter_step_s = drafter_step_s or log.extra.get("drafter_step_s")
    lays, measured, cost = layouts(log, workers)
    if curve is None and cost is not None:
        curve = measured_curve(cost)
    threshold = crossover(curve) if curve is not None else 0
    split = _split(log)
    tail = batch = live = replayed = seer = None
    if lays:
        if cost is None:
            cost = synthetic_cost(curve, max(int((lay.response > 0).sum(1).max())
                                             for lay in lays.values()))
        tail, batch, live = simulate(log, lays, measured, cost, curve, threshold, drafter_step_s)
        replayed = remedy_ratios(log, lays, measured, cost)
        seer = seer_ratios(log, lays, measured, cost, replayed.attrs["max_batch"])
        tail = capped_bandit(tail, replayed)
        workers = workers or int(tail["workers"].max())
    error = headline_error(results)
    remedies = predict_remedies(split, tail, threshold, error, replayed, results)
    remedies = pd.concat([remedies, pd.DataFrame(variant_rows(
        split, tail, replayed, seer, log.format == "workbench", results))], ignore_index=True)
    findings = findings_of(log, split, tail, batch, curve, threshold, remedies, baseline)
    undecided = undecided_of(log, curve, tail, workers)
    means = log.means()
    summary = {"format": log.format, "source": log.source, "steps": int(len(split)),
               "workers": workers, "bottleneck": findings[0]["cause"] if findings else None,
               "causes": [f["cause"] for f in findings], "sd_threshold": threshold,
               **{f"mean_{k}": v for k, v in means.items()},
               **{f"{k}_share": float(split[f"{k}_share"].mean()) for k in
                  ("rollout", "reward", "logprob", "update", "other")},
               "missing": dict(log.missing), "undecided": undecided, "notes": list(log.notes),
               "simulator_error": error}
    if tail is not None:
        summary.update({k: float(tail[k].mean()) for k in ("idle_fraction", "tail_share",
                                                            "p99_over_p50")})
        if "drafter_steps" in tail:
            summary["drafter_steps_per_step"] = float(tail["drafter_steps"].mean())
    for _, r in remedies.iterrows():
        summary[f"predicted_{r['remedy']}"] = (None if pd.isna(r["predicted_e2e_speedup"])
                                              else float(r["predicted_e2e_speedup"]))
    measured_table = _measured(log, summary)
    return Diagnosis(split, tail, batch, remedies, findings, undecided, summary, curve, live,
                     measured_table, list(log.notes))


def _measured(log: StepLog, summary: dict) -> pd.DataFrame | None:
    """A workbench run's measured speedups (``measured_speedups``), each variant beside its
    predicted row (``MEASURED_AS``; any other: TLT's bandit) with the error; their figures
    are added to ``summary``. None for other logs."""
    table = measured_speedups(log)
    if table is None:
        return None
    other = table["variant"] != log.extra["variant"]
    row = table["variant"].map(MEASURED_AS).fillna("tlt_bandit")
    predicted = row.map(lambda r: summary.get(f"predicted_{r}"))
    table["predicted_e2e_speedup"] = np.where(other, predicted.astype(float), np.nan)
    for col, of in (("error", "measured_e2e_speedup"), ("error_seed", "measured_e2e_speedup_seed")):
        table[col] = (table["predicted_e2e_speedup"] / table[of] - 1)
    for _, r in table.iterrows():
        summary[f"measured_e2e_speedup_{r['variant']}"] = r["measured_e2e_speedup"]
        summary[f"measured_e2e_speedup_{r['variant']}_seed"] = r["measured_e2e_speedup_seed"]
    return table
