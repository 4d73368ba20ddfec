"""Faults: a worker lost mid-rollout has its shard re-run on a survivor, token for token, and
the timeline marks both; a second failure raises; a worker lost while training the drafter
takes only its copy with it, and a whole drafter serves. The local backend, then the session's
local 2-CPU Ray instance (conftest.py), whose actors really die (``os._exit``)."""
import copy
import os
import pickle
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import torch

from workbench.adapt import SpotConfig, SpotTrainer, drafter_job
from workbench.adapt.local_sgd import merge_copies
from workbench.rollout import RolloutConfig, RolloutEngine, WorkerFailed
from workbench.rollout.schedule import PLAIN, PlainSchedule
from workbench.speculative import EagleDrafter, EagleHead
from workbench.speculative.train import EagleTrainer

from .helpers.models import PROMPTS, tiny_model
from .gates import HeldOn, Signalled
from .helpers.backends import BrokenDrafter

COUPLED = RolloutConfig(max_new_tokens=24, workers=2, temperature=1.0, seed=3)


class FailingSchedule(PlainSchedule):
    """Plain decoding, but each worker of ``workers`` fails at its decode step ``at``, once
    (a file in ``marks`` says it did, so that a copy in another process knows too): it
    raises, or with ``exit=True`` its process exits (a Ray actor dies)."""

    def __init__(self, marks: Path, workers=(1,), at: int = 2, exit: bool = False):
        self.marks, self.workers, self.at, self.exit = marks, workers, at, exit
        self.seen = dict.fromkeys(workers, 0)

    def plan(self, batch_size, worker):
        if worker in self.workers:
            self.seen[worker] += 1
            mark = self.marks / f"failed-{worker}"
            if self.seen[worker] == self.at and not mark.exists():
                mark.touch()
                if self.exit:
                    os._exit(1)
                raise RuntimeError(f"worker {worker} lost (pretend)")
        return PLAIN


class LostJob(drafter_job.DrafterJob):
    """The drafter job, lost on worker 1: a Ray actor's process exits, a local worker
    raises."""

    def run(self, window, clock):
        if window.worker == 1:
            if getattr(self, "marks", None) is not None:  # a gate waits for it to begin
                (Path(self.marks) / f"job-{window.worker}").touch()
            if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
                os._exit(1)
            raise RuntimeError("worker 1 lost in its window (pretend)")
        return super().run(window, clock)


def _tail_on(result, worker: int, seconds: float = 60.0):
    """``result`` whose ``worker`` decoded ``seconds`` more at the end of the step: it is the
    last to finish, and every other worker's window is long enough for ``max_steps``."""
    tl = result.timeline
    mine = tl.steps[tl.steps["worker"] == worker]
    result.timeline = tl.with_steps([{
        "worker": worker, "step": int(mine["step"].max()) + 1, "kind": "decode",
        "start_s": tl.makespan_s, "end_s": tl.makespan_s + seconds, "batch_size": 1,
        "tokens": 1, "forward_s": seconds}])
    return result


def _rerun_marked(res, lost: dict[int, int]):
    """Check that ``res`` marks each failed worker -> the worker that re-ran its shard."""
    steps, reqs = res.timeline.steps, res.timeline.requests
    failed = steps[steps["kind"] == "failed"].set_index("worker")
    assert sorted(failed.index) == sorted(lost) and (failed["start_s"] == 0).all()
    assert (failed["end_s"] > 0).all() and (failed["tokens"] == 0).all()  # time to failure
    rerun = reqs[reqs["failed_worker"].notna()]
    assert dict(zip(rerun["failed_worker"], rerun["worker"])) == lost
    for gone, by in lost.items():
        assert failed.at[gone, "batch_size"] == (rerun["failed_worker"] == gone).sum()
        own = steps[(steps["worker"] == by) & steps["rerun"].isna()]
        again = steps[(steps["worker"] == by) & steps["rerun"].fillna(False).astype(bool)]
        # once the survivor was free and the failure had happened, on the survivor's clock
        assert again["start_s"].min() >= max(own["end_s"].max(), failed.at[gone, "end_s"])
    assert {w.worker for w in res.timeline.idle_windows()}.isdisjoint(lost)  # no window
    return failed


# ---- the local backend ----------------------------------------------------------------------
def test_a_worker_that_raises_mid_rollout_has_its_shard_rerun_token_for_token(tokenizer,
                                                                              tmp_path):
    model = tiny_model("llama", tokenizer)
    ref = RolloutEngine(model, tokenizer).rollout(PROMPTS, COUPLED, progress=False)
    res = RolloutEngine(model, tokenizer).rollout(PROMPTS, COUPLED, progress=False,
                                                  schedule=FailingSchedule(tmp_path))
    assert res.tokens == ref.tokens and res.logprobs == ref.logprobs  # complete, identical
    failed = _rerun_marked(res, {1: 0})
    steps = res.timeline.steps
    first = steps[steps["rerun"].fillna(False).astype(bool)]["start_s"].min()
    own_end = steps[(steps["worker"] == 0) & steps["rerun"].isna()]["end_s"].max()
    assert first == max(own_end, failed.at[1, "end_s"])  # sim: charged where it would run
    assert res.timeline.makespan_s == steps["end_s"].max()


def test_lost_shards_go_to_the_survivors_in_the_order_they_finished(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer)
    four = replace(COUPLED, workers=4)
    ref = RolloutEngine(model, tokenizer).rollout(PROMPTS, four, progress=False)
    res = RolloutEngine(model, tokenizer).rollout(PROMPTS, four, progress=False,
                                                  schedule=FailingSchedule(tmp_path, (1, 2)))
    assert res.tokens == ref.tokens
    steps = res.timeline.steps
    ends = steps[steps["rerun"].isna() & steps["worker"].isin([0, 3])].groupby("worker")[
        "end_s"].max()
    first, second = ends.sort_values().index  # the first survivor to finish takes worker 1's
    _rerun_marked(res, {1: first, 2: second})


def test_a_second_failure_in_the_rerun_raises(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    requests = engine.make_requests(engine.encode(PROMPTS), COUPLED)
    held = [q.uid for q in requests[1::2]]
    # the drafter fails whenever worker 1's first request is in its batch: on worker 0 too
    with pytest.raises(WorkerFailed, match="worker 0 failed: RuntimeError: out of memory") as e:
        engine.rollout(PROMPTS, COUPLED, drafter=BrokenDrafter(held[0]), progress=False)
    assert [q.uid for q in e.value.requests] == held  # it was re-running worker 1's shard
    assert isinstance(e.value.__context__, WorkerFailed) and e.value.__context__.worker == 1
    # no survivor, nothing to re-run on: the first failure is raised, with every failure
    with pytest.raises(WorkerFailed, match="worker 0 failed: RuntimeError: worker 0 lost") as e:
        engine.rollout(PROMPTS, COUPLED, schedule=FailingSchedule(tmp_path, (0, 1)),
                       progress=False)
    assert [f.worker for f in e.value.failures] == [0, 1] and e.value.results == {}


def _spot(model, tokenizer, engine, tmp_path, config):
    torch.manual_seed(1)
    drafter = EagleDrafter(EagleHead(model).eval(), model)
    spot = SpotTrainer(model, drafter, SpotConfig.flat(batch_size=4, max_steps=2),
                       tmp_path / "head")
    result = engine.rollout(PROMPTS, config, progress=False, harvest=True)
    return spot, _tail_on(result, 0)


def _recorded(backend, monkeypatch) -> list:
    """Every (tail, IdleRun) of ``backend.run_idle`` from now on."""
    calls, real = [], backend.run_idle

    def run_idle(tail, timeline, returned):
        calls.append((tail, real(tail, timeline, returned)))
        return calls[-1][1]
    monkeypatch.setattr(backend, "run_idle", run_idle)
    return calls


def test_a_job_lost_in_one_window_leaves_the_merge_of_the_other_copies(tokenizer, tmp_path,
                                                                       monkeypatch):
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    spot, result = _spot(model, tokenizer, engine, tmp_path, replace(COUPLED, workers=4))
    monkeypatch.setattr(drafter_job, "DrafterJob", LostJob)
    calls = _recorded(engine.backend, monkeypatch)
    out = spot.train_in_idle(result, engine.backend)
    (tail, run), = calls
    windows = run.windows
    assert [w.worker for w in windows] != [1] and 1 in [w.worker for w in windows]
    outcomes = dict(zip([w.worker for w in windows], run.outcomes))
    assert [f.worker for f in run.failed] == [1] and outcomes[1] is None
    assert out["drafter_failed_workers"] == 1 and out["drafter_workers"] == len(windows) - 1
    kept = [o for o in run.outcomes if o is not None]
    merged = merge_copies(tail.start, [o.state for o in kept], [len(o.losses) for o in kept])
    served = spot.serving.head.state_dict()
    assert spot.version == 1 and all(torch.equal(served[k], merged["model"][k]) for k in served)
    lost = result.timeline.steps.query("kind == 'failed'")  # from its window's start
    assert lost["worker"].tolist() == [1]
    assert lost["start_s"].iloc[0] == next(w.start_s for w in windows if w.worker == 1)


# ---- Ray: actors that really die --------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model("llama", tokenizer)


@pytest.fixture(scope="module")
def backend(ray_actors, model):
    """The session's 2 actors (conftest.py), each with its own copy of ``model``."""
    backend = ray_actors.backend()
    backend.update_weights(policy=model.state_dict())
    return backend


def test_ray_a_worker_killed_mid_step_is_rerun_on_worker_0_token_for_token(
        backend, model, tokenizer, tmp_path):
    ref = RolloutEngine(model, tokenizer).rollout(PROMPTS, COUPLED, progress=False).tokens
    engine = RolloutEngine(model, tokenizer, backend=backend)
    res = engine.rollout(PROMPTS, COUPLED, schedule=FailingSchedule(tmp_path, exit=True),
                         progress=False)
    assert res.tokens == ref and res.timeline.clock == "wall"
    _rerun_marked(res, {1: 0})
    # the dead actor was replaced in the background: the next step runs on both again
    again = engine.rollout(PROMPTS, COUPLED, progress=False)
    assert again.tokens == ref and "failed" not in set(again.timeline.steps["kind"])
    assert set(again.timeline.requests["worker"]) == {0, 1}


def _ray_spot(model, tmp_path):
    torch.manual_seed(1)
    drafter = EagleDrafter(EagleHead(model).eval(), model)
    return SpotTrainer(model, drafter, SpotConfig.flat(batch_size=4, max_steps=2),
                       tmp_path / "head")


def test_ray_a_worker_lost_mid_rollout_drops_the_steps_drafter_jobs(backend, model, tokenizer,
                                                                    tmp_path):
    """backend.py, "tail jobs": the map that lost worker 1 hands back no job outcome (worker
    0's, if it had started, was stopped and dropped); the re-run is token for token and the
    previous drafter serves on."""
    ref = RolloutEngine(model, tokenizer).rollout(PROMPTS, COUPLED, progress=False).tokens
    engine = RolloutEngine(model, tokenizer, backend=backend)
    spot = _ray_spot(model, tmp_path)
    before = copy.deepcopy(spot.serving.head.state_dict())
    tail = spot.tail(2)
    res = engine.rollout(PROMPTS, COUPLED, tail=tail, progress=False, harvest=True,
                         schedule=FailingSchedule(tmp_path, exit=True))
    assert res.tokens == ref
    _rerun_marked(res, {1: 0})
    assert res.idle.outcomes == [] and "drafter_train" not in set(res.timeline.steps["kind"])
    out = spot.merge(res, tail)
    assert out["drafter_steps"] == 0 and spot.version == 0
    served = spot.serving.head.state_dict()
    assert all(torch.equal(served[k], before[k]) for k in before)


def test_ray_a_worker_killed_in_the_drafter_job_leaves_the_published_drafter_serving(
        backend, model, tokenizer, tmp_path, monkeypatch):
    engine = RolloutEngine(model, tokenizer, backend=backend)
    spot = _ray_spot(model, tmp_path)
    before = copy.deepcopy(spot.serving.head.state_dict())
    # worker 1 finishes first and dies in its job: worker 0 is held at its first decode step
    # until that job has begun (tests/gates.py), an order no load can change
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()

    def lost(*args, **kw):
        job = LostJob(*args, **kw)
        job.marks = str(first)
        return job
    with monkeypatch.context() as patch:
        patch.setattr(drafter_job, "DrafterJob", lost)
        tail = spot.tail(2)
        res = engine.rollout(PROMPTS, COUPLED, schedule=HeldOn(0, first, "job-1"), tail=tail,
                             progress=False, harvest=True)
    out = spot.merge(res, tail)
    assert out["drafter_failed_workers"] == 1 and out["drafter_steps"] == 0
    assert spot.version == 0 and not (tmp_path / "head").exists()  # nothing published
    served = spot.serving.head.state_dict()
    assert all(torch.equal(served[k], before[k]) for k in before)
    assert res.timeline.steps.query("kind == 'failed'")["worker"].tolist() == [1]
    # the next step: the replaced actor trains a copy on its own policy, which the job
    # never carried; the copy is the one the same training gives here. Worker 0 is held
    # until the copy has taken both its steps (max_steps)
    jobs, real_job = [], drafter_job.DrafterTail.job
    monkeypatch.setattr(drafter_job.DrafterTail, "job",
                        lambda self, w, returned: Signalled.around(
                            jobs.append(real_job(self, w, returned)) or jobs[-1], second))
    # the replaced actor is up (on a loaded machine its start takes minutes) before worker 0's
    # gate starts waiting for its drafter steps
    backend.map(lambda worker, item: item, [0, 1])
    tail = spot.tail(2)
    res = engine.rollout(PROMPTS, COUPLED, schedule=HeldOn(0, second, "step-2"), tail=tail,
                         progress=False, harvest=True)
    out = spot.merge(res, tail)
    (job,) = jobs
    assert out["drafter_steps"] == 2 and out["drafter_failed_workers"] == 0 and spot.version == 1
    assert job.local is spot.eagle and b"LlamaForCausalLM" not in pickle.dumps(job)
    here = EagleTrainer(model, EagleHead(model), job.config)
    here.trainer.load_state_dict(copy.deepcopy(job.start))
    here.set_pairs(job.pairs)
    with here.training():
        for batch in range(2):
            here.step(job.start["step"] + batch)
    served, expected = spot.serving.head.state_dict(), here.head.state_dict()
    assert all(torch.allclose(served[k], expected[k], rtol=0, atol=1e-12) for k in served)
    assert not all(torch.equal(served[k], before[k]) for k in before)
