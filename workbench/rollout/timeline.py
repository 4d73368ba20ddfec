"""Rollout timelines as data: a *steps* table and a *requests* table, and measures on them.

Schema (docs/design.md, "Timelines are data"):

steps     one row per engine call on a worker
          worker, step, kind (prefill | decode | draft | verify | drafter_train | train),
          start_s, end_s, batch_size, tokens (tokens emitted), forward_s (time inside the
          model's forward), clock; and the schedule's decisions (schedule.py, "Every
          decision"), NA on rows that no decode step wrote and in tables saved before them:
          decision (Int64, the decode step's index on its worker), plan_k (Int64, 0 for a
          plain step), plan_branch (Int64), plan_budget (Int64, NA for a chain), bucket
          (string), arm (string), explored (boolean); and preempted (boolean: a drafter
          training step cut at the end of its idle window, its work discarded; NA elsewhere)
requests  one row per request
          worker, uid, prompt_id, sample_idx, start_s, end_s, prompt_tokens, response_tokens,
          finish (eos | length), verify_steps, drafted, accepted, emitted, reward (NaN until
          scored); and text (string: the decoded response, written by the engine; NA in tables
          saved before it, so old run folders still load)

Times are seconds on the clock named in ``clock``: ``wall`` (one process, measured) or ``sim``
(each worker's measured time laid side by side, as if the workers ran in parallel). A worker's
consecutive steps are contiguous, so idle time is exactly what the steps leave uncovered:
the bubble after a worker's last step, while the long tail finishes elsewhere.
Every figure and number is computed from these tables, never by hand.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..atomic import atomic_dir

__all__ = ["Timeline", "STEP_COLUMNS", "DECISION_COLUMNS", "REQUEST_COLUMNS",
           "OPTIONAL_REQUEST_COLUMNS", "BANDIT_CHOICE_COLUMNS", "ROLLOUT_KINDS", "STEP_KINDS",
           "length_percentiles", "explore_cost", "plain_share", "OPTIONAL_STEP_COLUMNS"]

STEP_KINDS = ("prefill", "decode", "draft", "verify", "drafter_train", "train")
ROLLOUT_KINDS = ("prefill", "decode", "draft", "verify")
STEP_COLUMNS = ["worker", "step", "kind", "start_s", "end_s", "batch_size", "tokens",
                "forward_s", "clock"]
# the steps table's decision columns and their dtypes (nullable: NA where nothing was decided)
DECISION_COLUMNS = {"decision": "Int64", "plan_k": "Int64", "plan_branch": "Int64",
                    "plan_budget": "Int64", "bucket": "string", "arm": "string",
                    "explored": "boolean"}
# every optional steps column: the decisions, and the flag of a preempted drafter step
OPTIONAL_STEP_COLUMNS = {**DECISION_COLUMNS, "preempted": "boolean"}
REQUEST_COLUMNS = ["worker", "uid", "prompt_id", "sample_idx", "start_s", "end_s",
                   "prompt_tokens", "response_tokens", "finish", "verify_steps", "drafted",
                   "accepted", "emitted", "reward"]
# the requests table's optional columns and their dtypes (NA where a saved table lacks one)
OPTIONAL_REQUEST_COLUMNS = {"text": "string"}
# Timeline.bandit_choices: one row per (bucket, arm)
BANDIT_CHOICE_COLUMNS = {"bucket": str, "arm": str, "pulls": int, "explored": int,
                         "tokens_per_s": float}
CLOCKS = ("wall", "sim")


def _with_columns(table: pd.DataFrame, dtypes: dict[str, str]) -> pd.DataFrame:
    """``table`` with every column of ``dtypes``, typed (NA-filled where the table lacks one):
    tables saved before a column existed still load, with the column's usual dtype."""
    missing = {c: pd.NA for c in dtypes if c not in table.columns}
    return table.assign(**missing).astype(dtypes)


def length_percentiles(lengths, qs=(50, 90, 99)) -> dict[str, float]:
    """``{"length_p50": ..., ...}`` of a sequence of token counts (NaN when empty)."""
    arr = np.asarray(list(lengths), dtype=float)
    if arr.size == 0:
        return {f"length_p{q}": float("nan") for q in qs}
    return {f"length_p{q}": float(np.percentile(arr, q)) for q in qs}


@dataclass
class Timeline:
    """The two tables of one rollout step, the number of workers, and the clock they use."""

    steps: pd.DataFrame
    requests: pd.DataFrame
    num_workers: int
    clock: str = "sim"

    def __post_init__(self):
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {self.clock!r}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        for name, cols in (("steps", STEP_COLUMNS), ("requests", REQUEST_COLUMNS)):
            missing = [c for c in cols if c not in getattr(self, name).columns]
            if missing:
                raise ValueError(f"{name} table lacks columns {missing}")
        bad = set(self.steps["kind"]) - set(STEP_KINDS)
        if bad:
            raise ValueError(f"unknown step kind(s) {sorted(bad)}; accepted: {STEP_KINDS}")
        self.steps = _with_columns(self.steps, OPTIONAL_STEP_COLUMNS)
        self.requests = _with_columns(self.requests, OPTIONAL_REQUEST_COLUMNS)

    @classmethod
    def from_records(cls, steps: list[dict], requests: list[dict], num_workers: int,
                     clock: str = "sim") -> "Timeline":
        s = pd.DataFrame(steps, columns=STEP_COLUMNS + list(OPTIONAL_STEP_COLUMNS))
        s["clock"] = clock
        r = pd.DataFrame(requests, columns=REQUEST_COLUMNS + list(OPTIONAL_REQUEST_COLUMNS))
        return cls(s.astype({"worker": int, "step": int, "batch_size": int, "tokens": int}),
                   r.astype({"worker": int, "uid": "int64"}), num_workers, clock)

    def with_steps(self, rows: list[dict]) -> "Timeline":
        """This timeline with more steps-table rows (e.g. drafter training that a worker ran
        in its idle window, recorded by ``Worker.timed`` on the same clock)."""
        extra = pd.DataFrame(rows, columns=list(self.steps.columns)).assign(clock=self.clock)
        known = set(zip(self.steps["worker"], self.steps["step"]))
        if any(key in known for key in zip(extra["worker"], extra["step"])):
            raise ValueError("these step rows are already in the timeline (same worker and step)")
        steps = pd.concat([self.steps, extra], ignore_index=True).astype(self.steps.dtypes)
        return Timeline(steps, self.requests, self.num_workers, self.clock)

    # ---- measures -----------------------------------------------------------------------
    @property
    def makespan_s(self) -> float:
        """Time from the step's start (0) to the end of the latest step on any worker."""
        return float(self.steps["end_s"].max()) if len(self.steps) else 0.0

    def busy_s(self, kinds=ROLLOUT_KINDS, preempted: bool = True) -> pd.Series:
        """Seconds each worker spent in steps of ``kinds``, indexed by worker 0..N-1
        (``preempted=False``: without the preempted drafter steps, whose work was lost)."""
        s = self.steps[self.steps["kind"].isin(kinds)]
        if not preempted:
            s = s[~s["preempted"].fillna(False).astype(bool)]
        busy = (s["end_s"] - s["start_s"]).groupby(s["worker"]).sum()
        return busy.reindex(range(self.num_workers), fill_value=0.0).rename("busy_s")

    def idle_s(self, kinds=ROLLOUT_KINDS, preempted: bool = True) -> pd.Series:
        """Seconds each worker had no work of ``kinds`` within the makespan."""
        return (self.makespan_s - self.busy_s(kinds, preempted)).rename("idle_s")

    def idle_fraction(self) -> float:
        """Sum over workers of time with no rollout work, over N x makespan."""
        m = self.makespan_s
        return float(self.idle_s().sum() / (self.num_workers * m)) if m > 0 else 0.0

    def wasted_fraction(self) -> float:
        """Idle fraction with drafter training counted as work (a preempted drafter step's
        time stays wasted: its update was discarded)."""
        m = self.makespan_s
        kinds = ROLLOUT_KINDS + ("drafter_train",)
        idle = self.idle_s(kinds, preempted=False).sum()
        return float(idle / (self.num_workers * m)) if m > 0 else 0.0

    def tail_share(self, q: float = 0.9) -> float:
        """Fraction of the makespan after ``q`` of the requests have finished."""
        m = self.makespan_s
        if m <= 0 or not len(self.requests):
            return 0.0
        ends = np.sort(self.requests["end_s"].to_numpy())
        t_q = ends[int(np.ceil(q * len(ends))) - 1]
        return float((m - t_q) / m)

    def length_percentiles(self, qs=(50, 90, 99)) -> dict[str, float]:
        return length_percentiles(self.requests["response_tokens"], qs)

    def tokens_per_s(self) -> float:
        """Response tokens over the makespan, on this timeline's clock."""
        m = self.makespan_s
        return float(self.requests["response_tokens"].sum() / m) if m > 0 else 0.0

    def worker_summary(self) -> pd.DataFrame:
        """Per worker: requests, tokens, busy and idle seconds, and its last step's end."""
        r = self.requests.groupby("worker")
        return pd.DataFrame({
            "requests": r.size(), "response_tokens": r["response_tokens"].sum(),
            "busy_s": self.busy_s(), "idle_s": self.idle_s(),
            "last_end_s": self.steps.groupby("worker")["end_s"].max(),
        }).reindex(range(self.num_workers)).fillna(0).rename_axis("worker")

    def active_batch(self) -> pd.DataFrame:
        """Rows ``worker, start_s, end_s, batch_size`` of rollout steps: the active batch over
        time. A prefill step runs only the requests joining the batch (continuous batching),
        so its active batch counts every request of the worker live at its start: the running
        rows waiting for it and the joining ones."""
        s = self.steps[self.steps["kind"].isin(ROLLOUT_KINDS)]
        s = s[["worker", "start_s", "end_s", "batch_size", "kind"]].reset_index(drop=True)
        req = self.requests
        for i in s.index[s["kind"] == "prefill"]:
            w, t = s.at[i, "worker"], s.at[i, "start_s"]
            mine = req[req["worker"] == w]
            live = int(((mine["start_s"] <= t) & (mine["end_s"] > t)).sum())
            s.at[i, "batch_size"] = max(live, int(s.at[i, "batch_size"]))
        return s.drop(columns="kind")

    def decisions(self) -> pd.DataFrame:
        """One row per decode step a schedule decided, from the steps table alone: worker,
        decision, bucket (NA without one), arm, explored, plan_k, rows (the live batch),
        tokens (emitted) and seconds (draft and verify together: what the bandit was fed)."""
        s = self.steps[self.steps["decision"].notna()]
        s = s.assign(seconds=s["end_s"] - s["start_s"])
        return s.groupby(["worker", "decision"], sort=False).agg(
            bucket=("bucket", "first"), arm=("arm", "first"), explored=("explored", "first"),
            plan_k=("plan_k", "first"), rows=("batch_size", "max"), tokens=("tokens", "sum"),
            seconds=("seconds", "sum")).reset_index()

    def bandit_choices(self) -> pd.DataFrame:
        """The schedule's choices per batch-size bucket: one row per (bucket, arm) with
        ``pulls`` (decode steps that ran it), ``explored`` (how many of them were exploring
        pulls) and ``tokens_per_s`` (mean over those steps of tokens over the step's seconds:
        the bandit's reward). Buckets in batch-size order; steps without a bucket (plain above
        a fixed threshold, or a schedule that does not explain itself) are left out."""
        per_step = self.decisions()
        per_step = per_step[per_step["bucket"].notna()]
        per_step = per_step.assign(reward=per_step["tokens"] / per_step["seconds"])
        out = per_step.groupby(["bucket", "arm"]).agg(
            pulls=("reward", "size"), explored=("explored", "sum"),
            tokens_per_s=("reward", "mean"), smallest=("rows", "min")).reset_index()
        order = out.groupby("bucket")["smallest"].transform("min")
        out = out.assign(order=order).sort_values(["order", "bucket", "arm"])
        return out.drop(columns=["order", "smallest"]).reset_index(drop=True).astype(
            BANDIT_CHOICE_COLUMNS)

    def summary(self) -> dict[str, float]:
        """The scalars every notebook reports, under the names of docs/design.md's measures."""
        return {"num_requests": int(len(self.requests)), "workers": self.num_workers,
                "clock": self.clock, "makespan_s": self.makespan_s,
                "idle_fraction": self.idle_fraction(), "tail_share": self.tail_share(),
                **self.length_percentiles(), "tokens_per_s": self.tokens_per_s()}

    # ---- files --------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``steps.parquet``, ``requests.parquet`` and ``timeline.json`` into ``folder``,
        all three replaced at once (an interrupted save leaves the previous timeline)."""
        with atomic_dir(folder) as tmp:
            self.steps.to_parquet(tmp / "steps.parquet", index=False)
            self.requests.to_parquet(tmp / "requests.parquet", index=False)
            (tmp / "timeline.json").write_text(json.dumps({"num_workers": self.num_workers,
                                                           "clock": self.clock}))
        return Path(folder)

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "Timeline":
        """The timeline saved in ``folder`` (a run folder or the folder ``save`` wrote)."""
        folder = Path(folder)
        if not (folder / "timeline.json").is_file() and (folder / "timeline").is_dir():
            folder = folder / "timeline"
        meta_path = folder / "timeline.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"no timeline in {str(folder)!r}: expected timeline.json, "
                                    "steps.parquet and requests.parquet (Timeline.save writes them)")
        meta = json.loads(meta_path.read_text())
        return cls(pd.read_parquet(folder / "steps.parquet"),
                   pd.read_parquet(folder / "requests.parquet"), meta["num_workers"],
                   meta["clock"])


def explore_cost(decisions: pd.DataFrame, min_pulls: int = 3) -> float:
    """The share of decode time that exploring lost against the best arm in hindsight.

    ``decisions``: :meth:`Timeline.decisions` of one or more timelines (concatenated). Per
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
