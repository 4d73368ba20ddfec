"""A run's RL steps as one table, whatever framework logged them: the ``StepLog``.

Why one shape: each framework names the parts of a step its own way; the readers
(:mod:`workbench.diagnose.frameworks`, :mod:`workbench.diagnose.workbench_runs`) map each to
these columns and name every field they could not find, so the diagnosis can say what it
could not decide without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

__all__ = ["StepLog", "PARTS", "LENGTHS", "finish_steps"]

PARTS = ("rollout_s", "reward_s", "logprob_s", "update_s")  # a step's parts, in order
LENGTHS = ("response_mean", "response_max", "response_min")


@dataclass
class StepLog:
    """A run's steps as one table, whatever wrote them.

    ``steps``: one row per RL step: ``step``, the parts ``rollout_s``, ``reward_s``,
    ``logprob_s``, ``update_s`` (NaN where the logs hold none), ``step_s`` and
    ``other_s`` (the step less its known parts), the lengths ``response_mean``,
    ``response_max``, ``response_min`` (and ``clip_ratio``, ``requests`` where known).
    ``requests``: per-request lengths where the logs hold them (``step``,
    ``response_tokens``, optional ``prompt_tokens``, ``group``, ``worker``), else None.
    ``missing``: each field not found -> the key(s) it is read from, so a report names them.
    ``workers``: the rollout's workers where the logs tell it. ``timelines``: for a
    workbench run, each step's saved rollout timeline folder. ``notes``: what was assumed."""

    steps: pd.DataFrame
    format: str
    source: str
    requests: pd.DataFrame | None = None
    missing: dict[str, str] = field(default_factory=dict)
    workers: int | None = None
    timelines: list[Path] | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def has(self, column: str) -> bool:
        return column in self.steps and self.steps[column].notna().any()

    def describe(self) -> str:
        """What was read, in lines: the source, its format, steps and workers (where the logs
        tell them), each note on what was assumed, and each field not found with the key(s) it
        is read from."""
        lines = [f"{self.source}: {self.format}, {len(self.steps)} steps"
                 + (f", {self.workers} workers" if self.workers else "")]
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"missing {name}: {where}" for name, where in self.missing.items()]
        return "\n".join(lines)

    def means(self) -> dict[str, float]:
        """Each part's mean seconds over the steps, and the step's (NaN where unknown)."""
        return {c: float(self.steps[c].mean()) if self.has(c) else float("nan")
                for c in (*PARTS, "other_s", "step_s")}


def finish_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Add ``other_s`` (the step less its known parts, never below 0) and fill ``step_s``
    from the parts where the logs give no step time."""
    parts = steps[list(PARTS)]
    known = parts.sum(axis=1, min_count=1)
    if "step_s" not in steps or steps["step_s"].isna().all():
        steps["step_s"] = known
    steps["other_s"] = (steps["step_s"] - known.fillna(0)).clip(lower=0)
    steps["step"] = steps["step"].astype(int)
    return steps.sort_values("step").reset_index(drop=True)
