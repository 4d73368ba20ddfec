"""The bandit's decisions read back from a rollout's steps table, and the measures on them.

The adaptive schedule (``speculative.bandit.AdaptiveSchedule``) explains every decode step it
plans with scalars that the rollout layer stores as decision columns of the steps table
without reading them (``rollout/timeline.py``): the three this module reads,
:data:`DECISION_KEYS`, and an exploring run's bookkeeping (``settling``, ``charged_to``), which
only the schedule's own replay reads (``AdaptiveSchedule.absorb``). This module is
their reader: one row per decided step with the bandit's columns typed (NA where a schedule
gave none: plain decoding, a fixed threshold, a table saved before them), the pulls per
(bucket, arm), and docs/design.md's *explore cost* and *plain share*.

Glossary (``speculative/bandit.py`` has the bandit's own):

bucket    the batch-size bucket whose bandit chose (NA: no bandit chose, e.g. plain above a
          fixed threshold).
arm       the strategy the step ran (``"plain"``, ``"chain:k=4"``, ...).
explored  whether the pull explored (an arm other than the bucket's best).
settling  whether the pull was among the first of an exploring run, which teach nothing
          (``speculative/bandit.py``, "settling").
charged_to the worker whose exploring budget paid for the pull (a run's first puller).
"""
from __future__ import annotations

import pandas as pd

__all__ = ["bandit_decisions", "bandit_choices", "explore_cost", "plain_share"]

DECISION_DTYPES = {"bucket": "string", "arm": "string", "explored": "boolean"}
DECISION_KEYS = tuple(DECISION_DTYPES)
# bandit_decisions: one row per decided decode step
DECIDED_COLUMNS = ["worker", "decision", "plan_k", "plan_branch", "plan_budget", *DECISION_KEYS,
                   "rows", "tokens", "seconds"]
# bandit_choices: one row per (bucket, arm)
BANDIT_CHOICE_COLUMNS = {"bucket": str, "arm": str, "pulls": int, "explored": int,
                         "tokens_per_s": float}


def bandit_decisions(timeline) -> pd.DataFrame:
    """``timeline.decisions()`` (one row per decided decode step) in :data:`DECIDED_COLUMNS`,
    the bandit's columns typed and NA where the schedule gave none."""
    d = timeline.decisions()
    missing = {key: pd.NA for key in DECISION_KEYS if key not in d.columns}
    return d.assign(**missing).astype(DECISION_DTYPES)[DECIDED_COLUMNS]


def bandit_choices(timeline) -> pd.DataFrame:
    """The schedule's choices per batch-size bucket: one row per (bucket, arm) with
    ``pulls`` (decode steps that ran it), ``explored`` (how many of them were exploring
    pulls) and ``tokens_per_s`` (mean over those steps of tokens over the step's seconds:
    the bandit's reward). Buckets in batch-size order; steps without a bucket (plain above
    a fixed threshold, or a schedule that does not explain itself) are left out."""
    per_step = bandit_decisions(timeline)
    per_step = per_step[per_step["bucket"].notna()]
    per_step = per_step.assign(reward=per_step["tokens"] / per_step["seconds"])
    out = per_step.groupby(["bucket", "arm"]).agg(
        pulls=("reward", "size"), explored=("explored", "sum"),
        tokens_per_s=("reward", "mean"), smallest=("rows", "min")).reset_index()
    order = out.groupby("bucket")["smallest"].transform("min")
    out = out.assign(order=order).sort_values(["order", "bucket", "arm"])
    return out.drop(columns=["order", "smallest"]).reset_index(drop=True).astype(
        BANDIT_CHOICE_COLUMNS)


def explore_cost(decisions: pd.DataFrame, min_pulls: int = 3) -> float:
    """The share of decode time that exploring lost against the best arm in hindsight.

    ``decisions``: :func:`bandit_decisions` of one or more timelines (concatenated). Per
    bucket, the best arm in hindsight is the one of highest tokens over seconds, among arms
    pulled at least ``min_pulls`` times (all arms when none was). An exploring step would have
    emitted its tokens in ``tokens / best rate`` seconds; the cost is what it took beyond that,
    summed over exploring steps, over every decided step's seconds (NaN when nothing was
    decided in a bucket). Negative when exploring happened to beat the best on average.
    """
    d = decisions[decisions["bucket"].notna()]
    if d.empty or d["seconds"].sum() <= 0:
        return float("nan")
    per_arm = d.groupby(["bucket", "arm"]).agg(tokens=("tokens", "sum"),
                                              seconds=("seconds", "sum"),
                                              pulls=("tokens", "size")).reset_index()
    per_arm["rate"] = per_arm["tokens"] / per_arm["seconds"]
    enough = per_arm[per_arm["pulls"] >= min_pulls]
    best = per_arm.groupby("bucket")["rate"].max()
    best.update(enough.groupby("bucket")["rate"].max())
    explored = d[d["explored"].fillna(False).astype(bool)]
    lost = explored["seconds"] - explored["tokens"] / explored["bucket"].map(best)
    return float(lost.sum() / d["seconds"].sum())


def plain_share(decisions: pd.DataFrame) -> float:
    """The share of decided decode steps that ran plain (NaN when none was decided)."""
    return float((decisions["plan_k"] == 0).mean()) if len(decisions) else float("nan")
