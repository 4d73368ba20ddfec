"""Error bars on a token-budget study (:func:`~.budget.budget_study`) and the budget at which
a method comes back to its teacher.

Per (method, budget): accuracy as the mean over seeds, the sd over seeds of the per-seed
accuracies, and a two-level bootstrap 95% interval (seeds and held-out problems resampled,
:func:`~.stats.summarize`; from the per-seed accuracies alone when a table has no per-problem
``rewards``), and the kept weights' held-out LM loss as mean ± sd. A budget *reaches the
teacher* when the upper end of its accuracy interval is within ``tolerance`` (3 points) of the
teacher's accuracy on the same problems: the data cannot tell the student from a model that
close to its teacher. The issue's target is that KD's smallest such budget is at most 10% of
the teacher's pretraining tokens. A stricter reading is reported beside it: the budget is
*surely within* the tolerance when the paired interval of the student's accuracy minus the
teacher's (same problems, the teacher's greedy rewards against every seed's,
:func:`~.stats.paired_difference`) lies above ``-tolerance``: the data rule out a larger gap.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..checks import check_fraction
from ..results import read_table
from .stats import paired_difference, summarize

__all__ = ["budget_summary", "reward_matrix"]


def reward_matrix(part: pd.DataFrame) -> np.ndarray:
    """``[seeds, problems]`` 0/1 rewards of one (method, budget)'s rows (from their
    ``rewards`` strings), or ``[seeds]`` accuracies when the rows carry no rewards."""
    if "rewards" not in part or part["rewards"].isna().any():
        return part["accuracy"].to_numpy(dtype=float)
    strings = part["rewards"].astype(str).tolist()
    if len({len(s) for s in strings}) != 1:
        raise ValueError(f"rewards of {part['method'].iloc[0]} at budget "
                         f"{part['budget_fraction'].iloc[0]} cover different numbers of "
                         f"problems ({sorted({len(s) for s in strings})}); accepted: every seed "
                         "scored on the same problems")
    return np.array([[c == "1" for c in s] for s in strings], dtype=float)


def _teacher(table: pd.DataFrame) -> pd.Series:
    rows = table[table["method"] == "teacher"]
    if rows.empty:
        raise ValueError("the budget table has no 'teacher' row; accepted: a table written by "
                         "budget_study, which scores the teacher on the same problems")
    return rows.iloc[0]


def _summary_row(part: pd.DataFrame, teacher: pd.Series, tolerance: float) -> dict:
    """One (method, budget)'s row of :func:`budget_summary` from its per-seed rows."""
    rewards, mine = reward_matrix(part), reward_matrix(teacher.to_frame().T)
    acc = summarize(rewards)
    paired = rewards.ndim == mine.ndim == 2 and rewards.shape[1] == mine.shape[1]
    diff = (paired_difference(rewards, np.repeat(mine, len(rewards), axis=0)) if paired
            else {"lo": np.nan, "hi": np.nan})
    losses = part["lm_loss"].astype(float)
    return {"method": part["method"].iloc[0], "budget_fraction": part["budget_fraction"].iloc[0],
            "tokens": float(part["tokens"].mean()), "steps": float(part["steps"].mean()),
            "accuracy": acc["mean"], "accuracy_sd": acc["sd"],
            "accuracy_lo": acc["lo"], "accuracy_hi": acc["hi"],
            "lm_loss": float(losses.mean()),
            "lm_loss_sd": float(losses.std(ddof=1)) if len(part) > 1 else 0.0,
            "seeds": acc["seeds"], "gap": acc["mean"] - float(teacher["accuracy"]),
            "gap_lo": diff["lo"], "gap_hi": diff["hi"],
            "reached": acc["hi"] >= float(teacher["accuracy"]) - tolerance,
            "surely_within": diff["lo"] >= -tolerance}


def budget_summary(table, tolerance: float = 0.03,
                   within: float = 0.10) -> tuple[pd.DataFrame, dict]:
    """``(summary, headline)`` of a :func:`~.budget.budget_study` table (or its CSV path).

    ``summary``: one row per (method, budget_fraction), budgets ascending: ``tokens`` and
    ``steps`` (means over seeds), ``accuracy`` with ``accuracy_sd``, ``accuracy_lo``,
    ``accuracy_hi``, ``lm_loss`` with ``lm_loss_sd``, ``seeds``, ``gap`` (accuracy minus the
    teacher's) with ``gap_lo``/``gap_hi`` (its paired interval; NaN without per-problem
    rewards), ``reached`` (``accuracy_hi >= teacher - tolerance``) and ``surely_within``
    (``gap_lo >= -tolerance``). ``headline``: the teacher's tokens and accuracy, and per method
    ``<method>_budget_reached`` and ``<method>_budget_surely_within`` (the smallest budget
    that passed each test, None if none did) and ``<method>_target_met`` (the reached budget
    is at most ``within``)."""
    check_fraction("tolerance", tolerance)
    check_fraction("within", within, low_open=True)
    table = read_table(table, ["method", "budget_fraction", "tokens", "steps", "seed",
                               "accuracy", "lm_loss"], "a budget table")
    teacher = _teacher(table)
    runs = table[table["method"] != "teacher"].sort_values(["budget_fraction", "seed"])
    summary = pd.DataFrame([_summary_row(part, teacher, tolerance) for _, part in
                            runs.groupby(["method", "budget_fraction"], sort=False)])
    headline = {"teacher_tokens": int(teacher["tokens"]),
                "teacher_accuracy": float(teacher["accuracy"]),
                "teacher_lm_loss": float(teacher["lm_loss"]), "tolerance": tolerance}
    for method in dict.fromkeys(summary["method"]) if len(summary) else ():
        for test, key in (("reached", "budget_reached"),
                          ("surely_within", "budget_surely_within")):
            hits = summary[(summary["method"] == method) & summary[test]]["budget_fraction"]
            headline[f"{method}_{key}"] = float(hits.min()) if len(hits) else None
        first = headline[f"{method}_budget_reached"]
        headline[f"{method}_target_met"] = first is not None and first <= within
    return summary, headline
