"""Workers behind the backend protocol: start, map, weights, a rollout's tail jobs on each
worker's clock (preempted at the window's end, known at once or late), and how a failing
worker is reported."""
import copy
import math
import time

import pytest
import torch

from workbench.rollout import (LocalBackend, PlainSchedule, RolloutConfig, RolloutEngine,
                               StaticSchedule, WorkerFailed)
from workbench.rollout.timeline import IdleWindow
from workbench.rollout.idle import IdleClock, IdleJob, WindowEnd
from workbench.rollout.worker import StepRecorder, WorkerTask
from workbench.speculative import EagleDrafter, EagleHead

from .helpers.models import PROMPTS, tiny_model
from .helpers.backends import BrokenDrafter, SleepJob, Tail


def test_local_backend_starts_maps_updates_weights_and_closes(tokenizer):
    old, new = tiny_model("llama", tokenizer, seed=0), tiny_model("llama", tokenizer, seed=7)
    backend = LocalBackend()
    engine = RolloutEngine(old, tokenizer, backend=backend)
    engine.start(workers=2, policy_factory=lambda w: copy.deepcopy(old),
                 drafter_factory=lambda w, policy: EagleDrafter(EagleHead(policy), policy))
    models = backend.map(lambda worker, _: worker.model, [None, None])
    drafters = backend.map(lambda worker, _: worker.drafter, [None, None])
    assert models[0] is not models[1] and all(m is not old for m in models)
    assert drafters[0] is not drafters[1]  # each its own
    assert backend.map(lambda worker, x: (worker.index, x), [10, 20]) == [(0, 10), (1, 20)]
    cfg = RolloutConfig(max_new_tokens=24, workers=2)
    ref_old = RolloutEngine(old, tokenizer).rollout(PROMPTS, cfg, progress=False).tokens
    ref_new = RolloutEngine(new, tokenizer).rollout(PROMPTS, cfg, progress=False).tokens
    assert ref_old != ref_new
    assert engine.rollout(PROMPTS, cfg, progress=False).tokens == ref_old
    # the workers' own drafters serve a speculative schedule
    sd = engine.rollout(PROMPTS, cfg, schedule=StaticSchedule(2), progress=False)
    assert sd.tokens == ref_old and sd.timeline.requests["drafted"].sum() > 0
    head = EagleHead(new).state_dict()
    engine.update_weights(policy=new.state_dict(), drafter=head)
    assert engine.rollout(PROMPTS, cfg, progress=False).tokens == ref_new
    for drafter in drafters:
        for key, value in drafter.module.state_dict().items():
            assert torch.equal(value, head[key])
    with pytest.raises(ValueError, match="backend was started with 2 workers"):
        engine.rollout(PROMPTS, cfg, workers=3, progress=False)
    backend.close()
    assert backend.num_workers == 0


def test_a_policy_changed_in_place_reaches_workers_with_copies_at_the_next_rollout(tokenizer):
    """``policy_changed`` owes the workers that hold a copy the model's weights; the next
    rollout pays it first (``workers_behind_model`` says so), and once."""
    model, new = tiny_model("llama", tokenizer, seed=0), tiny_model("llama", tokenizer, seed=7)
    cfg = RolloutConfig(max_new_tokens=24, workers=2)
    ref_new = RolloutEngine(new, tokenizer).rollout(PROMPTS, cfg, progress=False).tokens
    backend = LocalBackend()
    engine = RolloutEngine(model, tokenizer, backend=backend)
    engine.start(workers=2, policy_factory=lambda w: copy.deepcopy(model))
    assert not engine.workers_behind_model  # built from the model as it is
    ref_old = engine.rollout(PROMPTS, cfg, progress=False).tokens
    assert ref_old != ref_new
    model.load_state_dict(new.state_dict())  # an update in place: the copies do not see it
    pushes = []
    real = backend.update_weights
    backend.update_weights = lambda policy=None, drafter=None: (
        pushes.append(policy is not None) or real(policy, drafter))
    engine.policy_changed()
    assert engine.workers_behind_model and pushes == []  # owed, not yet sent
    assert engine.rollout(PROMPTS, cfg, progress=False).tokens == ref_new
    assert not engine.workers_behind_model and pushes == [True]
    engine.rollout(PROMPTS, cfg, progress=False)
    assert pushes == [True]  # once
    shared = RolloutEngine(model, tokenizer)
    shared.start(2)  # workers sharing the model see it: nothing to send
    shared.policy_changed()
    shared.sync_policy()
    assert not shared.workers_behind_model


def test_workers_return_results_without_touching_the_requests_they_were_given(tokenizer):
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    engine.start(2)
    cfg = RolloutConfig(max_new_tokens=8)
    requests = engine.make_requests(engine.encode(PROMPTS[:4]), cfg)
    tasks = [WorkerTask(w, requests[w::2], cfg, engine.eos_id, engine.pad_id) for w in (0, 1)]
    seen = []  # the local backend's workers report progress live, at every step
    results = engine.backend.map(lambda worker, t: worker.rollout(t, PlainSchedule()), tasks,
                                 seen.append)
    assert sum(seen) == len(requests) and len(seen) > len(tasks)
    assert [r.uid for r in results[0].requests] == [q.uid for q in requests[0::2]]
    assert all(r.tokens and r.worker == res.worker for res in results for r in res.requests)
    assert {row["worker"] for row in results[1].steps} == {1}


def _two_worker_rollout(tokenizer):
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=0), tokenizer)
    return engine, engine.rollout(PROMPTS, max_new_tokens=40, workers=2, progress=False)


def test_a_rollouts_tail_jobs_run_after_each_workers_last_step_on_its_clock(tokenizer):
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=0), tokenizer)
    ref = engine.rollout(PROMPTS, max_new_tokens=40, workers=2, progress=False)
    tail = Tail(SleepJob(2, 0.0))
    res = engine.rollout(PROMPTS, max_new_tokens=40, workers=2, progress=False, tail=tail)
    assert res.tokens == ref.tokens
    steps = res.timeline.steps
    rollout = steps[steps["kind"] != "drafter_train"]
    last = rollout.groupby("worker")["end_s"].max()
    early = int(last.idxmin())
    (window, returned), = tail.asked  # the last to finish has no window: no job is asked for
    assert window.worker == early and window.start_s == last[early]
    assert window.end_s == last.max() and sorted(returned) == [0, 1]  # sim: every shard is back
    assert res.idle.windows == [window] and res.idle.stop_wait_s == 0
    assert res.idle.outcomes == [{"worker": early, "done": [0, 1], "cut": None}]
    new = steps[steps["kind"] == "drafter_train"]
    assert set(new["worker"]) == {early} and len(new) == 2
    assert new["start_s"].iloc[0] == window.start_s  # right after its shard, on its clock
    assert (new["batch_size"] == 3).all() and new["preempted"].isna().all()
    assert res.timeline.makespan_s == last.max()
    tl = res.timeline
    assert tl.wasted_fraction() < tl.idle_fraction()
    with pytest.raises(ValueError, match="already in the timeline"):
        tl.with_steps(new.to_dict("records"))


def test_a_finished_rollouts_windows_run_tail_jobs_after_the_fact(tokenizer):
    """``LocalBackend.run_idle``: the same jobs in the windows of a rollout that is over (the
    staleness observer's replay); a step that would cross its window is preempted at the
    window's end."""
    engine, res = _two_worker_rollout(tokenizer)
    window = res.timeline.idle_windows()[0]
    tail = Tail(SleepJob(1, window.seconds + 0.05))
    run = engine.backend.run_idle(tail, res.timeline, [res])
    assert tail.asked == [(window, [None])]  # the rollout's result, as the caller gave it
    out = run.outcomes[0]
    assert out["done"] == [] and out["cut"]["preempted"] is True
    assert out["cut"]["end_s"] == window.end_s and out["cut"]["forward_s"] > window.seconds
    tl = run.on(res.timeline)
    assert tl.makespan_s == res.timeline.makespan_s
    assert tl.wasted_fraction() == pytest.approx(tl.idle_fraction())  # its seconds are wasted


def test_bad_idle_input_is_refused_before_any_work(tokenizer):
    engine, res = _two_worker_rollout(tokenizer)

    class Training(IdleJob):
        def run(self, window, clock):
            return clock.timed("decode", lambda: None)
    with pytest.raises(ValueError, match=r"kind must be one of 'drafter_train', 'train', "
                                         r"got 'decode'"):
        engine.backend.run_idle(Tail(Training()), res.timeline, [res])
    fresh = LocalBackend()
    fresh.start(lambda w: tiny_model("llama", tokenizer), num_workers=2)
    with pytest.raises(ValueError, match=r"worker \d has no rollout to idle after"):
        fresh.run_idle(Tail(SleepJob(1, 0.0)), res.timeline, [res])
    fresh.start(lambda w: tiny_model("llama", tokenizer), num_workers=1)
    with pytest.raises(ValueError, match="a timeline of 2 workers for a backend of 1"):
        fresh.run_idle(Tail(SleepJob(1, 0.0)), res.timeline, [res])


def test_an_open_windows_steps_past_its_late_end_are_cut_and_undone(tokenizer):
    """Wall clock: the window's end arrives while the job runs (``WindowEnd.close``, the
    backend's stop). ``settle`` cuts the first step that ended past it, drops the ones after
    it, and says how many whole steps the job must undo; a step that began after the end
    leaves no row."""
    rec = StepRecorder(0, "wall")
    rec.timed("decode", lambda: time.sleep(0.01), 1, 1)
    window = IdleWindow(0, rec.mark, math.inf)
    end = WindowEnd()
    clock = IdleClock(rec, window, policy=None, end=end)
    assert clock.open and clock.fits(1e9)
    for _ in range(3):
        clock.timed("drafter_train", lambda: time.sleep(0.01))
    rows = clock.rows
    end.close(rows[0]["end_s"] + 0.001)  # late: the second step ended past it
    assert not clock.fits(0.0)
    assert clock.settle(undoable=4) == 2
    kept = clock.rows
    assert len(kept) == 2 and kept[0] == rows[0]
    assert kept[1]["preempted"] and kept[1]["end_s"] == end.end_s
    assert clock.wasted_s() == pytest.approx(end.end_s - rows[1]["start_s"])
    # a step that starts after the end (the stop not yet there) leaves no row at all
    late = IdleClock(rec, IdleWindow(0, rec.mark, math.inf), None, WindowEnd())
    late.end.close(rec.now() - 0.001)
    value, row = late.timed("drafter_train", lambda: 7)
    assert value == 7 and row["preempted"] and late.rows == [] and late.wasted_s() == 0


def test_a_failing_worker_is_named_with_its_cause_and_the_requests_it_held(tokenizer):
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    engine.start(2)
    cfg = RolloutConfig(max_new_tokens=8, workers=2)
    requests = engine.make_requests(engine.encode(PROMPTS), cfg)
    tasks = [WorkerTask(w, requests[w::2], cfg, engine.eos_id, engine.pad_id) for w in (0, 1)]
    held = [q.uid for q in requests[1::2]]  # worker 1's shard
    broken = BrokenDrafter(held[0])
    with pytest.raises(WorkerFailed, match="worker 1 failed: RuntimeError: out of memory") as e:
        engine.backend.map(lambda worker, task: worker.rollout(task, StaticSchedule(2), broken),
                           tasks)
    assert e.value.worker == 1 and isinstance(e.value.cause, RuntimeError)
    assert e.value.__cause__ is e.value.cause
    assert [q.uid for q in e.value.requests] == held and e.value.at_s > 0
    # worker 0 ran its shard to the end, and its result is kept for the caller
    assert e.value.failures == [e.value] and list(e.value.results) == [0]
    assert [r.uid for r in e.value.results[0].requests] == [q.uid for q in requests[0::2]]
    # the backend stays started: the next rollout runs
    assert engine.rollout(PROMPTS, cfg, progress=False).tokens
    with pytest.raises(WorkerFailed, match="worker 0 failed: ZeroDivisionError") as e:
        engine.backend.map(lambda worker, x: 1 / x, [0, 1])
    assert e.value.requests == []
    # bad input is a ValueError, not a worker's failure
    with pytest.raises(ValueError, match="worker 0 has no drafter"):
        engine.rollout(PROMPTS, cfg, schedule=StaticSchedule(2), progress=False)
    with pytest.raises(KeyboardInterrupt):  # an interrupt passes through as is
        engine.backend.map(lambda worker, x: (_ for _ in ()).throw(KeyboardInterrupt()), [0])
