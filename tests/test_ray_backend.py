"""The Ray backend on the session's local 2-CPU Ray instance and actors (conftest.py): the same
tokens as the local backend on the wall clock, weights pushed to every actor through the object store, a
killed actor named with its requests and replaced, a learning schedule's copies absorbed, clear
errors before anything starts, and Ray on loopback only."""
import os
from pathlib import Path
import socket
import time


import pytest
import ray
import torch

from workbench.adapt import SpotConfig, SpotTrainer
from workbench.rollout import PlainSchedule, RayBackend, RolloutConfig, RolloutEngine, WorkerFailed
from workbench.rollout import ray_backend
from workbench.rollout.worker import WorkerTask
from workbench.speculative import AdaptiveSchedule, EagleDrafter, EagleHead, NGramDrafter

from .helpers.models import PROMPTS, tiny_model
from .gates import WAIT_S, HeldOn, Signalled, Together, signal
from .helpers.backends import SleepJob, Tail

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


def test_ray_rollouts_equal_the_local_backends_on_the_wall_clock(backend, models, tokenizer,
                                                                tmp_path):
    """The actors meet at their first decode step (``gates.Together``), so that they decode
    at once whatever else the machine runs (a loaded one could run one shard whole before
    the other actor gets a core); the tokens are plain decoding's."""
    old, _ = models
    engine = RolloutEngine(old, tokenizer, backend=backend)
    for n, config in enumerate((GREEDY, COUPLED)):
        (tmp_path / f"rollout{n}").mkdir()
        t = time.time()
        res = engine.rollout(PROMPTS, config, progress=False,
                             schedule=Together((0, 1), tmp_path / f"rollout{n}"))
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


def _check_tail_rows(timeline, runs_on: int, long: int):
    """The drafter rows of ``timeline`` (on worker ``runs_on``) begin while worker ``long``
    still decodes and none ends past the window's end (the long shard's last step) but a
    preempted one cut at it; the seconds of drafter work inside the tail."""
    steps = timeline.steps
    trained = steps[steps["kind"] == "drafter_train"]
    decoded = steps[(steps["kind"] != "drafter_train") & (steps["worker"] == long)]
    end = decoded["end_s"].max()
    assert set(trained["worker"]) == {runs_on} and len(trained) >= 2
    assert trained["start_s"].min() < decoded["end_s"].max()  # real overlap, on the wall clock
    assert trained["start_s"].min() >= steps[steps["worker"] == runs_on].query(
        "kind != 'drafter_train'")["end_s"].max()  # after its own shard
    cut = trained["preempted"].fillna(False).astype(bool)
    assert (trained.loc[~cut, "end_s"] <= end).all() and (trained.loc[cut, "end_s"] == end).all()
    assert cut.sum() <= 1 and timeline.makespan_s == end
    return float((trained["end_s"] - trained["start_s"]).sum())


def test_a_tail_job_runs_on_the_early_actor_while_the_long_shard_decodes(backend, models,
                                                                        tokenizer, tmp_path):
    """Actor 1 is held at its first decode step until the job on actor 0 has taken two steps
    (tests/gates.py): actor 0's shard comes back first, and its job runs while actor 1
    decodes, however loaded the machine."""
    old, _ = models
    engine = RolloutEngine(old, tokenizer, backend=backend)
    naps, nap_s = 10_000, 0.01
    tail = Tail(Signalled(SleepJob(naps, nap_s), tmp_path))
    res = engine.rollout(PROMPTS, GREEDY, schedule=HeldOn(1, tmp_path, "step-2"), tail=tail,
                         progress=False)
    assert res.tokens == _tokens(old, tokenizer, GREEDY)
    (window, returned), = tail.asked  # asked once: when worker 0's shard came back alone
    assert window.worker == 0 and returned == [0] and window.end_s == float("inf")
    run = res.idle
    assert [w.worker for w in run.windows] == [0] and run.windows[0].start_s == window.start_s
    assert run.windows[0].end_s == res.timeline.makespan_s  # closed at the long shard's end
    assert len(run.outcomes[0]["done"]) >= 2
    assert _check_tail_rows(res.timeline, runs_on=0, long=1) > 0
    # the step in flight at most, not the job's naps left (100 s of them)
    assert 0 < run.stop_wait_s < (naps - len(run.outcomes[0]["done"]) - 1) * nap_s


def test_the_drafter_trains_on_the_early_actor_while_the_long_shard_decodes(backend, models,
                                                                           tokenizer, tmp_path,
                                                                           monkeypatch):
    """issue 21: the spot trainer's copy starts on actor 0 as soon as its shard is back and
    stops when actor 1's is; the tokens are the local backend's (greedy and coupled); the one
    copy is the merge, published whole: it drafts, losslessly. The order is fixed by gates
    (tests/gates.py), not by naps a loaded machine can outrun: actor 1 is held at its first
    decode step until the copy has taken two whole steps, and the copy's third step stays in
    flight until the rollout is back, so the stop settles it at exactly two steps without
    waiting for the step in flight (a driver that waited would wait ``WAIT_S``)."""
    from workbench.adapt import drafter_job
    old, _ = models
    engine = RolloutEngine(old, tokenizer, backend=backend)
    torch.manual_seed(1)
    drafter = EagleDrafter(EagleHead(old).eval(), old)
    spot = SpotTrainer(old, drafter, SpotConfig.flat(batch_size=4, max_steps=400))
    real_job = drafter_job.DrafterTail.job
    for n, config in enumerate((GREEDY, COUPLED)):
        marks = tmp_path / f"rollout{n}"
        marks.mkdir()
        monkeypatch.setattr(drafter_job.DrafterTail, "job", lambda self, window, returned:
                            Signalled.around(real_job(self, window, returned), marks, hold=3))
        tail = spot.tail(2)
        res = engine.rollout(PROMPTS, config, tail=tail, progress=False, harvest=True,
                             schedule=HeldOn(1, marks, "step-2"))
        signal(marks, "release")  # the copy's third step may end now
        assert res.tokens == _tokens(old, tokenizer, config)
        inside = _check_tail_rows(res.timeline, runs_on=0, long=1)
        (trained,) = res.idle.outcomes
        out = spot.merge(res, tail)
        assert out["drafter_steps"] == len(trained.losses) == 2 and out["drafter_workers"] == 1
        assert out["drafter_train_s"] <= inside and out["drafter_overrun_s"] == 0
        assert 0 < out["drafter_stop_wait_s"] < WAIT_S  # the step in flight not waited for
        served = drafter.head.state_dict()  # one copy: the merge is that copy
        assert all(torch.equal(served[k], trained.state["model"][k]) for k in served)
    assert spot.version == 2
    sd = engine.rollout(PROMPTS, COUPLED, drafter=drafter, progress=False)
    assert sd.tokens == _tokens(old, tokenizer, COUPLED)
    assert sd.timeline.requests["drafted"].sum() > 0


def test_tlt_on_ray_trains_the_drafter_in_the_tail_with_the_local_tokens(backend, tokenizer):
    """``TLTTrainer.step`` on the actors: the drafter's jobs go into the rollout, the merge
    after it; the tokens are the local backend's, and no drafter step stretches a step."""
    from workbench.rl.tlt import first_divergence

    from .helpers.rl import tlt_trainer
    on_ray = tlt_trainer(tokenizer, "adaptive_drafter", backend=backend)
    here = tlt_trainer(tokenizer, "adaptive_drafter")
    hr, hl = on_ray.run(2, progress=False), here.run(2, progress=False)
    assert first_divergence(hl, hr) == -1
    assert (hr["drafter_overrun_s"] == 0).all() and (hr["drafter_stop_wait_s"] >= 0).all()
    assert hr["drafter_version"].tolist() == (hr["drafter_steps"] > 0).cumsum().tolist()
    assert on_ray.record.timelines[1].clock == "wall"


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


def test_a_plugin_arm_loaded_from_a_file_decodes_on_the_actors_as_on_the_local_backend(
        backend, models, tokenizer):
    """The worked arm plugin (tests/plugins/confident_chain.py), loaded from its file as a
    notebook's ``plugins`` loads it, in a schedule the actors get copies of: greedy and
    coupled, its chains give the local backend's tokens (plain decoding's), cut its own way
    (sure of nothing, one draft per step; sure of everything, the whole chain); the bandit's
    copies on the actors choose it, and the steps table and the driver's bandit name it like
    a built-in arm."""
    from workbench.plugins import load_plugins
    from workbench.speculative.arms import ARMS
    from workbench.speculative.bandit import parse_strategy

    from .helpers.speculative import Always
    load_plugins([str(Path(__file__).parent / "plugins" / "confident_chain.py")])
    try:
        old, _ = models
        engine = RolloutEngine(old, tokenizer, backend=backend)
        torch.manual_seed(0)
        drafter = EagleDrafter(EagleHead(old))  # travels with each rollout to the actors
        for config in (GREEDY, COUPLED):
            for p, per_step in ((1.0, 1), (1e-9, 3)):
                plan = parse_strategy(f"confident:k=3,p={p}")
                kw = dict(schedule=Always(plan), drafter=drafter, progress=False)
                on_ray = engine.rollout(PROMPTS, config, **kw)
                here = RolloutEngine(old, tokenizer).rollout(PROMPTS, config, **kw)
                assert on_ray.tokens == here.tokens == _tokens(old, tokenizer, config), p
                assert set(on_ray.timeline.requests["worker"]) == {0, 1}
                for r in on_ray.requests:
                    assert r.drafted == per_step * len(r.accepted_per_step) > 0, p
        # the bandit on the actors' copies: it weighs the plugin arm, and the driver's
        # schedule absorbs what each copy chose, under the arm's name
        arm = "confident:k=3,p=0.5"
        bandit = AdaptiveSchedule(["chain:k=2", arm], explore_budget=1.0, seed=1)
        res = engine.rollout(PROMPTS, COUPLED, schedule=bandit, drafter=drafter,
                             progress=False)
        assert res.tokens == _tokens(old, tokenizer, COUPLED)
        assert arm in set(res.timeline.steps["arm"].dropna())
        assert bandit.table().set_index("arm").loc[arm, "pulls"].sum() > 0
    finally:
        ARMS.unregister("confident")


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
    """Named by one connection attempt bounded by ``CONNECT_TIMEOUT_S`` (a few seconds),
    before Ray's own connect (which retries for a minute) is tried: checked on the calls
    made, not on a stopwatch that a loaded machine stretches."""
    from workbench import ray_cluster
    tries, real_connect = [], socket.create_connection

    def connect(address, timeout=None, *args, **kw):
        tries.append(timeout)
        return real_connect(address, timeout, *args, **kw)

    def init(*args, **kw):
        raise AssertionError("ray.init was called for an address that does not answer")
    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(ray_cluster.ray, "init", init)
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        free = f"127.0.0.1:{s.getsockname()[1]}"
    for address in (free, "127.0.0.1:1"):
        tries.clear()
        with pytest.raises(ConnectionError, match=f"no Ray cluster answers at '{address}'"):
            RayBackend(address=address).start(lambda w: 1 / 0)
        assert tries == [ray_cluster.CONNECT_TIMEOUT_S] and ray_cluster.CONNECT_TIMEOUT_S <= 5
    monkeypatch.setenv("RAY_ADDRESS", free)
    with pytest.raises(ConnectionError, match=free):
        RayBackend().start(lambda w: 1 / 0)
    with pytest.raises(ValueError, match=r"address must be None .* 'host:port' or "
                                         r"'ray://host:port', got 'nowhere'"):
        RayBackend(address="nowhere")
