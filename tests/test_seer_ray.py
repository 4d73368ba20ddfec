"""Seer's divided rollout on Ray (``RayBackend.map_steps``, workbench/rollout/ray_steps.py) on
the session's 2 actors (conftest.py): the local backend's tokens in float64, a running request
moved from the actor with the long shard to the one whose shard is short, its re-prefill on
the receiving actor's wall clock; a worker lost in a round is re-run by the survivor. The
rounds order every decision (each round waits for every busy actor's step, and the dispatch
decides between rounds on what they reported), so no gate and no timing is needed."""
import pytest

from workbench.rl.remedies.seer_schedule import LengthPredictor
from workbench.rollout import RayBackend, RolloutConfig, RolloutEngine
from workbench.tasks import Problem

from .helpers.backends import Tail
from .helpers.models import tiny_model
from .helpers.seer import FailsAt, InOrder, live_requests

CONFIG = RolloutConfig(workers=2, max_new_tokens=16, samples_per_prompt=1, ignore_eos=True,
                       temperature=1.0, seed=3, spec_mode="coupled")
CAPS = [2, 16, 2, 16, 2, 16]  # dealt round-robin: worker 0's three stop after 2 tokens


@pytest.fixture(scope="module")
def setup(ray_actors, tokenizer):
    """The session's actors with the policy ``tiny_model("llama")`` (seed 0, float64), an
    engine on them and one on the local backend, and six requests as the Sampler hands
    them over."""
    model = tiny_model("llama", tokenizer, seed=0)
    backend = ray_actors.backend()
    backend.update_weights(policy=model.state_dict())
    live = live_requests(tokenizer, [f"p{i}x?" for i in range(6)])
    return (RolloutEngine(model, tokenizer, backend=backend), RolloutEngine(model, tokenizer),
            [g.prompt_ids for g, _ in live], live)


def test_seer_divided_on_ray_moves_a_request_and_keeps_the_local_tokens(setup):
    ray_engine, local_engine, prompts, live = setup
    local = local_engine.rollout(prompts, CONFIG, progress=False, caps=CAPS,
                                 dispatch=InOrder(live, LengthPredictor()))
    dispatch = InOrder(live, LengthPredictor())
    res = ray_engine.rollout(prompts, CONFIG, progress=False, caps=CAPS, dispatch=dispatch)
    assert res.timeline.clock == "wall" and res.tokens == local.tokens
    for a, b in zip(res.logprobs, local.logprobs):
        assert a == pytest.approx(b, abs=1e-12)
    steps, req = res.timeline.steps, res.timeline.requests
    moved = steps[steps["moved_from"].notna()]
    assert dispatch.moves >= 1 and len(moved) >= 1  # worker 1's long request went to 0
    assert set(moved["worker"]) == {0} and set(moved["moved_from"]) == {1}
    assert (moved["kind"] == "prefill").all() and (moved["end_s"] > moved["start_s"]).all()
    long_ones = req[req["prompt_id"].isin([1, 3, 5])]
    assert (long_ones["worker"] == 0).any() and (long_ones["response_tokens"] == 16).all()
    # the re-prefill is on worker 0's wall clock, after worker 1 let the request go
    w1 = steps[steps["worker"] == 1]
    assert moved["start_s"].min() >= w1["end_s"][w1["end_s"] <= moved["start_s"].min()].max()
    assert sorted(req["uid"]) == sorted(r.uid for r in local.requests)  # each answered once


def test_a_worker_lost_in_a_round_is_rerun_by_the_survivor(setup, tmp_path):
    ray_engine, local_engine, prompts, live = setup
    plain = local_engine.rollout(prompts, CONFIG, progress=False, caps=CAPS)
    res = ray_engine.rollout(prompts, CONFIG, progress=False, caps=CAPS,
                             schedule=FailsAt({1: 3}), dispatch=InOrder(live, LengthPredictor()))
    assert res.tokens == plain.tokens
    steps, req = res.timeline.steps, res.timeline.requests
    failed = steps[steps["kind"] == "failed"]
    assert failed["worker"].tolist() == [1] and failed["end_s"].iloc[0] > 0
    assert set(req["worker"]) == {0}  # the survivor ran worker 1's share again
    rerun = req[req["failed_worker"] == 1]
    assert len(rerun) == failed["batch_size"].iloc[0] >= 1
    assert set(rerun["prompt_id"]) <= {1, 3, 5}  # worker 1's long ones, but any it gave away


def test_seer_divided_trains_on_ray_with_the_local_runs_tokens(setup, ray_actors, tokenizer):
    from workbench.rl import GRPOConfig
    from workbench.rl.remedies.seer_schedule import SeerTrainer
    from workbench.rl.variants import VARIANTS
    grpo = GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=2, max_new_tokens=8, lr=5e-2,
                           workers=2, seed=1, temperature=1.0)
    problems = [Problem(prompt=f"q{i}?" + "x" * (i * 7 % 5), answer="a", uid=i)
                for i in range(4)]
    variant = VARIANTS.get("seer_divided")()

    def run(backend, clock):
        trainer = SeerTrainer(tiny_model("llama", tokenizer, seed=0), tokenizer, problems,
                              lambda p, c, a: float(len(c) % 3 == 0), variant.config(grpo),
                              dispatch_cls=variant.dispatch_cls, backend=backend)
        trainer.run(2, progress=False)
        assert {s.timeline.clock for s in trainer.last} == {clock}
        return trainer.history
    on_ray, local = run(ray_actors.backend(), "wall"), run("local", "sim")
    assert list(on_ray["tokens_digest"]) == list(local["tokens_digest"])
    assert list(on_ray["reward"]) == list(local["reward"])
    assert (on_ray["seer_n_used"] == 6).all()  # every request predicted at its start


def test_tail_jobs_beside_a_dispatch_on_ray_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="'ray' backend runs no tail jobs beside a dispatch; "
                                         "accepted: tail=None, or the local backend"):
        RayBackend().map_steps(None, [], None, tail=Tail(None))  # no actor, no Ray needed


def test_a_worker_that_fails_to_begin_raises_naming_it(setup):
    from workbench.rollout import PlainSchedule, WorkerFailed
    from workbench.rollout.dispatch import Dispatch
    from workbench.rollout.worker import WorkerTask
    ray_engine, _, prompts, _ = setup
    requests = ray_engine.make_requests(prompts, CONFIG)
    tasks = [WorkerTask(w, requests[w::2], CONFIG, None, 0) for w in range(2)]

    def begin(worker, task):
        if worker.index == 1:
            raise RuntimeError("worker 1 cannot begin (pretend)")
        return worker.begin(task, PlainSchedule())
    with pytest.raises(WorkerFailed, match="worker 1 failed: RuntimeError: worker 1 cannot"):
        ray_engine.backend.map_steps(begin, tasks, Dispatch())
