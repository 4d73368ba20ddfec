"""Rollout timelines as Chrome trace-event JSON: a real speculative rollout and a TLT-like step
(drafter training, a preempted drafter step, a failed worker, re-run steps, decision columns)
go out and come back as equal steps and requests tables; the file is valid trace-event JSON;
``workbench timeline export`` writes one from saved folders and refuses bad input before
writing anything."""
import json
import re

import pandas as pd
import pytest

from workbench.cli import main
from workbench.rollout import RolloutEngine, Timeline
from workbench.rollout.chrome_trace import chrome_trace, read_chrome_trace, write_chrome_trace
from workbench.speculative import NGramDrafter

from .helpers.models import PROMPTS, tiny_model


@pytest.fixture(scope="module")
def speculative(tokenizer) -> Timeline:
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=1), tokenizer)
    res = engine.rollout(PROMPTS, max_new_tokens=24, workers=2, progress=False,
                         drafter=NGramDrafter(), spec_k=3)
    assert {"prefill", "draft", "verify"} <= set(res.timeline.steps["kind"])
    return res.timeline


def _step(worker, step, kind, start, end, **extra):
    return {"worker": worker, "step": step, "kind": kind, "start_s": start, "end_s": end,
            "batch_size": extra.pop("batch_size", 2), "tokens": extra.pop("tokens", 0),
            "forward_s": (end - start) / 2, **extra}


def _request(worker, uid, start, end, **extra):
    return {"worker": worker, "uid": uid, "prompt_id": uid // 2, "sample_idx": uid % 2,
            "start_s": start, "end_s": end, "prompt_tokens": 5, "response_tokens": 7,
            "finish": "eos", "verify_steps": 3, "drafted": 9, "accepted": 4, "emitted": 7,
            "reward": float("nan"), **extra}


@pytest.fixture
def tlt_step() -> Timeline:
    """Worker 0 decodes long; worker 1 finishes early and trains the drafter in its window
    (its last step preempted at the window's end); worker 2 fails and worker 0 re-runs its
    request. Times have more digits than microseconds keep."""
    steps = [
        _step(0, 0, "prefill", 0.0, 0.0123456789, batch_size=2, tokens=2),
        _step(0, 1, "draft", 0.0123456789, 0.02, decision=0, plan_k=3, plan_branch=1,
              plan_drafter="ngram", arm="k3", explored=True, bucket="wide", score=0.5),
        _step(0, 2, "verify", 0.02, 0.031, batch_size=2, tokens=5, decision=0, plan_k=3,
              plan_branch=1, plan_drafter="ngram", arm="k3", explored=True, bucket="wide",
              score=0.5, cpu_share=0.75),
        _step(0, 3, "decode", 0.031, 0.04, batch_size=1, tokens=1, decision=1, plan_k=0,
              arm="plain", explored=False, bucket="narrow"),
        _step(0, 4, "prefill", 0.04, 0.045, batch_size=1, tokens=1, rerun=True),
        _step(0, 5, "decode", 0.045, 0.1, batch_size=1, tokens=3, rerun=True),
        _step(1, 0, "prefill", 0.0, 0.01, batch_size=1, tokens=1),
        _step(1, 1, "decode", 0.01, 0.03, batch_size=1, tokens=4),
        _step(1, 2, "drafter_train", 0.03, 0.07, batch_size=16),
        _step(1, 3, "drafter_train", 0.07, 0.1, batch_size=16, preempted=True),
        _step(2, 0, "failed", 0.0, 0.02, batch_size=1),
    ]
    requests = [_request(0, 10, 0.0, 0.04), _request(0, 11, 0.0, 0.031, text="a1 b2",
                                                     reward=1.0),
                _request(1, 12, 0.0, 0.03, verify_steps=0, accepted=0, drafted=0),
                _request(0, 13, 0.04, 0.1, failed_worker=2, finish="length")]
    return Timeline.from_records(steps, requests, num_workers=3)


def _same(back: Timeline, tl: Timeline) -> None:
    pd.testing.assert_frame_equal(back.steps, tl.steps)
    pd.testing.assert_frame_equal(back.requests, tl.requests)
    assert (back.num_workers, back.clock) == (tl.num_workers, tl.clock)


def test_a_speculative_rollout_round_trips_through_its_chrome_trace(speculative, tmp_path):
    path = write_chrome_trace(speculative, tmp_path / "trace.json")
    _same(read_chrome_trace(path), speculative)


def test_drafter_training_preempted_failed_and_rerun_rows_round_trip(tlt_step, tmp_path):
    assert tlt_step.decision_columns == ["arm", "explored", "bucket", "score"]
    path = write_chrome_trace(tlt_step, tmp_path / "trace.json")
    back = read_chrome_trace(path)
    _same(back, tlt_step)
    assert back.wasted_fraction() == tlt_step.wasted_fraction()
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"drafter_train", "drafter_train (preempted)", "failed", "decode (rerun)",
            "idle", "uid 13"} <= names
    preempted = next(e for e in events if e["name"] == "drafter_train (preempted)")
    assert preempted["args"]["wasted_s"] == pytest.approx(0.1 - 0.07)
    assert "preempted" in preempted["cat"].split(",")
    # the idle bubble: worker 1 after its rollout's end (0.03) to the rollout's end (0.1)
    idle = [e for e in events if e["name"] == "idle"]
    assert [(e["pid"], e["args"]["start_s"], e["args"]["end_s"]) for e in idle] == [
        (2, 0.03, 0.1)]
    accepted = {e["args"]["uid"]: e["args"]["accepted_length"] for e in events
                if e.get("cat") == "request"}
    assert accepted == {10: 4 / 3, 11: 4 / 3, 12: None, 13: 4 / 3}


def test_the_trace_is_valid_trace_event_json(tlt_step, speculative):
    trace = json.loads(json.dumps(chrome_trace({"a": tlt_step, "b": speculative}),
                                  allow_nan=False))
    assert trace["displayTimeUnit"] == "ms" and trace["metadata"]["clock"] == "sim"
    events = trace["traceEvents"]
    for e in events:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e), e
        assert isinstance(e["ts"], int) and e["ts"] >= 0, e
        assert all(isinstance(e[k], int) for k in ("pid", "tid")), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0 and e["cat"], e
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
    assert {e["ph"] for e in events} == {"M", "X", "C"}
    meta = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    used = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    for pid, tid in used:  # every track with slices has its process's and its own name
        assert meta[("process_name", pid, 0)]["name"]
        assert tid == 0 or meta[("thread_name", pid, tid)]["name"]
    assert meta[("process_name", 1, 0)] == {"name": "worker 0"}
    assert {"active batch", "accepted length"} <= {e["name"] for e in events if e["ph"] == "C"}
    # the second timeline starts where the first one's makespan ends
    spans = {e["name"]: e for e in events if e.get("cat") == "timeline"}
    assert spans["b"]["ts"] == round(tlt_step.makespan_s * 1e6)


def test_several_timelines_read_back_by_name(tlt_step, speculative, tmp_path):
    path = write_chrome_trace({"step0003": tlt_step, "step0004": speculative},
                              tmp_path / "t.json")
    _same(read_chrome_trace(path, "step0004"), speculative)
    _same(read_chrome_trace(path, "step0003"), tlt_step)
    with pytest.raises(ValueError, match=r"holds 2 timelines; pass name= one of "
                                         r"\['step0003', 'step0004'\]"):
        read_chrome_trace(path)
    with pytest.raises(ValueError, match=r"timeline 'step9' is not in"):
        read_chrome_trace(path, "step9")


def test_the_cli_exports_saved_steps_one_after_another(tlt_step, speculative, tmp_path,
                                                       capsys):
    run = tmp_path / "ckpt" / "tlt-seed0" / "timelines"
    tlt_step.save(run / "step0003")
    speculative.save(run / "step0004")
    out = tmp_path / "trace.json"
    assert main(["timeline", "export", str(run), "--step", "4", "3", "--out", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert [t["name"] for t in trace["metadata"]["timelines"]] == ["step0004", "step0003"]
    _same(read_chrome_trace(out, "step0003"), tlt_step)
    # every step without --step; a single saved folder alone
    assert main(["timeline", "export", str(run.parent), "--out", str(out)]) == 0
    assert [t["name"] for t in json.loads(out.read_text())["metadata"]["timelines"]] == [
        "step0003", "step0004"]
    assert main(["timeline", "export", str(run / "step0004"), "--out", str(out)]) == 0
    _same(read_chrome_trace(out), speculative)
    assert "ui.perfetto.dev" in capsys.readouterr().out


def test_the_cli_refuses_bad_input_before_writing(tlt_step, tmp_path, capsys):
    tlt_step.save(tmp_path / "ckpt" / "tlt-seed0" / "timelines" / "step0003")
    tlt_step.save(tmp_path / "ckpt" / "baseline-seed0" / "timelines" / "step0003")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "trace.json"
    cases = [
        ([str(tmp_path / "empty")], r"no saved timeline under '.*empty'"),
        ([str(tmp_path / "nowhere")], r"'.*nowhere' is not a folder"),
        ([str(tmp_path / "ckpt")], r"holds timelines in 2 folders: \['baseline-seed0/"
                                   r"timelines', 'tlt-seed0/timelines'\]; pass one of them"),
        ([str(tmp_path / "ckpt" / "tlt-seed0"), "--step", "7"],
         r"step\(s\) \[7\] not saved under '.*tlt-seed0'; saved steps: \[3\]"),
    ]
    for argv, message in cases:
        assert main(["timeline", "export", *argv, "--out", str(out)]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("workbench timeline export: error: ") and err.count("\n") == 1
        assert re.search(message, err), err
        assert not out.exists()


def test_a_decision_column_named_like_a_derived_arg_is_refused(tmp_path):
    tl = Timeline.from_records([_step(0, 0, "decode", 0.0, 0.1, wasted_s=1.0)],
                               [_request(0, 1, 0.0, 0.1)], num_workers=1)
    with pytest.raises(ValueError, match=r"decision column\(s\) \['wasted_s'\]"):
        write_chrome_trace(tl, tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


def test_the_timeline_explorer_exports_the_shown_timeline(tlt_step, speculative, tmp_path,
                                                          monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    from workbench.viz.timeline_explorer import TimelineExplorer
    run = tmp_path / "run"
    tlt_step.save(run / "timelines" / "step0003")
    speculative.save(run / "timelines" / "step0004")
    (run / "metrics.json").write_text("{}")
    explorer = TimelineExplorer(run)
    explorer.controls["step"].value = "timelines/step0004"
    assert explorer.export_path.placeholder == "run-timelines-step0004.chrome_trace.json"
    explorer.export_path.value = str(tmp_path / "shown.json")
    explorer.export_button.click()
    assert "wrote" in explorer.export_status.value
    _same(read_chrome_trace(tmp_path / "shown.json"), speculative)
    monkeypatch.chdir(tmp_path)  # an empty path: the default name, in the working folder
    explorer.export_path.value = ""
    explorer.controls["step"].value = "timelines/step0003"
    explorer.export_button.click()
    _same(read_chrome_trace(tmp_path / "run-timelines-step0003.chrome_trace.json"), tlt_step)
    explorer.export_path.value = str(tmp_path)  # a folder: refused, shown, nothing raised
    explorer.export_button.click()
    assert "not written" in explorer.export_status.value
    assert explorer.export_button in explorer.widget().children[1].children
