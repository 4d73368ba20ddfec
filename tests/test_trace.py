"""The trace format: a trace round-trips through CSV and parquet, a bad row is named by its
line in the file with what is accepted, and the importers read a hand-written CSV and a
workbench run folder."""
import pandas as pd
import pytest

from workbench.cluster import Trace, load_trace, trace_from_csv, trace_from_run
from workbench.cluster.importers import step_strategy
from workbench.cluster.validate import SPECULATIVE
from workbench.rollout import RolloutEngine
from workbench.speculative import EagleDrafter, EagleHead
from workbench.speculative.strategies import parse_strategy, strategy_name

from .helpers.models import MANY, tiny_model


def small_trace(workers=True) -> Trace:
    requests = pd.DataFrame({"prompt_tokens": [5, 7, 9], "response_tokens": [12, 3, 40],
                             "group": ["p0", "p0", "p1"]})
    if workers:
        requests["worker"] = [0, 1, 0]
    steps = pd.DataFrame({"batch_size": [1, 2, 2, 4], "kind": ["plain", "plain", "chain:k=4",
                                                                "prefill"],
                          "seconds": [0.01, 0.012, 0.02, 0.05], "tau": [1.0, 1.0, 2.5, 1.0]})
    return Trace(requests, steps)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("workers", [True, False])
def test_a_trace_round_trips_through_the_file(tmp_path, suffix, workers):
    trace = small_trace(workers)
    loaded = load_trace(trace.save(tmp_path / f"t{suffix}"))
    pd.testing.assert_frame_equal(loaded.requests, trace.requests)
    pd.testing.assert_frame_equal(loaded.steps, trace.steps)
    assert loaded.has_workers == workers


def test_a_file_of_lengths_alone_is_a_trace(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,response_tokens,group\n3,10,a\n4,20,a\n")
    trace = load_trace(path)
    assert trace.requests["response_tokens"].tolist() == [10, 20] and trace.steps.empty


def test_bad_rows_are_named_by_their_line_with_what_is_accepted(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("record,prompt_tokens,response_tokens,group,batch_size,kind,seconds,tau\n"
                    "request,3,10,a,,,,\n"          # line 2: fine
                    "request,3,x,a,,,,\n"           # line 3: response not a number
                    "request,-1,4,,,,,\n"           # line 4: prompt < 0, empty group
                    "step,,,,2,beam:k=4,0.1,\n"     # line 5: unknown kind
                    "step,,,,0,plain,0.1,2\n"       # line 6: batch 0, tau 2 on plain
                    "answer,,,,,,,\n")              # line 7: unknown record
    with pytest.raises(ValueError) as err:
        load_trace(path)
    msg = str(err.value)
    assert "line 2" not in msg
    for expected in ["line 3: response_tokens 'x' is not an integer >= 1",
                     "line 4: prompt_tokens '-1' is not an integer >= 0",
                     "line 4: group is empty",
                     "line 5: kind 'beam:k=4' is unknown; accepted: 'plain', 'prefill'",
                     "line 6: batch_size '0' is not an integer >= 1",
                     "line 6: tau 2 on a 'plain' row; accepted: 1 or empty",
                     "line 7: record 'answer' is unknown; accepted: ('request', 'step')"]:
        assert expected in msg, msg


def test_a_bad_row_of_a_table_in_memory_is_named_by_its_row():
    with pytest.raises(ValueError, match=r"request row 1: response_tokens 0 is not an integer"):
        Trace(pd.DataFrame({"prompt_tokens": [1, 2], "response_tokens": [3, 0],
                            "group": ["a", "b"]}))


def test_the_csv_importer_reads_a_hand_written_export_through_its_mapping(tmp_path):
    path = tmp_path / "verl.csv"
    path.write_text("uid,prompt_length,response_length,reward\n"
                    "q1,12,301,1.0\nq1,12,1999,0.0\nq2,40,77,1.0\n")
    trace = trace_from_csv(path, columns={"group": "uid", "prompt_tokens": "prompt_length",
                                          "response_tokens": "response_length"})
    assert trace.requests.to_dict("list") == {"prompt_tokens": [12, 12, 40],
                                              "response_tokens": [301, 1999, 77],
                                              "group": ["q1", "q1", "q2"]}
    path.write_text("uid,prompt_length,response_length\nq1,12,301\nq1,12,2.5\n")
    with pytest.raises(ValueError, match=r"line 3: response_tokens '2.5' is not an integer"):
        trace_from_csv(path, columns={"group": "uid", "prompt_tokens": "prompt_length",
                                      "response_tokens": "response_length"})
    with pytest.raises(ValueError, match=r"lacks the columns \{'group': 'prompt'\}"):
        trace_from_csv(path, columns={"group": "prompt"})
    with pytest.raises(ValueError, match=r"unknown trace fields \['length'\]; accepted"):
        trace_from_csv(path, columns={"length": "response_length"})


def test_the_run_importer_reads_a_saved_timeline(tokenizer, tmp_path):
    res = RolloutEngine(tiny_model("llama", tokenizer), tokenizer).rollout(
        MANY[:5], max_new_tokens=6, workers=2, progress=False)
    res.timeline.save(tmp_path / "run" / "timeline")
    trace = trace_from_run(tmp_path / "run")
    r = res.timeline.requests
    assert trace.requests["response_tokens"].tolist() == r["response_tokens"].tolist()
    assert trace.requests["worker"].tolist() == r["worker"].tolist()
    assert trace.requests["group"].tolist() == r["prompt_id"].astype(str).tolist()
    s = trace.steps
    assert set(s["kind"]) == {"prefill", "plain"}
    assert sorted(s.loc[s["kind"] == "prefill", "batch_size"]) == [2, 3]  # one per worker
    decode = res.timeline.steps[res.timeline.steps["kind"] == "decode"]
    assert (s["kind"] == "plain").sum() == len(decode)


@pytest.mark.parametrize("arm", ["plain", "chain:k=3", "tree:k=2,b=2", "tree:k=3,b=2,n=4",
                                 "sibling:k=2"])
def test_step_kinds_are_the_schedules_strategy_names(arm):
    """The run importer names a step's plan, and the validator accepts it, as the schedule's
    own strategy strings do (the cluster layer sits below speculative, so it matches them by
    itself: this keeps the two in step)."""
    plan = parse_strategy(arm)
    drafter = "sibling" if plan.drafter == "sibling" else "eagle"
    assert step_strategy(plan.k, plan.branch, pd.NA if plan.verify_budget is None
                     else plan.verify_budget, drafter) == strategy_name(plan) == arm
    assert arm == "plain" or SPECULATIVE.fullmatch(arm)


def test_the_run_importer_reads_speculative_steps_with_their_tau(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, seed=4)
    res = RolloutEngine(model, tokenizer).rollout(
        MANY[:4], max_new_tokens=12, workers=2, spec_k=3, progress=False,
        drafter=EagleDrafter(EagleHead(model), model))
    res.timeline.save(tmp_path / "timeline")
    s = trace_from_run(tmp_path).steps
    assert set(s["kind"]) == {"prefill", "chain:k=3"}
    spec = s[s["kind"] == "chain:k=3"]
    assert spec["tau"].between(1, 4).all()  # k = 3 drafts and the policy's own token
    d = res.timeline.decisions()
    assert spec["tau"].tolist() == pytest.approx((d["tokens"] / d["rows"]).tolist())
