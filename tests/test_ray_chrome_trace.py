"""A Ray rollout's Chrome trace with Ray's own task timeline (``ray.timeline()``), on the
session's Ray and actors (conftest.py): Ray's events go on process tracks of their own, aligned
at the rollout's origin (``Timeline.origin_s``, the driver's wall time at submit), so that each
actor's ``call`` task starts at or after the rollout's 0, before its worker's first step, and
ends after its worker's last one; the request-steps table travels back from the actors."""
import json
import time

import pandas as pd
import ray

from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.chrome_trace import read_chrome_trace, write_chrome_trace

from .helpers.models import PROMPTS, tiny_model

CALL = "ray,task::WorkerHost.call"


def _ray_events_of(origin_s: float, workers: int, wait_s: float = 30.0) -> list[dict]:
    """``ray.timeline()`` once it holds the rollout's ``call`` tasks: the actors report their
    task events every second (Ray's ``task_events_report_interval_ms``)."""
    deadline = time.monotonic() + wait_s
    while True:
        events = ray.timeline()
        calls = [e for e in events if e.get("cat") == "task::WorkerHost.call"
                 and e["ts"] / 1e6 >= origin_s]
        if len(calls) >= workers or time.monotonic() > deadline:
            return events


def test_the_trace_holds_rays_task_events_aligned_within_the_rollout(ray_actors, tokenizer,
                                                                     tmp_path):
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=0), tokenizer,
                           backend=ray_actors.backend())
    res = engine.rollout(PROMPTS, RolloutConfig(max_new_tokens=16, workers=2), progress=False,
                         request_steps=True)
    tl = res.timeline
    assert tl.clock == "wall" and tl.origin_s is not None
    assert tl.origin_s <= time.time() and len(tl.request_steps) > 0
    assert (tl.request_steps.groupby("uid")["tokens"].sum()
            == tl.requests.set_index("uid")["response_tokens"]).all()
    path = write_chrome_trace(tl, tmp_path / "ray.json",
                              ray_events=_ray_events_of(tl.origin_s, tl.num_workers))
    trace = json.loads(path.read_text())
    meta = trace["metadata"]["ray"]
    assert meta["events"] > 0 and "origin_s" in meta["alignment"]
    assert meta["origins_s"] == {"timeline": tl.origin_s}
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    slices = [e for e in trace["traceEvents"] if e.get("cat", "").startswith("ray,")]
    assert {e["pid"] for e in slices}.isdisjoint(range(tl.num_workers + 1))  # their own tracks
    assert all(names[e["pid"]].startswith("ray ") for e in slices)
    calls = [e["args"] for e in slices if e["cat"] == CALL]
    assert len(calls) == tl.num_workers
    steps = tl.steps[tl.steps["kind"].isin(["prefill", "decode"])].groupby("worker")
    firsts, lasts = sorted(steps["start_s"].min()), sorted(steps["end_s"].max())
    for call, first in zip(sorted(c["start_s"] for c in calls), firsts):
        assert 0 <= call <= first <= tl.makespan_s
    for call, last in zip(sorted(c["end_s"] for c in calls), lasts):
        assert last <= call < last + 5.0
    for e in slices:  # every event kept overlaps the rollout's span
        assert e["args"]["end_s"] >= 0 and e["args"]["start_s"] <= tl.makespan_s
    back = read_chrome_trace(path)  # Ray's slices are not the timeline's
    pd.testing.assert_frame_equal(back.steps, tl.steps)
    pd.testing.assert_frame_equal(back.request_steps, tl.request_steps)
    assert back.origin_s == tl.origin_s
