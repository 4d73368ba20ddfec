"""The Ray backend on the session's local 2-CPU Ray instance and actors (conftest.py): the same
tokens as the local backend on the wall clock, weights pushed to every actor through the object store, a
killed actor named with its requests and replaced, a learning schedule's copies absorbed, clear
errors before anything starts, and Ray on loopback only."""
import os
import socket
import time

import pytest
import ray

from workbench.rollout import (PlainSchedule, RayBackend, RolloutConfig, RolloutEngine,
                               WorkerFailed)
from workbench.rollout import ray_backend
from workbench.rollout.worker import WorkerTask
from workbench.speculative import AdaptiveSchedule, EagleHead, NGramDrafter

from .conftest import PROMPTS, tiny_model
from .test_worker_backend import SleepJob

GREEDY = RolloutConfig(max_new_tokens=24, workers=2)
COUPLED = RolloutConfig(max_new_tokens=24, workers=2, temperature=1.0, seed=3)


@pytest.fixture(scope="module")
def models(tokenizer):
    return tiny_model("llama", tokenizer, seed=0), tiny_model("llama", tokenizer, seed=7)


@pytest.fixture(scope="module")
def backend(ray_actors, models):
    """The session's 2 actors (conftest.py), each with its own copy of the old policy and its
    own EAGLE drafter; the old policy's weights sent again, whatever ran before."""
    backend = ray_actors.backend()
    backend.update_weights(policy=models[0].state_dict())
    return backend


def _tokens(model, tokenizer, config, **kw):
    return RolloutEngine(model, tokenizer).rollout(PROMPTS, config, progress=False, **kw).tokens


def test_ray_rollouts_equal_the_local_backends_on_the_wall_clock(backend, models, tokenizer):
    old, _ = models
    engine = RolloutEngine(old, tokenizer, backend=backend)
    for config in (GREEDY, COUPLED):
        t = time.time()
        res = engine.rollout(PROMPTS, config, progress=False)
        wall = time.time() - t
        assert res.tokens == _tokens(old, tokenizer, config)
        tl = res.timeline
        assert tl.clock == "wall" and set(tl.steps["clock"]) == {"wall"}
        assert set(tl.steps["worker"]) == {0, 1} and 0 < tl.makespan_s < wall
        spans = tl.steps.groupby("worker").agg(start=("start_s", "min"), end=("end_s", "max"))
        assert (spans["start"] > 0).all()  # each actor's wait before its first step shows
        assert spans["start"].max() < spans["end"].min()  # the two actors ran at once
    sd = engine.rollout(PROMPTS, COUPLED, drafter=NGramDrafter(), progress=False)
    assert sd.tokens == _tokens(old, tokenizer, COUPLED)  # the drafter travels with fn
    assert sd.timeline.requests["drafted"].sum() > 0


def test_map_reports_progress_per_worker_on_the_driver(backend, models, tokenizer):
    engine = RolloutEngine(models[0], tokenizer, backend=backend)
    requests = engine.make_requests(engine.encode(PROMPTS[:6]), GREEDY)
    tasks = [WorkerTask(w, requests[w::2], GREEDY, engine.eos_id, engine.pad_id) for w in (0, 1)]
    seen = []
    results = backend.map(lambda worker, task: worker.rollout(task, PlainSchedule()), tasks,
                          seen.append)
    assert sorted(seen) == [3, 3] and [r.worker for r in results] == [0, 1]


def test_an_exception_in_fn_is_the_workers_failure_and_bad_input_passes(backend):
    with pytest.raises(WorkerFailed, match="worker 0 failed: ZeroDivisionError") as e:
        backend.map(lambda worker, x: 1 / x, [0, 1])
    assert isinstance(e.value.cause, ZeroDivisionError) and e.value.requests == []

    def refuse(worker, x):
        if worker.index == 1:
            raise ValueError(f"bad plan on worker {worker.index}")
    with pytest.raises(ValueError, match="bad plan on worker 1"):
        backend.map(refuse, [None, None])
    assert backend.map(lambda worker, x: (worker.index, x), [10, 20]) == [(0, 10), (1, 20)]


def test_idle_jobs_run_on_each_windows_actor_with_the_local_idle_clock(backend, models, tokenizer):
    engine = RolloutEngine(models[0], tokenizer, backend=backend)
    res = engine.rollout(PROMPTS, max_new_tokens=40, workers=2, progress=False)
    windows = res.timeline.idle_windows()
    early, last = windows
    assert early.seconds > 0 and last.seconds == 0
    job = SleepJob(2, 0.0)
    run = backend.run_idle(job, res.timeline, windows)
    assert [o["worker"] for o in run.outcomes] == [early.worker, last.worker]
    assert run.outcomes[0]["done"] == [0, 1]  # the same IdleClock as the local backend's:
    assert run.outcomes[1]["cut"]["preempted"]  # the last to finish has no time to spare
    new = run.timeline.steps[run.timeline.steps["kind"] == "drafter_train"]
    first = new.groupby("worker")["start_s"].min()
    assert all(first[w.worker] == w.start_s for w in windows)  # right after its last step
    assert run.timeline.makespan_s == res.timeline.makespan_s
    with pytest.raises(ValueError, match=r"IdleWindows of workers 0\.\.1"):
        backend.run_idle(job, res.timeline, ["not a window"])


def test_a_learning_schedule_learns_what_every_actors_copy_saw(backend, models, tokenizer):
    """ray_backend's docstring, "copies": each actor plans with a copy of the schedule; the
    engine replays the decisions the steps table brought back (``AdaptiveSchedule.absorb``),
    so the driver's bandit holds every actor's pulls; the tokens are the local backend's."""
    old, _ = models
    engine = RolloutEngine(old, tokenizer, backend=backend)
    on_ray = AdaptiveSchedule(["chain:k=2"], seed=1)
    res = engine.rollout(PROMPTS, GREEDY, drafter=NGramDrafter(), schedule=on_ray,
                         progress=False)
    assert res.tokens == _tokens(old, tokenizer, GREEDY)
    decided = res.timeline.steps.dropna(subset=["arm"])
    assert set(decided["worker"]) == {0, 1}  # what each actor's copy chose is recorded
    learned = on_ray.table()
    assert learned["pulls"].sum() == decided.groupby(["worker", "decision"]).ngroups
    assert not on_ray.learned().empty


def test_weights_reach_every_actor_once_through_the_object_store_and_survive_a_restart(
        backend, models, tokenizer, monkeypatch):
    old, new = models
    engine = RolloutEngine(old, tokenizer, backend=backend)
    ref_old, ref_new = _tokens(old, tokenizer, GREEDY), _tokens(new, tokenizer, GREEDY)
    assert ref_old != ref_new
    assert engine.rollout(PROMPTS, GREEDY, progress=False).tokens == ref_old
    head = EagleHead(new).state_dict()
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray_backend.ray, "put", lambda value: puts.append(1) or real_put(value))
    engine.update_weights(policy=new.state_dict(), drafter=head)
    assert len(puts) == 2  # one object per state dict, whatever the number of actors
    monkeypatch.undo()
    assert engine.rollout(PROMPTS, GREEDY, progress=False).tokens == ref_new
    heads = backend.map(lambda worker, _: worker.drafter.module.state_dict(), [None, None])
    assert all((h[k] == v).all() for h in heads for k, v in head.items())
    # worker 1's actor dies mid-map: named, with the requests it held; the other finishes
    requests = engine.make_requests(engine.encode(PROMPTS), GREEDY)
    tasks = [WorkerTask(w, requests[w::2], GREEDY, engine.eos_id, engine.pad_id) for w in (0, 1)]

    def die_on_1(worker, task):
        if worker.index == 1:
            os._exit(1)
        return worker.rollout(task, PlainSchedule())
    with pytest.raises(WorkerFailed, match="worker 1 failed") as e:
        backend.map(die_on_1, tasks)
    assert e.value.worker == 1 and isinstance(e.value.cause, ray.exceptions.RayActorError)
    assert [q.uid for q in e.value.requests] == [q.uid for q in requests[1::2]]
    assert list(e.value.results) == [0]  # worker 0's shard came back all the same
    # the dead actor was replaced at once, the latest weights queued: the next call finds it
    res = engine.rollout(PROMPTS, GREEDY, progress=False)
    assert res.tokens == ref_new and "failed" not in set(res.timeline.steps["kind"])
    assert set(res.timeline.requests["worker"]) == {0, 1}
    backend.restart(1)  # the start's factories, then the latest weights, waited for
    assert engine.rollout(PROMPTS, GREEDY, progress=False).tokens == ref_new


def test_too_few_cpus_are_refused_before_any_actor_starts(backend, models):
    with pytest.raises(ValueError, match=r"num_workers=3 x threads_per_worker=1 need 3 CPUs, "
                                         r"but the local Ray instance has 2"):
        backend.start(lambda w: models[0], num_workers=3)
    assert backend.num_workers == 2  # the running actors were left alone
    wide = RayBackend(threads_per_worker=2)
    with pytest.raises(ValueError, match="need 4 CPUs"):
        wide.start(lambda w: models[0], num_workers=2)
    assert wide.num_workers == 0


def test_ray_listens_on_loopback_only_and_logs_in_the_run_folder(backend, local_ray):
    assert backend.num_workers == 2  # Ray is up
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    assert len(str(local_ray)) > 60
    assert (local_ray / "session_latest" / "logs" / "raylet.out").exists()


def test_close_undoes_only_the_ray_init_that_the_backend_made(backend, models, monkeypatch):
    shutdowns = []
    monkeypatch.setattr(ray_backend.ray, "shutdown", lambda: shutdowns.append(1))
    for started_ray in (False, True):  # found the session's Ray running / started one
        if started_ray:
            monkeypatch.setattr(ray_backend, "connect", lambda *args: True)
        other = RayBackend()
        with pytest.raises(ValueError, match="need 3 CPUs"):  # connected, then refused
            other.start(lambda w: models[0], num_workers=3)
        other.close()
        assert shutdowns == [1] * started_ray
    assert backend.num_workers == 2


def test_an_address_that_cannot_be_reached_is_named_within_seconds(monkeypatch):
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        free = f"127.0.0.1:{s.getsockname()[1]}"
    for address in (free, "127.0.0.1:1"):
        t = time.monotonic()
        with pytest.raises(ConnectionError, match=f"no Ray cluster answers at '{address}'"):
            RayBackend(address=address).start(lambda w: 1 / 0)
        assert time.monotonic() - t < 5
    monkeypatch.setenv("RAY_ADDRESS", free)
    with pytest.raises(ConnectionError, match=free):
        RayBackend().start(lambda w: 1 / 0)
    with pytest.raises(ValueError, match=r"address must be None .* 'host:port' or "
                                         r"'ray://host:port', got 'nowhere'"):
        RayBackend(address="nowhere")
