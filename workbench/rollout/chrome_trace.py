"""Rollout timelines as Chrome trace-event JSON, for Perfetto UI and chrome://tracing, and back.

Why: a rollout step is thousands of engine calls on N workers. The Gantt chart (``viz.timeline``)
shows the shape; a trace viewer lets one zoom from the whole step to one verify call and click it
for its numbers. This is a *Chrome trace* (the trace-event format), not the cluster simulator's
trace of lengths and costs (docs/trace_format.md, ``cluster.trace_from_timeline``).

Layout (docs/chrome_trace.md): one process per worker (``pid`` = worker + 1); in it a thread
for the rollout's engine steps, one for its idle bubble, one for drafter training, one for
failed steps, then one thread per request (admission to finish), named by its uid, holding
the request's steps when the timeline recorded them (``Timeline.request_steps``). Counter
tracks per worker: the live batch (``Timeline.active_batch``) and tokens per row of each verify
step. A Ray rollout's trace may add Ray's own task timeline, aligned at the rollout's start
(``rollout.chrome_trace_ray``). Several timelines (the RL steps of a run) go one after another
on one time axis, each offset by the makespans before it; a process "timelines" holds one
slice per timeline.

Why the tables round-trip: ``ts`` and ``dur`` are whole microseconds, so every step and request
slice carries its table row in ``args`` (every column, ``start_s`` and ``end_s`` exact), and the
trace's ``metadata`` keeps each table's columns and dtypes. :func:`read_chrome_trace` rebuilds
the steps and requests tables equal to the ones written, through ``Timeline``'s constructor.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..atomic import atomic_file
from .chrome_trace_ray import ray_trace_events
from .timeline import ROLLOUT_KINDS, Timeline

__all__ = ["chrome_trace", "write_chrome_trace", "read_chrome_trace", "timeline_folders",
           "DERIVED_ARGS"]

FORMAT = "workbench.rollout.chrome_trace/1"
US = 1e6  # trace-event times are microseconds
# the fixed threads of a worker's process; request threads follow from REQUEST_TID_BASE
THREADS = {"steps": 1, "idle": 2, "drafter training": 3, "failed": 4}
REQUEST_TID_BASE = 10
TIMELINES_PID = 0  # the process holding one slice per timeline
# the thread of each step kind (``train``: a policy update run in a window, beside drafters)
KIND_THREAD = {**{k: "steps" for k in ROLLOUT_KINDS}, "drafter_train": "drafter training",
               "train": "drafter training", "failed": "failed"}
# args a slice carries beside its table row: which timeline it is of, a preempted drafter
# step's wasted seconds, a request's accepted length, an idle slice's seconds
DERIVED_ARGS = ("timeline", "wasted_s", "accepted_length", "seconds")
"""The args a slice carries beside its table row: which timeline it is of, a preempted drafter
step's wasted seconds, a request's accepted length, an idle slice's seconds."""


def _json_value(v):
    """A table cell as a JSON value: NA, None and NaN become null, numpy scalars Python ones
    (``allow_nan=False`` below keeps the file valid JSON)."""
    if v is None or v is pd.NA or (isinstance(v, (float, np.floating)) and math.isnan(v)):
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    return str(v)


def _us(seconds: float) -> int:
    return max(0, int(round(seconds * US)))


def _slice(name, cat, pid, tid, start_s, end_s, args) -> dict:
    """A complete event (``ph: X``) from ``start_s`` to ``end_s`` (offset already applied)."""
    ts = _us(start_s)
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts,
            "dur": max(0, _us(end_s) - ts), "args": args}


def _meta(kind: str, pid: int, tid: int, **args) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "ts": 0, "args": args}


def _counter(name: str, pid: int, t_s: float, **values) -> dict:
    return {"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": _us(t_s), "args": values}


def _rows(table: pd.DataFrame) -> list[dict]:
    return [{c: _json_value(v) for c, v in zip(table.columns, row)}
            for row in table.itertuples(index=False, name=None)]


def _check_names(name: str, tl: Timeline) -> None:
    clash = [c for c in tl.decision_columns if c in DERIVED_ARGS]
    if clash:
        raise ValueError(f"timeline {name!r} has decision column(s) {clash}, which the Chrome "
                         f"trace's slice args use for themselves: {list(DERIVED_ARGS)}")


def _step_name(row: dict) -> str:
    kind = row["kind"]
    if row.get("preempted"):
        return f"{kind} (preempted)"
    if row.get("rerun"):
        return f"{kind} (rerun)"
    return kind


def _step_events(name: str, tl: Timeline, offset: float) -> list[dict]:
    out = []
    for row in _rows(tl.steps):
        row = {**row, "timeline": name}
        cat = ",".join(["step", row["kind"]] + ["preempted"] * bool(row.get("preempted"))
                       + ["rerun"] * bool(row.get("rerun")))
        if row.get("preempted"):
            row["wasted_s"] = row["end_s"] - row["start_s"]
        out.append(_slice(_step_name(row), cat, row["worker"] + 1,
                          THREADS[KIND_THREAD[row["kind"]]], offset + row["start_s"],
                          offset + row["end_s"], row))
    for w in tl.idle_windows():
        if w.seconds > 0:
            out.append(_slice("idle", "idle", w.worker + 1, THREADS["idle"],
                              offset + w.start_s, offset + w.end_s,
                              {"timeline": name, "worker": w.worker, "start_s": w.start_s,
                               "end_s": w.end_s, "seconds": w.seconds}))
    return out


def _request_events(name: str, tl: Timeline, offset: float, tids: dict) -> list[dict]:
    out = []
    for row in _rows(tl.requests):
        steps = row["verify_steps"]
        row = {**row, "timeline": name,
               "accepted_length": row["accepted"] / steps if steps else None}
        tid = tids.setdefault((row["worker"], row["uid"]), REQUEST_TID_BASE + len(tids))
        out.append(_slice(f"uid {row['uid']}", "request", row["worker"] + 1, tid,
                          offset + row["start_s"], offset + row["end_s"], row))
    return out


def _request_step_events(name: str, tl: Timeline, offset: float, tids: dict) -> list[dict]:
    """One slice per request-steps row, on its request's track (inside its request's slice),
    over its step's span; args: the row, the step's exact ``start_s`` and ``end_s``."""
    if tl.request_steps is None:
        return []
    spans = tl.steps.set_index(["worker", "step"])[["start_s", "end_s"]]
    rs = tl.request_steps
    at = spans.loc[list(zip(rs["worker"], rs["step"]))].to_numpy()
    out = []
    for row, (start, end) in zip(_rows(rs), at):
        tid = tids.setdefault((row["worker"], row["uid"]), REQUEST_TID_BASE + len(tids))
        args = {**row, "timeline": name, "start_s": float(start), "end_s": float(end)}
        out.append(_slice(row["kind"], f"request_step,{row['kind']}", row["worker"] + 1, tid,
                          offset + start, offset + end, args))
    return out


def _counter_events(tl: Timeline, offset: float) -> list[dict]:
    """Per worker: the live batch at each rollout step (0 after its rollout's end), and tokens
    per row of each verify step (accepted drafts plus the one the policy adds)."""
    out = []
    ends = tl.rollout_ends()
    for w, rows in tl.active_batch().sort_values(["worker", "start_s"]).groupby("worker"):
        out += [_counter("active batch", int(w) + 1, offset + s, batch_size=int(b))
                for s, b in zip(rows["start_s"], rows["batch_size"])]
        out.append(_counter("active batch", int(w) + 1, offset + float(ends[w]), batch_size=0))
    verify = tl.steps[(tl.steps["kind"] == "verify") & (tl.steps["batch_size"] > 0)]
    for w, s, tokens, rows in zip(verify["worker"], verify["start_s"], verify["tokens"],
                                  verify["batch_size"]):
        out.append(_counter("accepted length", int(w) + 1, offset + float(s),
                            tokens_per_row=float(tokens) / float(rows)))
    return out


def _parts(timelines) -> dict[str, Timeline]:
    if isinstance(timelines, Timeline):
        return {"timeline": timelines}
    parts = dict(timelines)
    if not parts:
        raise ValueError("no timeline to trace: pass a Timeline or a {name: Timeline} dict")
    bad = {k: type(v).__name__ for k, v in parts.items() if not isinstance(v, Timeline)}
    if bad:
        raise TypeError(f"not Timelines: {bad}; pass a Timeline or a {{name: Timeline}} dict")
    return {str(k): v for k, v in parts.items()}


def chrome_trace(timelines, ray_events=None) -> dict:
    """The trace-event JSON object of ``timelines``: a ``Timeline``, or ``{name: Timeline}``
    laid one after another on one time axis (each offset by the makespans before it).
    ``ray_events``: Ray's own task timeline (``ray.timeline()``) of Ray rollouts, on processes
    of its own, aligned at each timeline's ``origin_s`` (``rollout.chrome_trace_ray``)."""
    parts = _parts(timelines)
    events, tids, described, offset = [], {}, [], 0.0
    workers = max(tl.num_workers for tl in parts.values())
    events.append(_meta("process_name", TIMELINES_PID, 0, name="timelines"))
    events.append(_meta("process_sort_index", TIMELINES_PID, 0, sort_index=-1))
    for w in range(workers):
        events.append(_meta("process_name", w + 1, 0, name=f"worker {w}"))
        events.append(_meta("process_sort_index", w + 1, 0, sort_index=w))
        for thread, tid in THREADS.items():
            events.append(_meta("thread_name", w + 1, tid, name=thread))
            events.append(_meta("thread_sort_index", w + 1, tid, sort_index=tid))
    for name, tl in parts.items():
        _check_names(name, tl)
        makespan = tl.makespan_s
        events.append(_slice(name, "timeline", TIMELINES_PID, 0, offset, offset + makespan,
                             {"timeline": name, "offset_s": offset, "makespan_s": makespan,
                              "clock": tl.clock, "num_workers": tl.num_workers}))
        events += _step_events(name, tl, offset)
        events += _request_events(name, tl, offset, tids)
        events += _request_step_events(name, tl, offset, tids)
        events += _counter_events(tl, offset)
        described.append({
            "name": name, "offset_s": offset, "num_workers": tl.num_workers, "clock": tl.clock,
            "origin_s": tl.origin_s,
            "steps_dtypes": {c: str(d) for c, d in tl.steps.dtypes.items()},
            "requests_dtypes": {c: str(d) for c, d in tl.requests.dtypes.items()},
            "request_steps_dtypes": None if tl.request_steps is None else
            {c: str(d) for c, d in tl.request_steps.dtypes.items()}})
        offset += makespan
    for (worker, uid), tid in tids.items():
        events.append(_meta("thread_name", worker + 1, tid, name=f"uid {uid}"))
        events.append(_meta("thread_sort_index", worker + 1, tid, sort_index=tid))
    ray = {}
    if ray_events is not None:
        extra, ray = ray_trace_events(ray_events, [(d["name"], parts[d["name"]], d["offset_s"])
                                                   for d in described], workers + 1)
        events += extra
    clocks = sorted({tl.clock for tl in parts.values()})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"format": FORMAT, "clock": clocks[0] if len(clocks) == 1 else clocks,
                         "clock_note": "ts and dur are microseconds on the timelines' clock "
                         "(sim: each worker's measured time laid side by side; wall: one "
                         "process, measured); args start_s and end_s are the exact seconds",
                         "timelines": described, **({"ray": ray} if ray else {})}}


def write_chrome_trace(timelines, path: str | os.PathLike, ray_events=None) -> Path:
    """Write :func:`chrome_trace` of ``timelines`` (and ``ray_events``) to ``path``
    atomically; return the path."""
    trace = chrome_trace(timelines, ray_events)
    text = json.dumps(trace, allow_nan=False, separators=(",", ":"))
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def _natural(name: str) -> list:
    """Sort key that puts ``step9`` before ``step10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _saved(root: Path) -> list[Path]:
    """Folders at or under ``root`` holding ``timeline.json`` (``Timeline.save``); hidden
    folders (an atomic write in progress) and a timeline's own subfolders are not walked."""
    found = []
    for folder, subfolders, files in os.walk(root):
        if "timeline.json" in files:
            subfolders.clear()
            found.append(Path(folder))
        subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
    return sorted(found, key=lambda f: _natural(f.as_posix()))


def _step_number(folder: Path) -> int | None:
    match = re.fullmatch(r"step(\d+)", folder.name)
    return int(match.group(1)) if match else None


def timeline_folders(run_dir: str | os.PathLike, steps=None) -> dict[str, Path]:
    """``{name: folder}`` of the saved timelines a trace of ``run_dir`` holds, in step order.

    ``run_dir`` is a saved timeline folder, a run folder with ``timeline/``, or a folder whose
    timelines lie in one folder of ``step<N>`` folders (an ablation's
    ``<checkpoint>/<variant>-seed<k>/timelines``, or the run folder above it); ``steps``
    (RL step numbers) picks some of them, all when None. Refused before anything is read:
    no timeline there, timelines in several folders (the message lists them: pass one), a
    step not saved (the message lists the steps saved)."""
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{str(root)!r} is not a folder: pass a saved timeline's "
                                "folder or a run folder holding timelines")
    found = _saved(root)
    if not found:
        raise FileNotFoundError(f"no saved timeline under {str(root)!r}: looked for folders "
                                "holding timeline.json (Timeline.save writes it)")
    parents = list(dict.fromkeys(f.parent for f in found))
    if len(found) > 1 and len(parents) > 1:
        shown = [p.relative_to(root).as_posix() or "." for p in parents]
        raise ValueError(f"{str(root)!r} holds timelines in {len(parents)} folders: {shown}; "
                         "pass one of them (e.g. a variant's and seed's timelines folder)")
    numbered = {_step_number(f): f for f in found}
    if steps is not None:
        steps = [int(s) for s in steps]
        saved = sorted(n for n in numbered if n is not None)
        missing = [s for s in steps if s not in numbered]
        if missing:
            raise ValueError(f"step(s) {missing} not saved under {str(root)!r}; saved steps: "
                             f"{saved if saved else 'none (its timeline is not a step<N> folder)'}")
        found = [numbered[s] for s in dict.fromkeys(steps)]
    return {f.name if f != root else root.name: f for f in found}


def _table(rows: list[dict], dtypes: dict[str, str]) -> pd.DataFrame:
    table = pd.DataFrame(rows, columns=list(dtypes))
    return table.astype({c: (object if d == "object" else d) for c, d in dtypes.items()})


def read_chrome_trace(path: str | os.PathLike, name: str | None = None) -> Timeline:
    """The timeline ``name`` (the only one when None) of a trace :func:`write_chrome_trace`
    wrote, its steps and requests tables rebuilt from the slices' args: equal to the tables
    written, every column and dtype (derived slices, idle and counters, are not read)."""
    path = Path(path)
    trace = json.loads(path.read_text(encoding="utf-8"))
    meta = trace.get("metadata", {}) if isinstance(trace, dict) else {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a rollout Chrome trace written by "
                         f"write_chrome_trace (metadata.format {meta.get('format')!r}; "
                         f"expected {FORMAT!r})")
    parts = {p["name"]: p for p in meta["timelines"]}
    if name is None and len(parts) == 1:
        name = next(iter(parts))
    if name is None:
        raise ValueError(f"{str(path)!r} holds {len(parts)} timelines; pass name= one of "
                         f"{list(parts)}")
    if name not in parts:
        raise ValueError(f"timeline {name!r} is not in {str(path)!r}; it holds: {list(parts)}")
    part = parts[name]
    tables = {"step": [], "request": [], "request_step": []}
    for event in trace["traceEvents"]:
        if event.get("ph") != "X" or event.get("args", {}).get("timeline") != name:
            continue
        kind = event.get("cat", "").split(",")[0]
        if kind in tables:
            tables[kind].append(event["args"])
    detail = part.get("request_steps_dtypes")
    return Timeline(_table(tables["step"], part["steps_dtypes"]),
                    _table(tables["request"], part["requests_dtypes"]), part["num_workers"],
                    part["clock"], None if detail is None else _table(tables["request_step"],
                                                                     detail),
                    part.get("origin_s"))
