"""A worker lost on the dispatch path (``LocalBackend.map_steps``, the Seer variants) is re-run,
not raised: its whole share runs again from scratch on the survivors, which keep going, and
every request comes back with the tokens of the fault-free run (float64, coupled draws); the
timeline marks it as the ordinary path does (a ``failed`` row, each re-run request's
``failed_worker``); a second failure of a re-run request, or no survivor, raises."""
import pytest

from workbench.rl.remedies.seer_divided import DividedDispatch
from workbench.rl.remedies.seer_schedule import LengthPredictor, SeerDispatch
from workbench.rollout import RolloutConfig, RolloutEngine, WorkerFailed
from workbench.rollout.dispatch import Dispatch

from .helpers.models import tiny_model
from .helpers.seer import FailsAt, live_requests

CONFIG = dict(max_new_tokens=10, samples_per_prompt=1, temperature=1.0, seed=3,
              spec_mode="coupled", max_batch_size=2)


def _setup(tokenizer, n_prompts: int):
    model = tiny_model("qwen2", tokenizer)
    live = live_requests(tokenizer, [f"p{i}x?" + "y" * (i % 3) for i in range(n_prompts)])
    return RolloutEngine(model, tokenizer), [g.prompt_ids for g, _ in live], live


def _marked(res, gone: int) -> None:
    """``res`` marks worker ``gone``'s failure as the ordinary path does, its share re-run
    on the survivors from the failure on."""
    steps, reqs = res.timeline.steps, res.timeline.requests
    failed = steps[steps["kind"] == "failed"]
    assert failed["worker"].tolist() == [gone] and failed["start_s"].iloc[0] == 0
    assert failed["end_s"].iloc[0] > 0 and failed["tokens"].iloc[0] == 0
    rerun = reqs[reqs["failed_worker"].notna()]
    assert set(rerun["failed_worker"]) == {gone} and len(rerun) == failed["batch_size"].iloc[0]
    assert gone not in set(reqs["worker"]) and gone not in set(steps.query("kind != 'failed'")[
        "worker"])  # its own rows did not come back either
    assert (rerun["start_s"] >= failed["end_s"].iloc[0]).all()  # none before the failure


def test_a_worker_lost_under_seer_schedule_is_rerun_token_for_token(tokenizer, tick_clock):
    engine, prompts, live = _setup(tokenizer, 6)
    config = RolloutConfig(workers=2, **CONFIG)
    plain = engine.rollout(prompts, config, progress=False)
    res = engine.rollout(prompts, config, progress=False, schedule=FailsAt({1: 3}),
                         dispatch=SeerDispatch(live, LengthPredictor()))
    assert res.tokens == plain.tokens  # every request, the fault-free tokens
    for a, b in zip(res.logprobs, plain.logprobs):
        assert a == pytest.approx(b, abs=1e-12)
    _marked(res, 1)
    assert set(res.timeline.requests["worker"]) == {0}  # the one survivor ran them all


def test_a_worker_lost_under_seer_divided_goes_to_the_pool_of_the_survivors(tokenizer,
                                                                           tick_clock):
    engine, prompts, live = _setup(tokenizer, 9)
    config = RolloutConfig(workers=3, **CONFIG)
    plain = engine.rollout(prompts, config, progress=False)
    dispatch = DividedDispatch(live, LengthPredictor())
    res = engine.rollout(prompts, config, progress=False, schedule=FailsAt({1: 2}),
                         dispatch=dispatch)
    assert res.tokens == plain.tokens
    _marked(res, 1)
    rerun = res.timeline.requests.query("failed_worker.notna()")
    assert set(rerun["worker"]) == {0, 2}  # the pool fed both survivors
    assert {dispatch.outputs[i].uid for i in range(9)} == {q.uid for q in res.requests}
    assert all(dispatch.outputs[q.prompt_id] is q for q in res.requests)  # the fresh outputs


def test_the_default_dispatch_deals_a_lost_share_over_the_survivors_by_clock(tokenizer,
                                                                            tick_clock):
    engine, prompts, _ = _setup(tokenizer, 6)
    config = RolloutConfig(workers=3, **CONFIG)
    plain = engine.rollout(prompts, config, progress=False)
    res = engine.rollout(prompts, config, progress=False, schedule=FailsAt({0: 2}),
                         dispatch=Dispatch())
    assert res.tokens == plain.tokens
    _marked(res, 0)
    rerun = res.timeline.requests.query("failed_worker.notna()").sort_values("uid")
    assert sorted(rerun["worker"]) == [1, 2]  # worker 0's two requests, one each


def test_no_second_chance_and_no_survivor_raise(tokenizer, tick_clock):
    engine, prompts, live = _setup(tokenizer, 4)
    config = RolloutConfig(workers=2, **CONFIG)
    # worker 1 is lost first; worker 0 then fails while it re-runs worker 1's requests
    with pytest.raises(WorkerFailed, match="worker 0 failed: RuntimeError: worker 0 lost") as e:
        engine.rollout(prompts, config, progress=False, schedule=FailsAt({1: 2, 0: 9}),
                       dispatch=SeerDispatch(live, LengthPredictor()))
    assert isinstance(e.value.__context__, WorkerFailed) and e.value.__context__.worker == 1
    assert {q.uid for q in e.value.__context__.requests} <= {q.uid for q in e.value.requests}
    assert [f.worker for f in e.value.failures] == [0, 1]
    # both lost before either's share was handed out: the lowest worker's failure, with both
    with pytest.raises(WorkerFailed, match="worker 0 failed") as e:
        engine.rollout(prompts, config, progress=False, schedule=FailsAt({0: 2, 1: 2}),
                       dispatch=SeerDispatch(live, LengthPredictor()))
    assert [f.worker for f in e.value.failures] == [0, 1] and e.value.results == {}
