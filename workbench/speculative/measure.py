"""SD measures, one definition each (docs/design.md): acceptance length, step times, speedup bound.

All are computed from a rollout's tables, so a run's files are enough to recompute them.
"""
from __future__ import annotations

import numpy as np

__all__ = ["acceptance_length", "step_times", "sd_bound"]


def acceptance_length(result) -> float:
    """tau: tokens emitted per verify step (accepted drafts + 1), averaged over every verify
    step of every row, steps cut short by EOS or length included. Takes a RolloutResult or a
    requests table with ``emitted`` and ``verify_steps`` columns."""
    table = result.timeline.requests if hasattr(result, "timeline") else result
    steps = table["verify_steps"].sum()
    return float(table["emitted"].sum() / steps) if steps else float("nan")


def step_times(steps, k: int | None = None) -> dict[str, float]:
    """Median seconds of one plain decode step (T1), one draft token (Td = draft step / k) and
    one verify pass (Tv), from a steps table (plain and SD steps may come from two runs
    concatenated). Missing kinds give NaN."""
    def med(kind):
        s = steps[steps["kind"] == kind]
        return float(np.median(s["end_s"] - s["start_s"])) if len(s) else float("nan")

    draft = med("draft")
    return {"T1": med("decode"), "Td": draft / k if k else draft, "Tv": med("verify")}


def sd_bound(tau: float, t1: float, td: float, tv: float, k: int) -> float:
    """The SD speedup bound tau * T1 / (k * Td + Tv)."""
    return tau * t1 / (k * td + tv)
