"""Ray's own task timeline (``ray.timeline()``) in a rollout's Chrome trace, aligned at the
rollout's start: ``write_chrome_trace(result.timeline, path, ray_events=ray.timeline())``.

Why: the rollout's tracks say what each worker's engine did; Ray's say what Ray did around it
(the driver's submits, each actor's task: deserialising its arguments, running, storing its
result). Side by side they show where a Ray step's seconds went outside the engine.

**Alignment.** Ray stamps each event with its node's wall clock (``time.time()``, microseconds
since the epoch). A Ray rollout's timeline counts from one origin, the driver's ``time.time()``
when it submitted the call (``Timeline.origin_s``; ``RayBackend``), so an event at Ray time
``t`` lies at ``t - origin_s`` on the timeline's clock (plus the timeline's offset in a trace of
several). Uncertainty: on one machine the driver and the actors read one clock, so the two
agree to the clock's resolution (microseconds); the timeline's own times are each actor's
``perf_counter`` since its start plus ``time.time() - origin_s`` at its start, which drifts
from the wall clock by the counters' drift over a rollout (parts per million). On a cluster
each node stamps its events by its own clock: they are off by that node's offset from the
driver's (NTP keeps it to milliseconds), not measured here. Only timelines with an
``origin_s`` can be aligned: the sim clock's times are no wall times at all.

**Which events.** Ray keeps every task of its session; an event goes in with the first
timeline whose span ``[origin_s, origin_s + makespan]`` it overlaps, the others are left out
(counted in the trace's ``metadata.ray``).

**Tracks.** One process per Ray component (a worker process, the driver) after the rollout's
workers, named ``ray <component> @ <node>``, one thread; slices keep Ray's name, cat
``ray,<Ray's cat>``, Ray's args and ``ray_ts_us`` (Ray's own start), ``start_s`` and
``end_s`` on the timeline's clock, and the timeline's name. ``read_chrome_trace`` skips them.
"""
from __future__ import annotations

__all__ = ["ray_trace_events", "ALIGNMENT_NOTE"]

ALIGNMENT_NOTE = ("Ray's events (each node's time.time(), microseconds) minus the timeline's "
                  "origin_s (the driver's time.time() when the Ray rollout was submitted), "
                  "plus its offset: exact to the clock's resolution on one machine (the "
                  "timeline's times drift from it by the perf counters' drift, ppm); on a "
                  "cluster off by each node's clock offset from the driver's (NTP: ms), "
                  "not measured")
"""How Ray's events are aligned with the rollout's times, and how well (the trace's metadata)."""


def ray_trace_events(events, parts: list[tuple], first_pid: int) -> tuple[list[dict], dict]:
    """Trace events of Ray's ``events`` (``ray.timeline()``) aligned with ``parts``: ``[(name,
    timeline, offset_s)]`` in the trace's order, and their processes from ``first_pid`` on;
    with the metadata that says how (module docstring). Raises ValueError when no timeline
    has an ``origin_s``, or ``events`` are not Ray's trace events."""
    spans = [(name, tl.origin_s, tl.origin_s + tl.makespan_s, offset)
             for name, tl, offset in parts if tl.origin_s is not None]
    if not spans:
        raise ValueError(f"Ray's events are aligned at a timeline's origin_s (a Ray rollout's "
                         f"wall-clock 0), and none of {[name for name, _, _ in parts]} has one "
                         "(a sim-clock or local timeline has no wall-time origin)")
    out, pids, left_out = [], {}, 0
    for event in events:
        if not isinstance(event, dict) or not {"ts", "pid", "tid"} <= set(event):
            raise ValueError(f"not a trace event of ray.timeline(): {event!r:.200}")
        if event.get("ph", "X") != "X":
            left_out += 1
            continue
        start = float(event["ts"]) / 1e6
        end = start + float(event.get("dur", 0)) / 1e6
        where = next(((name, origin, offset) for name, origin, hi, offset in spans
                      if end >= origin and start <= hi), None)
        if where is None:
            left_out += 1
            continue
        name, origin, offset = where
        pid = pids.setdefault((str(event["pid"]), str(event["tid"])), first_pid + len(pids))
        args = {**(event.get("args") or {}), "timeline": name, "ray_ts_us": event["ts"],
                "start_s": start - origin, "end_s": end - origin}
        ts = max(0, int(round((offset + start - origin) * 1e6)))
        out.append({"ph": "X", "name": str(event.get("name", event.get("cat", "ray"))),
                    "cat": f"ray,{event.get('cat', '')}", "pid": pid, "tid": 0, "ts": ts,
                    "dur": max(0, int(round((offset + end - origin) * 1e6)) - ts),
                    "args": args})
    for (node, component), pid in pids.items():
        out += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                 "args": {"name": f"ray {component} @ {node}"}},
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                 "args": {"sort_index": pid}},
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "ts": 0,
                 "args": {"name": component}}]
    meta = {"alignment": ALIGNMENT_NOTE, "events": len(out) - 3 * len(pids),
            "left_out": left_out, "processes": len(pids),
            "origins_s": {name: lo for name, lo, _, _ in spans}}
    return out, meta
