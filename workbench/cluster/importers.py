"""Traces from elsewhere: the workbench's own run folders (a saved ``Timeline``) and any CSV
of per-request lengths (a veRL or OpenRLHF export) through a column mapping."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from ..rollout.timeline import Timeline
from .trace import Trace
from .validate import raise_problems, trace_problems

__all__ = ["trace_from_run", "trace_from_timeline", "trace_from_csv"]

TRACE_COLUMNS = ("prompt_tokens", "response_tokens", "group", "worker")


def step_strategy(k, branch, budget, drafter) -> str:
    """A decided step's strategy string from its plan columns (``plan_k``, ``plan_branch``,
    ``plan_budget``, ``plan_drafter``), as ``speculative.strategies.strategy_name`` writes
    it: this layer sits below that one, so it matches the forms by itself, and a test keeps
    the two in step."""
    if k == 0:
        return "plain"
    if branch == 1 and pd.isna(budget):
        sibling = not pd.isna(drafter) and drafter == "sibling"  # NA: a run saved before
        return f"{'sibling' if sibling else 'chain'}:k={k}"       # the column was filled
    return f"tree:k={k},b={branch}" + ("" if pd.isna(budget) else f",n={budget}")


def _step_rows(timeline: Timeline) -> pd.DataFrame:
    """The timeline's measured costs: one ``prefill`` row per worker (all its prefill steps
    before its first decode step together: what the simulator charges once), and one row
    per decided decode step (draft and verify together) with its strategy and tau."""
    s = timeline.steps
    first = s[s["kind"] != "prefill"].groupby("worker")["start_s"].min()
    pre = s[s["kind"] == "prefill"]
    pre = pre[pre["start_s"] < pre["worker"].map(first).fillna(np.inf)]
    prefill = pre.groupby("worker").agg(batch_size=("batch_size", "sum"),
                                        start=("start_s", "min"), stop=("end_s", "max"))
    rows = [pd.DataFrame({"batch_size": prefill["batch_size"], "kind": "prefill",
                          "seconds": prefill["stop"] - prefill["start"], "tau": 1.0})]
    d = timeline.decisions()
    if len(d):
        kinds = [step_strategy(k, b, n, dr) for k, b, n, dr in
                 zip(d["plan_k"], d["plan_branch"], d["plan_budget"], d["plan_drafter"])]
        rows.append(pd.DataFrame({"batch_size": d["rows"].astype(int), "kind": kinds,
                                  "seconds": d["seconds"].astype(float),
                                  "tau": (d["tokens"] / d["rows"]).astype(float)}))
    steps = pd.concat(rows, ignore_index=True)
    return steps[steps["seconds"] > 0].reset_index(drop=True)


def trace_from_run(folder: str | os.PathLike) -> Trace:
    """The trace of a run folder's saved Timeline (``out_dir/timeline/`` as notebook 01
    writes it, or the folder ``Timeline.save`` wrote): ``trace_from_timeline`` of it."""
    return trace_from_timeline(Timeline.load(folder), f"run folder {str(Path(folder))!r}")


def trace_from_timeline(timeline: Timeline, source: str = "a timeline") -> Trace:
    """The trace of a rollout's Timeline: its requests with their worker (the group is the
    prompt id), and its measured step costs (``_step_rows``). Decode steps that no schedule
    decided (tables saved before the plan columns) give no cost rows."""
    r = timeline.requests
    requests = pd.DataFrame({"prompt_tokens": r["prompt_tokens"].astype(int),
                             "response_tokens": r["response_tokens"].astype(int),
                             "group": r["prompt_id"].astype(str),
                             "worker": r["worker"].astype(int)})
    return Trace(requests, _step_rows(timeline), source=source)


def trace_from_csv(path: str | os.PathLike, columns: dict[str, str] | None = None) -> Trace:
    """The trace of a CSV of per-request lengths; ``columns`` maps trace fields
    (prompt_tokens, response_tokens, group, worker) to the CSV's column names, e.g.
    ``{"response_tokens": "response_length", "group": "uid"}``; unmapped fields keep their
    own name. Rows are checked by their line in the CSV."""
    columns = dict(columns or {})
    bad = sorted(set(columns) - set(TRACE_COLUMNS))
    if bad:
        raise ValueError(f"columns maps unknown trace fields {bad}; accepted: {TRACE_COLUMNS}")
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = {f: c for f, c in columns.items() if c not in raw.columns}
    if missing:
        raise ValueError(f"{str(path)!r} lacks the columns {missing} maps to; its columns: "
                         f"{list(raw.columns)}")
    renamed = raw.rename(columns={c: f for f, c in columns.items()})
    kept = renamed[[f for f in TRACE_COLUMNS if f in renamed.columns]]
    where = [f"line {i + 2}" for i in range(len(kept))]
    raise_problems(trace_problems(kept, None, where, []), f"file {str(path)!r}")
    return Trace(kept, None, source=f"file {str(path)!r}")
