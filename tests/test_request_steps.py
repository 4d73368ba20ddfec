"""The timeline's optional third table, one row per request per step (``rollout.request_steps``):
recorded only when asked; its rows agree with the steps and requests tables (each step's rows
are its batch and add up to its tokens; summed per request they give the request's tokens,
verify steps, drafts, accepted and emitted counts); it round-trips through ``Timeline.save``
and the Chrome trace; on the local backend with plain decoding, chain and tree SD, and the
bandit (whose arm and exploring flag each row carries)."""
import pandas as pd
import pytest

from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule, Timeline
from workbench.rollout.chrome_trace import chrome_trace, read_chrome_trace, write_chrome_trace
from workbench.rollout.request_steps import REQUEST_STEP_COLUMNS
from workbench.speculative import AdaptiveSchedule, EagleDrafter, EagleHead, NGramDrafter

from .helpers.models import MANY, PROMPTS, tiny_model
from .test_faults import FailingSchedule
from .helpers.seer import InOrder
from .test_seer import LengthPredictor, _divided_setup

CFG = RolloutConfig(max_new_tokens=20, workers=2, max_batch_size=3, temperature=1.0, seed=5)


@pytest.fixture(scope="module")
def engine(tokenizer):
    return RolloutEngine(tiny_model("llama", tokenizer, seed=1), tokenizer)


def _runs(engine):
    model = engine.model
    return {
        "plain": {},
        "chain": {"drafter": NGramDrafter(), "spec_k": 3},
        "tree": {"drafter": EagleDrafter(EagleHead(model), model),
                 "schedule": StaticSchedule(3, branch=2, verify_budget=6)},
        "bandit": {"drafter": EagleDrafter(EagleHead(model), model),
                   "schedule": AdaptiveSchedule(arms=["chain:k=2", "tree:k=2,b=2"],
                                                epsilon=0.5, explore_budget=1.0, seed=3)},
    }


@pytest.fixture(scope="module")
def recorded(engine) -> dict:
    """Each kind of rollout twice, without and with the table: ``{name: (off, on)}``."""
    out = {}
    for name, kw in _runs(engine).items():
        prompts = MANY if name == "bandit" else PROMPTS
        off = engine.rollout(prompts, CFG, progress=False, **kw)
        on = engine.rollout(prompts, CFG, progress=False, request_steps=True,
                            **_runs(engine)[name])
        out[name] = (off, on)
    return out


def agree(tl: Timeline) -> None:
    """The three tables agree (rollout.request_steps, module docstring)."""
    rs, steps, req = tl.request_steps, tl.steps, tl.requests.set_index("uid")
    emitting = steps[steps["kind"].isin(["prefill", "decode", "verify"])]
    per_step = rs.groupby(["worker", "step"]).agg(rows=("uid", "size"),
                                                  added=("tokens", "sum"))
    both = emitting.set_index(["worker", "step"]).join(per_step, how="outer")
    assert both["rows"].notna().all() and both["kind"].notna().all()  # every step, no stray
    assert (both["rows"] == both["batch_size"]).all() and (both["added"] == both["tokens"]).all()
    verify = rs[rs["kind"] == "verify"]
    per_uid = pd.DataFrame({
        "response_tokens": rs.groupby("uid")["tokens"].sum(),
        "verify_steps": verify.groupby("uid").size(),
        "drafted": verify.groupby("uid")["drafted"].sum(),
        "accepted": verify.groupby("uid")["accepted"].sum(),
        "emitted": verify.groupby("uid")["tokens"].sum()}).reindex(req.index).fillna(0)
    for c in per_uid:
        assert (per_uid[c].astype(int) == req[c]).all(), c
    assert (rs.loc[rs["kind"] != "verify", ["drafted", "accepted"]] == 0).all().all()
    assert (verify["accepted"] <= verify["drafted"]).all()
    assert (verify["tokens"] <= verify["accepted"] + 1).all()  # accepted + the policy's own
    by_step = steps.set_index(["worker", "step"])
    for c in tl.decision_columns:  # the step's decision, on each of its rows
        pd.testing.assert_series_equal(
            rs[c].reset_index(drop=True),
            by_step.loc[list(zip(rs["worker"], rs["step"])), c].reset_index(drop=True),
            check_names=False)


@pytest.mark.parametrize("name", ["plain", "chain", "tree", "bandit"])
def test_the_table_agrees_with_the_steps_and_requests_and_is_recorded_only_when_asked(
        recorded, name):
    off, on = recorded[name]
    assert off.timeline.request_steps is None
    assert on.tokens == off.tokens  # recording changes nothing the rollout does
    rs = on.timeline.request_steps
    assert list(rs.columns[:len(REQUEST_STEP_COLUMNS)]) == list(REQUEST_STEP_COLUMNS)
    agree(on.timeline)
    assert ("verify" in set(rs["kind"])) == (name != "plain")
    if name == "tree":
        assert rs.loc[rs["kind"] == "verify", "drafted"].eq(6).all()  # the tree's budget
        assert rs["accepted"].max() >= 2
    if name == "bandit":
        assert {"arm", "explored", "bucket"} <= set(rs.columns)
        assert {"plain", "chain:k=2", "tree:k=2,b=2"} <= set(rs["arm"].dropna())
        assert rs["explored"].dropna().nunique() == 2


def test_it_round_trips_through_save_and_load(recorded, tmp_path):
    for name, (off, on) in recorded.items():
        on.timeline.save(tmp_path / name)
        back = Timeline.load(tmp_path / name)
        pd.testing.assert_frame_equal(back.request_steps, on.timeline.request_steps)
        pd.testing.assert_frame_equal(back.steps, on.timeline.steps)
        off.timeline.save(tmp_path / f"{name}_off")
        assert not (tmp_path / f"{name}_off" / "request_steps.parquet").exists()
        assert Timeline.load(tmp_path / f"{name}_off").request_steps is None


def test_the_chrome_trace_holds_it_on_the_request_tracks_and_reads_it_back(recorded, tmp_path):
    tl = recorded["bandit"][1].timeline
    trace = chrome_trace(tl)
    slices = [e for e in trace["traceEvents"] if e.get("cat", "").startswith("request_step")]
    assert len(slices) == len(tl.request_steps)
    tracks = {(e["pid"], e["tid"]): e for e in trace["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") == "request"}
    for e in slices:  # nested in its request's slice, on its track
        request = tracks[(e["pid"], e["tid"])]
        assert request["args"]["uid"] == e["args"]["uid"]
        assert request["ts"] <= e["ts"] and e["ts"] + e["dur"] <= request["ts"] + request["dur"]
    verify = next(e for e in slices if e["args"]["kind"] == "verify")
    assert {"accepted", "drafted", "tokens", "arm", "explored", "start_s", "end_s"} \
        <= set(verify["args"])
    write_chrome_trace(tl, tmp_path / "t.json")
    back = read_chrome_trace(tmp_path / "t.json")
    pd.testing.assert_frame_equal(back.request_steps, tl.request_steps)
    plain = recorded["plain"][0].timeline
    write_chrome_trace(plain, tmp_path / "plain.json")
    assert read_chrome_trace(tmp_path / "plain.json").request_steps is None


def test_a_table_that_disagrees_with_the_steps_is_refused(recorded):
    tl = recorded["chain"][1].timeline
    rs = tl.request_steps
    cases = {
        "lacks columns": rs.drop(columns="accepted"),
        "of kind": rs.assign(kind="draft"),
        "not in the steps table": rs.assign(step=rs["step"] + 10_000),
        "not in the requests table": rs.assign(uid=rs["uid"] + 1),
        "adding": rs.assign(tokens=rs["tokens"] + 1),
        "two rows of one request": pd.concat([rs, rs.iloc[:1]]),
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message):
            Timeline(tl.steps, tl.requests, tl.num_workers, tl.clock, bad)


def test_a_lost_workers_rerun_is_in_the_table_and_its_lost_steps_are_not(engine, tmp_path):
    """A worker that fails mid-rollout loses its rows with its steps; the survivor's re-run
    rows agree with its rerun steps, so the table still sums to every request's tokens."""
    res = engine.rollout(PROMPTS, CFG, progress=False, request_steps=True,
                         schedule=FailingSchedule(tmp_path))
    tl = res.timeline
    assert (tl.steps["kind"] == "failed").any() and tl.steps["rerun"].fillna(False).any()
    agree(tl)
    rerun = tl.steps[tl.steps["rerun"].fillna(False).astype(bool)]
    rows = tl.request_steps.merge(rerun[["worker", "step"]])
    assert set(rows["uid"]) == set(tl.requests.loc[tl.requests["failed_worker"].notna(), "uid"])


def test_a_request_moved_between_workers_has_its_rows_on_both(tokenizer, tick_clock):
    """Seer's divided rollout moves running requests (``rollout.dispatch``): a moved
    request's rows lie on the worker it started on and on the one that re-prefilled it,
    and still sum to its tokens."""
    engine, live, caps, config = _divided_setup(tokenizer)
    dispatch = InOrder(live, LengthPredictor())
    res = engine.rollout([g.prompt_ids + r.tokens for g, r in live], config, progress=False,
                         caps=caps, dispatch=dispatch, request_steps=True)
    assert dispatch.moves >= 1
    tl = res.timeline
    agree(tl)
    workers = tl.request_steps.groupby("uid")["worker"].nunique()
    assert (workers == 2).any()
    trace = chrome_trace(tl)  # the rows on the first worker go on a track of their own there
    moved = [e for e in trace["traceEvents"] if e.get("cat", "").startswith("request_step")
             and e["args"]["uid"] in set(workers[workers == 2].index)]
    assert len({e["pid"] for e in moved}) == 2
