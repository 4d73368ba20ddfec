"""Each remedy's predicted end-to-end speedup on the logged steps, how it was got and its error;
and, for a workbench run, each variant's measured speedup to set beside the prediction.

Why end to end: a remedy speeds up the rollout alone, so the step's rollout time scales by the
simulated ratio and the rest of the step stays as logged; two bounds need no simulation at
all (the Amdahl bound of any rollout remedy, and one-step async), and the remedies the
simulator does not model are listed by name with no number rather than left out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .steplog import StepLog

__all__ = ["predict_remedies", "measured_speedups", "NOT_SIMULATED"]

NOT_SIMULATED = {
    "over_provisioning": "over-provisioning (end the rollout when the target groups finish)",
    "april": "APRIL (active partial rollouts: over-provision, carry unfinished responses over)",
    "partial_rollouts": "partial rollouts (cap each step's tokens, resume next step)",
    "tail_batching": "tail batching (gather the long requests into a later round)"}


def _e2e(steps: pd.DataFrame, tail: pd.DataFrame, ratio: str) -> float:
    """Summed logged steps over summed predicted ones (the rollout scaled by the simulated
    ratio, the rest as logged), over the simulated steps."""
    s = steps.set_index("step").loc[tail["step"]]
    rest = s["step_s"] - s["rollout_s"]
    return float(s["step_s"].sum() / (s["rollout_s"] * tail[ratio].to_numpy() + rest).sum())


def predict_remedies(split: pd.DataFrame, tail: pd.DataFrame | None, threshold: int,
                     error: dict | None) -> pd.DataFrame:
    """One row per remedy: ``remedy``, ``predicted_e2e_speedup`` (NaN where not predicted),
    ``method`` (how it was got, or why not), ``error`` and ``error_source`` (the simulator's
    validated error and the result that holds it)."""
    err = error["error"] if error else np.nan
    where = f"{error['figure']} of {error['result']}" if error else "no validation recorded"
    rows = []
    if tail is not None and "tlt_ratio" in tail:
        rows.append({"remedy": "tlt_threshold", "predicted_e2e_speedup": _e2e(split, tail, "tlt_ratio"),
                     "method": f"simulated: SD below live batch {threshold}, drafter in idle windows",
                     "error": err, "error_source": where})
        rows.append({"remedy": "tlt_bandit", "predicted_e2e_speedup": _e2e(split, tail, "bandit_ratio"),
                     "method": "simulated: the bandit's limit (cheapest arm per token at each batch)",
                     "error": err, "error_source": where})
    else:
        why = ("needs per-request lengths" if tail is None else "needs SD's speedup per batch")
        for name in ("tlt_threshold", "tlt_bandit"):
            rows.append({"remedy": name, "predicted_e2e_speedup": np.nan,
                         "method": f"not predicted: {why}", "error": np.nan, "error_source": ""})
    total, rollout = split["step_s"].sum(), split["rollout_s"].sum()
    if np.isfinite(rollout) and 0 < rollout < total:  # the rest of the step known
        rows.append({"remedy": "any_rollout_remedy_bound", "predicted_e2e_speedup": total / (total - rollout),
                     "method": "Amdahl bound from the logged times: a rollout of zero seconds",
                     "error": 0.0, "error_source": "arithmetic on the logs"})
        rows.append({"remedy": "async_one_step", "predicted_e2e_speedup":
                     total / np.maximum(split["rollout_s"], split["step_s"] - split["rollout_s"]).sum(),
                     "method": "bound from the logged times (not simulated): the rollout of step "
                               "t+1 beside the rest of step t, each step the longer of the two",
                     "error": 0.0, "error_source": "arithmetic on the logs"})
    for name, what in NOT_SIMULATED.items():
        rows.append({"remedy": name, "predicted_e2e_speedup": np.nan,
                     "method": f"not modelled by the cluster simulator: {what}; notebook 11 "
                               "measures it on the small model", "error": np.nan, "error_source": ""})
    return pd.DataFrame(rows)


def measured_speedups(log: StepLog) -> pd.DataFrame | None:
    """A workbench run's measured end-to-end speedup of every variant over the diagnosed one:
    summed steps over summed steps (``Ablation``'s ``e2e_speedup``), of the diagnosed seed and
    over every seed."""
    h = log.extra.get("history")
    if h is None:
        return None
    base = h[h["variant"] == log.extra["variant"]]
    rows = []
    for variant, mine in h.groupby("variant", sort=False):
        seed = log.extra["seed"]
        rows.append({"variant": variant,
                     "measured_e2e_speedup_seed": float(
                         base.loc[base["seed"] == seed, "step_s"].sum()
                         / mine.loc[mine["seed"] == seed, "step_s"].sum()),
                     "measured_e2e_speedup": float(base["step_s"].sum() / mine["step_s"].sum()),
                     "seeds": int(mine["seed"].nunique())})
    return pd.DataFrame(rows)
