"""The steps table keeps a schedule's reasons as decision columns it does not interpret
(typed by their values, through save/load and added rows), and reports each worker's idle
window."""
import pandas as pd
import pytest

from workbench.rollout import PlainSchedule, RolloutEngine, Timeline
from workbench.rollout.schedule import Decision
from workbench.rollout.timeline import RESERVED_STEP_COLUMNS

from .helpers.models import PROMPTS, tiny_model


class ExplainedSchedule(PlainSchedule):
    """Plain at every step, with reasons of every scalar kind (one NA-only key)."""

    def __init__(self, reasons=None):
        self.reasons, self.steps = reasons, 0

    def decide(self, batch_size, worker):
        self.steps += 1
        rows = batch_size
        reasons = self.reasons if self.reasons is not None else {
            "phase": "tail" if rows < 3 else "head", "score": rows / 2, "wide": rows > 4,
            "rows_seen": rows, "note": None}
        return Decision(self.plan(batch_size, worker), reasons)


def test_a_schedules_reasons_become_typed_columns_the_rollout_keeps(tokenizer, tmp_path):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    res = engine.rollout(PROMPTS, max_new_tokens=12, workers=2, schedule=ExplainedSchedule(),
                         progress=False)
    tl = res.timeline
    assert tl.decision_columns == ["phase", "score", "wide", "rows_seen", "note"]
    dtypes = {c: str(tl.steps[c].dtype) for c in tl.decision_columns}
    assert dtypes == {"phase": "string", "score": "Float64", "wide": "boolean",
                      "rows_seen": "Int64", "note": "object"}
    decode = tl.steps[tl.steps["kind"] == "decode"]
    assert (decode["rows_seen"] == decode["batch_size"]).all()
    phase = decode["batch_size"].map(lambda b: "tail" if b < 3 else "head")
    assert (decode["phase"] == phase).all()
    assert tl.steps.loc[tl.steps["kind"] == "prefill", "phase"].isna().all()
    d = tl.decisions()
    assert list(d.columns) == ["worker", "decision", "plan_k", "plan_branch", "plan_budget",
                               "plan_drafter", *tl.decision_columns, "rows", "tokens",
                               "seconds"]
    assert (d["rows_seen"] == d["rows"]).all() and len(d) == len(decode)
    # saved and loaded, and with idle-window rows added, the columns keep their types
    tl.save(tmp_path / "tl")
    pd.testing.assert_frame_equal(Timeline.load(tmp_path / "tl").steps, tl.steps)
    window = tl.idle_windows()[0]
    more = tl.with_steps([{"worker": window.worker, "step": 999, "kind": "drafter_train",
                           "start_s": window.start_s, "end_s": window.end_s, "batch_size": 1,
                           "tokens": 0, "forward_s": 0.0}])
    assert more.steps[tl.decision_columns].dtypes.equals(tl.steps[tl.decision_columns].dtypes)
    assert more.steps["phase"].iloc[-1] is pd.NA


@pytest.mark.parametrize("reasons, match", [
    ({"kind": "x"}, r"names \['kind'\], which are the rollout's own steps columns"),
    ({"plan_k": 3}, r"names \['plan_k'\]"),
    ({"arms": ["a", "b"]}, r"accepted values: bool, int, float, str or None"),
])
def test_reasons_that_are_not_scalars_or_take_a_rollout_column_are_refused(tokenizer, reasons,
                                                                          match):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    with pytest.raises(ValueError, match=match):  # bad input, not a worker's failure
        engine.rollout(PROMPTS[:2], max_new_tokens=4, schedule=ExplainedSchedule(reasons),
                       progress=False)
    assert {"worker", "kind", "decision", "plan_k", "preempted"} <= RESERVED_STEP_COLUMNS


def test_idle_windows_cover_every_worker_first_to_finish_first(tokenizer):
    """Two prompts on four workers: workers 2 and 3 decode nothing and idle from 0."""
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    tl = engine.rollout(PROMPTS[:2], max_new_tokens=12, workers=4, progress=False).timeline
    windows = tl.idle_windows()
    assert [(w.worker, w.start_s) for w in windows[:2]] == [(2, 0.0), (3, 0.0)]
    ends = tl.steps.groupby("worker")["end_s"].max()
    assert sorted((w.worker, w.start_s) for w in windows[2:]) == sorted(ends.items())
    assert all(w.end_s == tl.makespan_s and w.seconds == w.end_s - w.start_s for w in windows)
    # drafter work in a window does not move the window
    w = windows[2]
    more = tl.with_steps([{"worker": w.worker, "step": 999, "kind": "drafter_train",
                           "start_s": w.start_s, "end_s": w.end_s, "batch_size": 1,
                           "tokens": 0, "forward_s": 0.0}])
    assert more.idle_windows() == windows
