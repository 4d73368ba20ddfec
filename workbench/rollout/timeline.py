"""Rollout timelines as data: a *steps* table and a *requests* table, and measures on them.

Schema (docs/design.md, "Timelines are data"):

steps     one row per engine call on a worker
          worker, step, kind (prefill | decode | draft | verify | compile | drafter_train |
          train | failed),
          start_s, end_s, batch_size, tokens (tokens emitted), forward_s (time inside the
          model's forward), clock; the plan of each decode step (schedule.py), NA on rows that
          no decode step wrote and in tables saved before them: decision (Int64, the decode
          step's index on its worker), plan_k (Int64, 0 for a plain step), plan_branch
          (Int64), plan_budget (Int64, NA for a chain), plan_drafter (string: the name of
          the drafter that drafted the step, ``plan.serving_drafter``; NA when none did);
          preempted (boolean: a drafter training step cut at the end of its idle window,
          its work discarded; NA elsewhere); rerun (boolean: a rollout step re-running
          requests of a worker that failed; NA elsewhere); moved_from (Int64: on a prefill
          that re-prefilled requests moved mid-generation from another worker, that worker,
          ``rollout.dispatch``; NA elsewhere); cpu_share (Float64: the CPU
          seconds the step's work got over its wall seconds, ``workbench.clock.cpu_share``;
          under ``DISTURBED_BELOW`` the step was disturbed by other work; NA on rows
          recorded before it and on rows no work wrote); and the *decision columns*:
          whatever scalars the schedule gave as its reasons (``Schedule.decision``), one
          column per key, typed by their values (boolean, string, Int64 or Float64), which
          this layer keeps but never interprets (the bandit's ``bucket``, ``arm``,
          ``explored`` are read by speculative/decisions.py)
requests  one row per request
          worker, uid, prompt_id, sample_idx, start_s, end_s, prompt_tokens, response_tokens,
          finish (eos | length), verify_steps, drafted, accepted, emitted, reward (NaN until
          scored); text (string: the decoded response, written by the engine; NA in tables
          saved before it, so old run folders still load); and failed_worker (Int64: the
          worker that failed holding the request, which ``worker`` then re-ran; NA for a
          request run once)
request_steps  optional, recorded when asked: a row per request per step (request_steps.py)

A ``compile`` row is the compiled decode step's graph compiled before the step that needs
it (``rollout.compiled``, ``RolloutConfig.compile``): ``batch_size`` the rows it is for,
``tokens`` 0, no plan. On the wall clock it lasts what the compile took, and counts as the
worker's rollout work (a rollout kind); on the sim clock it is empty (its seconds are taken off
the worker's clock: wall time, partly in inductor's worker processes), so sim-clock figures
never include compiles (``CompiledDecode.compiles`` keeps their wall seconds).

A lost worker (``rollout.recovery``, ``Backend.map_tail``) leaves one ``failed`` row: from
where its lost work began (0 in a rollout, its window's start in an idle job) for its time
until the failure (0 long when unknown), ``batch_size`` the requests it held, ``tokens`` 0.
Its seconds are no work (idle, wasted), and a worker with a ``failed`` row has no idle window.

Times are seconds on the clock named in ``clock``: ``wall`` (one process, measured) or ``sim``
(each worker's measured time laid side by side, as if the workers ran in parallel). A worker's
consecutive steps are contiguous, so idle time is exactly what the steps leave uncovered:
the bubble after a worker's last step, while the long tail finishes elsewhere.
Every figure and number is computed from these tables, never by hand.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..atomic import atomic_dir
from ..checks import check_choice, check_int
from ..clock import DISTURBED_BELOW
from .request_steps import check_request_steps, request_steps_table
from .timeline_stats import length_percentiles, usage_of, usage_shares

__all__ = ["Timeline", "IdleWindow", "PLAN_COLUMNS", "rollout_end_s"]

STEP_KINDS = ("prefill", "decode", "draft", "verify", "compile", "drafter_train", "train",
              "failed")
ROLLOUT_KINDS = ("prefill", "decode", "draft", "verify", "compile")


def rollout_end_s(steps, default: float = 0.0) -> float:
    """Where a rollout ends in ``steps`` (a steps table, or its rows as dicts): the end of
    its latest step of a rollout kind (:data:`ROLLOUT_KINDS`); ``default`` with none.

    The one definition every site uses: a worker's idle window starts at its own rollout's
    end, an RL step's rollout seconds end at the latest worker's, and what drafter training
    runs past that is overrun. Idle work (``drafter_train``, ``train``) and ``failed`` rows
    never end a rollout."""
    if isinstance(steps, pd.DataFrame):
        ends = steps.loc[steps["kind"].isin(ROLLOUT_KINDS), "end_s"]
        return float(ends.max()) if len(ends) else default
    return max((float(row["end_s"]) for row in steps if row["kind"] in ROLLOUT_KINDS),
               default=default)
STEP_COLUMNS = ["worker", "step", "kind", "start_s", "end_s", "batch_size", "tokens",
                "forward_s", "clock"]
# the steps table's plan columns and their dtypes (nullable: NA where nothing was decided)
PLAN_COLUMNS = {"decision": "Int64", "plan_k": "Int64", "plan_branch": "Int64",
                "plan_budget": "Int64", "plan_drafter": "string"}
"""The steps table's plan columns and their dtypes (nullable: NA where nothing was decided)."""
# every optional steps column of this layer: the plans, the flag of a preempted drafter step,
# and that of a step re-running a failed worker's requests
OPTIONAL_STEP_COLUMNS = {**PLAN_COLUMNS, "preempted": "boolean", "rerun": "boolean",
                         "moved_from": "Int64", "cpu_share": "Float64"}
# the names a schedule's decision keys may not take (every other steps column is one of them)
RESERVED_STEP_COLUMNS = frozenset(STEP_COLUMNS) | frozenset(OPTIONAL_STEP_COLUMNS)
REQUEST_COLUMNS = ["worker", "uid", "prompt_id", "sample_idx", "start_s", "end_s",
                   "prompt_tokens", "response_tokens", "finish", "verify_steps", "drafted",
                   "accepted", "emitted", "reward"]
# the requests table's optional columns and their dtypes (NA where a saved table lacks one)
OPTIONAL_REQUEST_COLUMNS = {"text": "string", "failed_worker": "Int64"}
CLOCKS = ("wall", "sim")


def _with_columns(table: pd.DataFrame, dtypes: dict[str, str]) -> pd.DataFrame:
    """``table`` with every column of ``dtypes``, typed (NA-filled where the table lacks one):
    tables saved before a column existed still load, with the column's usual dtype."""
    missing = {c: pd.NA for c in dtypes if c not in table.columns}
    return table.assign(**missing).astype(dtypes)


def _dtype_of(values) -> str:
    """The dtype of a decision column holding ``values`` (NA left out): the nullable dtype
    they share (boolean, string, Int64, or Float64 for numbers), so that a table keeps one
    dtype however many rows lack the key; ``object`` for mixed values or none at all."""
    kinds = {bool if isinstance(v, (bool, np.bool_)) else str if isinstance(v, str)
             else int if isinstance(v, (int, np.integer)) else
             float if isinstance(v, (float, np.floating)) else object
             for v in values if not (v is None or v is pd.NA or v != v)}  # NaN != NaN
    return {frozenset({bool}): "boolean", frozenset({str}): "string",
            frozenset({int}): "Int64", frozenset({float}): "Float64",
            frozenset({int, float}): "Float64"}.get(frozenset(kinds), "object")


def _typed(table: pd.DataFrame, values: dict[str, list]) -> pd.DataFrame:
    """``table`` with each decision column of ``values`` (its raw values) typed by
    :func:`_dtype_of` (an object column holds None for NA, which parquet keeps)."""
    dtypes = {name: _dtype_of(vals) for name, vals in values.items()}
    typed = {name: table[name].astype(d) if d != "object"
             else table[name].astype(object).where(table[name].notna(), None)
             for name, d in dtypes.items()}
    return table.assign(**typed)


@dataclass(frozen=True)
class IdleWindow:
    """A worker's idle window in one rollout step: from the end of its last rollout step
    (``start_s``) to the end of the step's last one on any worker (``end_s``), on the
    timeline's clock. Work run there (``Backend.map_tail``) never stretches the step."""

    worker: int
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass
class Timeline:
    """The two tables of one rollout step, the number of workers, and the clock they use;
    optionally the third table (``request_steps``) and ``origin_s``, the wall time that is 0
    on a clock common to all workers (Ray: ``chrome_trace`` aligns Ray's timeline there)."""

    steps: pd.DataFrame
    requests: pd.DataFrame
    num_workers: int
    clock: str = "sim"
    request_steps: pd.DataFrame | None = None
    origin_s: float | None = None

    def __post_init__(self):
        check_choice("Timeline.clock", self.clock, CLOCKS)
        self.num_workers = check_int("Timeline.num_workers", self.num_workers, 1)
        for name, cols in (("steps", STEP_COLUMNS), ("requests", REQUEST_COLUMNS)):
            missing = [c for c in cols if c not in getattr(self, name).columns]
            if missing:
                raise ValueError(f"{name} table lacks columns {missing}")
        bad = set(self.steps["kind"]) - set(STEP_KINDS)
        if bad:
            raise ValueError(f"unknown step kind(s) {sorted(bad)}; accepted: {STEP_KINDS}")
        self.steps = _with_columns(self.steps, OPTIONAL_STEP_COLUMNS)
        untyped = [c for c in self.decision_columns
                   if str(self.steps[c].dtype) in ("object", "str")]
        self.steps = _typed(self.steps, {c: self.steps[c].tolist() for c in untyped})
        self.requests = _with_columns(self.requests, OPTIONAL_REQUEST_COLUMNS)
        if self.request_steps is not None:
            self.request_steps = check_request_steps(self.request_steps, self.steps,
                                                     self.requests, self.decision_columns)

    @classmethod
    def from_records(cls, steps: list[dict], requests: list[dict], num_workers: int,
                     clock: str = "sim", request_steps: list | None = None,
                     origin_s: float | None = None) -> "Timeline":
        known = STEP_COLUMNS + list(OPTIONAL_STEP_COLUMNS)
        decided = _new_keys(steps, known)
        s = pd.DataFrame(steps, columns=known + decided)
        s = _typed(s, {k: [row.get(k) for row in steps] for k in decided})
        s["clock"] = clock
        r = pd.DataFrame(requests, columns=REQUEST_COLUMNS + list(OPTIONAL_REQUEST_COLUMNS))
        detail = None if request_steps is None else request_steps_table(request_steps)
        return cls(s.astype({"worker": int, "step": int, "batch_size": int, "tokens": int}),
                   r.astype({"worker": int, "uid": "int64"}), num_workers, clock, detail, origin_s)

    @property
    def decision_columns(self) -> list[str]:
        """The steps columns a schedule's ``decision`` wrote (every column this layer does
        not define), in table order."""
        return [c for c in self.steps.columns if c not in RESERVED_STEP_COLUMNS]

    def with_steps(self, rows: list[dict]) -> "Timeline":
        """This timeline with more steps-table rows (e.g. drafter training that a worker ran
        in its idle window: what ``Backend.map_tail`` recorded on the same clock)."""
        if not rows:
            return replace(self)
        columns = list(self.steps.columns)
        extra = pd.DataFrame(rows, columns=columns + _new_keys(rows, columns))
        extra = extra.assign(clock=self.clock)
        known = set(zip(self.steps["worker"], self.steps["step"]))
        if any(key in known for key in zip(extra["worker"], extra["step"])):
            raise ValueError("these step rows are already in the timeline (same worker and step)")
        steps = pd.concat([self.steps, extra.astype(self.steps.dtypes)], ignore_index=True)
        return replace(self, steps=steps)

    def idle_windows(self) -> list[IdleWindow]:
        """Each worker's idle window after its last rollout step (``IdleWindow``), the first
        to finish first (ties by worker): a worker with no rollout step idles from 0, a
        worker that failed in the step (a ``failed`` row) has none."""
        last = self.rollout_ends()
        end = self.rollout_end_s
        lost = set(self.steps.loc[self.steps["kind"] == "failed", "worker"])
        return sorted((IdleWindow(int(w), float(t), end) for w, t in last.items()
                       if w not in lost), key=lambda window: (window.start_s, window.worker))

    # ---- measures -----------------------------------------------------------------------
    def rollout_ends(self) -> pd.Series:
        """Each worker's rollout end (:func:`rollout_end_s` of its steps; 0 for a worker
        with no rollout step), indexed by worker 0..N-1."""
        ends = {w: rollout_end_s(s) for w, s in self.steps.groupby("worker")}
        return pd.Series(ends, dtype=float).reindex(range(self.num_workers), fill_value=0.0)

    @property
    def rollout_end_s(self) -> float:
        """The rollout's end: its latest worker's (:func:`rollout_end_s`)."""
        return rollout_end_s(self.steps)

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
        decision, plan_k, plan_branch, plan_budget, plan_drafter, every decision column (its
        value on the step), rows (the live batch), tokens (emitted) and seconds (draft and
        verify together: what the schedule observed)."""
        s = self.steps[self.steps["decision"].notna()]
        s = s.assign(seconds=s["end_s"] - s["start_s"])
        firsts = {c: (c, "first") for c in ["plan_k", "plan_branch", "plan_budget",
                                             "plan_drafter", *self.decision_columns]}
        return s.groupby(["worker", "decision"], sort=False).agg(
            **firsts, rows=("batch_size", "max"), tokens=("tokens", "sum"),
            seconds=("seconds", "sum")).reset_index()

    def usage_s(self, below: float = DISTURBED_BELOW) -> dict[str, float]:
        """Seconds of the steps that recorded their CPU share (``measured_s``), of those
        whose share fell under ``below`` (``disturbed_s``: other work took their core;
        ``workbench.clock``), and the CPU seconds they got (``cpu_s``): sums that pool
        over the timelines of a run (:func:`usage_shares`)."""
        s = self.steps[self.steps["cpu_share"].notna()]
        return usage_of(s["end_s"] - s["start_s"], s["cpu_share"], below)

    def summary(self) -> dict[str, float]:
        """The scalars every notebook reports, under the names of docs/design.md's measures."""
        return {"num_requests": int(len(self.requests)), "workers": self.num_workers,
                "clock": self.clock, "makespan_s": self.makespan_s,
                "idle_fraction": self.idle_fraction(), "tail_share": self.tail_share(),
                **self.length_percentiles(), "tokens_per_s": self.tokens_per_s(),
                **usage_shares([self.usage_s()])}

    # ---- files --------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``steps.parquet``, ``requests.parquet`` (``request_steps.parquet`` when
        recorded) and ``timeline.json`` into ``folder``, all replaced at once (an interrupted
        save leaves the previous timeline)."""
        with atomic_dir(folder) as tmp:
            self.steps.to_parquet(tmp / "steps.parquet", index=False)
            self.requests.to_parquet(tmp / "requests.parquet", index=False)
            if self.request_steps is not None:
                self.request_steps.to_parquet(tmp / "request_steps.parquet", index=False)
            (tmp / "timeline.json").write_text(json.dumps({"num_workers": self.num_workers,
                                                           "clock": self.clock,
                                                           "origin_s": self.origin_s}))
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
        detail = folder / "request_steps.parquet"
        return cls(pd.read_parquet(folder / "steps.parquet"),
                   pd.read_parquet(folder / "requests.parquet"), meta["num_workers"],
                   meta["clock"], pd.read_parquet(detail) if detail.is_file() else None,
                   meta.get("origin_s"))


def _new_keys(rows: list[dict], columns: list[str]) -> list[str]:
    """The keys of ``rows`` that are not in ``columns``, in order of first appearance."""
    seen = dict.fromkeys(columns)
    return list(dict.fromkeys(k for row in rows for k in row if k not in seen))
