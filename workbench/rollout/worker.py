"""Workers: who decodes each shard of a rollout step, on its own clock.

A :class:`Worker` owns its policy (and its forward), its own drafter, and the step recorder of
its latest rollout. It is pure in what it returns: it receives a :class:`WorkerTask` (the
requests, the config, the token ids it needs) and gives back a :class:`WorkerResult` (its
requests' outputs and its steps-table rows); the engine reassembles results by uid. Its
recorder stays open after the last decode step, so that an idle-window job
(:meth:`Worker.run_idle`) adds rows on the same clock: on the sim clock right after the
worker's last step, on the wall clock at their real times. The window's end is a
:class:`WindowEnd`: known when the job starts (sim: every shard has run), or set later, while
the job runs, by the backend's stop (wall: the job starts while other workers still decode).

Workers are a backend's to hold (``rollout.backend``): callers above the rollout layer reach
them only through the backend's methods, never directly.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..clock import cpu_share, seconds_reader, usage_probe
from .config import RolloutConfig
from .decoder import BatchDecoder
from .forward import policy_forward
from .idle import IdleClock, WindowEnd
from .plan import check_schedule_drafter
from .request import Request, RequestOutput
from .schedule import Schedule, StepReport, checked_reasons, plan_columns
from .timeline import IdleWindow, rollout_end_s

__all__ = ["WorkerTask", "WorkerResult", "Worker", "WorkerRun", "StepRecorder"]


class StepRecorder:
    """A worker's clock and its steps-table rows; each step starts where the last one ended.

    Time 0 is the recorder's creation, or ``origin`` when a backend gives one: a wall time
    (``time.time()``) common to all workers of a step, such as the driver's at submit, so
    that workers in other processes share one timeline and the first step starts when the
    worker really began (the wait before it shows as idle). Seconds are read by ``read``
    (``workbench.clock``: on the sim clock this thread's CPU time, which other processes on
    the machine do not stretch; on the wall clock the time that passed). Each row records the
    ``cpu_share`` its step got (``workbench.clock.cpu_share``, read by ``usage``: a test
    passes a double), so that a disturbed step says so."""

    def __init__(self, worker: int, clock: str, origin: float | None = None,
                 usage: Callable[[], tuple[float, float]] | None = None):
        self.worker, self.clock = worker, clock
        self.read = seconds_reader(clock)
        self.usage = usage if usage is not None else usage_probe(clock)
        ahead = 0.0 if origin is None else time.time() - origin
        self.t0 = self.read() - ahead
        self.used = self.usage()  # the usage reading where the next step starts
        self.rows: list[dict] = []
        self.start_s = self.mark = ahead
        self.origin = origin  # the wall time that is 0 here, where the backend gave one
        self.decisions = 0  # decode steps labelled so far

    def now(self) -> float:
        return self.read() - self.t0

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass on this clock without work (a drafter slowed on purpose):
        slept on the wall clock, charged on the sim clock (the clock moves on at once; its
        CPU time would not see a sleep: ``workbench.clock``)."""
        if self.clock == "wall":
            time.sleep(seconds)
        else:
            self.t0 -= seconds

    def begin(self) -> float:
        """Start of the next step: the end of the previous one (for the first, the
        recorder's start: 0, or the seconds since ``origin``)."""
        return self.mark

    def end(self, kind: str, batch_size: int, tokens: int, forward_s: float) -> float:
        end, used = self.now(), self.usage()
        self.rows.append({"worker": self.worker, "step": len(self.rows), "kind": kind,
                          "start_s": self.mark, "end_s": end, "batch_size": batch_size,
                          "tokens": tokens, "forward_s": forward_s, "clock": self.clock,
                          "cpu_share": cpu_share(self.used, used)})
        self.mark, self.used = end, used
        return end

    def preempt(self, i: int, end_s: float) -> None:
        """Step ``i`` preempted at ``end_s`` (an idle window's end): its row ends there,
        flagged ``preempted``; the rows after it go, and so does its own when it began at or
        after the end (a wall-clock step started before the stop arrived), so that no row
        lies past the end; the next step starts where the rows now end."""
        rows = self.rows
        rows[i].update(end_s=max(end_s, rows[i]["start_s"]), preempted=True)
        del rows[i + (rows[i]["start_s"] < end_s):]
        self.mark = rows[-1]["end_s"] if rows else end_s

    def label(self, first: int, report: StepReport, decision: dict) -> None:
        """Write the plan of the decode step whose rows start at ``rows[first]`` (what it did:
        ``report``), and the schedule's ``decision`` columns, onto those rows (timeline.py,
        the steps schema)."""
        columns = {**plan_columns(report.plan, self.decisions, report.drafter), **decision}
        for row in self.rows[first:]:
            if row["kind"] != "compile":  # a graph compiled first is no part of the plan
                row.update(columns)
        self.decisions += 1

    def resume(self, after_s: float) -> None:
        """Go on recording more work of the same step (a re-run of a lost worker's requests),
        from ``after_s`` at the earliest: on the sim clock the work is charged where it would
        have run, right after the last step; on the wall clock the time since the last step
        really passed, and shows as idle."""
        start = max(self.now() if self.clock == "wall" else self.mark, after_s)
        self.t0 = self.read() - start
        self.mark, self.used = start, self.usage()

    def timed(self, kind: str, fn: Callable, batch_size: int = 0, tokens: int = 0):
        """Run ``fn()`` as the worker's next step of ``kind``; its value. The step starts
        where the last one ended: work done later in the same rollout step (after the
        worker's last decode step, in its idle window) is charged where it would have run
        (a wall-clock caller :meth:`resume` s first, to record it at its real time)."""
        self.t0 = self.read() - self.mark  # the clock resumes at the last mark
        self.used = self.usage()
        start = self.now()
        out = fn()
        self.end(kind, batch_size, tokens, self.now() - start)
        return out


@dataclass
class WorkerTask:
    """Everything a worker needs for its shard of one rollout step. ``harvest``: keep the
    policy's states of every request (``RolloutEngine.rollout``). ``after_s`` set: a re-run
    of a lost worker's requests (``rollout.recovery``), recorded on the clock of the worker's
    latest rollout from ``after_s`` at the earliest, its steps flagged ``rerun``."""

    worker: int
    requests: list[Request]
    config: RolloutConfig
    eos_id: int | None
    pad_id: int
    after_s: float | None = None
    harvest: bool = False
    request_steps: bool = False  # keep a row per request per step (rollout.request_steps)


@dataclass
class WorkerResult:
    """What a worker gives back: its requests' outputs, its steps-table rows, its
    request-steps rows (None unless asked) and its clock's wall-time origin (None: its own)."""

    worker: int
    requests: list[RequestOutput]
    steps: list[dict]
    request_steps: list[tuple] | None = None
    origin_s: float | None = None


def _ignore(finished: int) -> None:
    """The progress hook of a worker whose driver is in another process."""


class Worker:
    """One worker: a policy, its own drafter (optional), and the recorder of its last rollout.

    Two attributes are its backend's to set before a call: ``origin``, the wall time that is
    0 on the next rollout's clock (``None``: the rollout's own start, as on the sim clock),
    and ``on_finish``, called with the number of requests that finished at each step (the
    driver's progress bar, where the worker lives in the driver's process)."""

    def __init__(self, index: int, model, drafter=None, clock: str = "sim"):
        self.index, self.model, self.drafter, self.clock = index, model, drafter, clock
        self.forward = policy_forward(model)
        self.recorder: StepRecorder | None = None
        self._idle: tuple | None = None  # (job, clock) of the idle job running now
        self.origin: float | None = None
        self.on_finish: Callable[[int], None] = _ignore

    def rollout(self, task: WorkerTask, schedule: Schedule, drafter=None) -> WorkerResult:
        """Decode ``task.requests`` under ``schedule`` (with ``drafter``, or this worker's own)."""
        run = self.begin(task, schedule, drafter)
        with torch.inference_mode():  # no autograd bookkeeping at all: ~10% of a small step
            while run.busy:
                run.advance()
        return run.result()

    def begin(self, task: WorkerTask, schedule: Schedule, drafter=None) -> "WorkerRun":
        """``task``'s rollout, not yet stepped: a :class:`WorkerRun` that a caller advances
        one step at a time (``rollout`` runs it to the end; the local backend's
        ``map_steps`` advances several workers' runs in sim-time order)."""
        drafter = drafter if drafter is not None else self.drafter
        if schedule.needs_drafter and drafter is None:
            raise ValueError(f"the schedule {type(schedule).__name__} speculates, but worker "
                             f"{self.index} has no drafter: pass drafter= or start the "
                             "workers with a drafter_factory")
        check_schedule_drafter(schedule, drafter)  # trees need a tree drafter; names, members
        return WorkerRun(self, task, schedule, drafter)

    def _recorder_for(self, task: WorkerTask) -> StepRecorder:
        """A new recorder for a rollout; the latest one, resumed, for a re-run."""
        if task.after_s is None:
            self.recorder = StepRecorder(self.index, self.clock, self.origin)
        elif self.recorder is None:
            raise ValueError(f"worker {self.index} has no rollout to re-run requests after: "
                             "a re-run goes to a worker that finished its shard")
        else:
            self.recorder.resume(task.after_s)
        return self.recorder

    @staticmethod
    def refill_due(cfg: RolloutConfig, cap: int, live: int, waiting: int) -> bool:
        """Whether waiting requests join now: waves when the batch is empty; continuous
        batching once ``cfg.refill_for(cap)`` slots are free (or all that wait fit)."""
        if live == 0:
            return True
        return cfg.batching == "continuous" and cap - live >= min(cfg.refill_for(cap), waiting)

    def _step(self, dec: BatchDecoder, schedule: Schedule) -> None:
        decision = schedule.decide(dec.size, self.index)
        plan = decision.plan
        if plan.speculative and dec.drafter is None:
            raise ValueError(f"the schedule planned {plan} but declares needs_drafter=False")
        first = len(dec.rec.rows)
        report = replace(dec.step(plan, self.index), decision=decision)
        dec.rec.label(first, report, checked_reasons(schedule, decision))
        schedule.observe(report)

    @property
    def rollout_end_s(self) -> float | None:
        """Where this worker's idle window starts after its latest rollout, on the step's
        clock (``timeline.rollout_end_s`` of its rows; where the rollout started, for one
        with no step); ``None`` before a rollout."""
        if self.recorder is None:
            return None
        return rollout_end_s(self.recorder.rows, self.recorder.start_s)

    def run_idle(self, job, window: IdleWindow,
                 end: "WindowEnd | None" = None) -> tuple[object, list[dict]]:
        """Run ``job`` (``rollout.idle.IdleJob``) in ``window``, this worker's idle window
        after its latest rollout, which ends at ``end`` (default: ``window.end_s``, known
        now); ``(the job's outcome, the steps rows it recorded)``."""
        if window.worker != self.index:
            raise ValueError(f"worker {self.index} was given worker {window.worker}'s window")
        if self.recorder is None:
            raise ValueError(f"worker {self.index} has no rollout to idle after: run one first")
        clock = IdleClock(self.recorder, window, self.model, end)
        self._idle = (job, clock)
        try:
            outcome = job.run(window, clock)
        finally:
            self._idle = None
        return outcome, clock.rows

    def idle_at(self, end_s: float) -> tuple[object, list[dict]] | None:
        """What the idle job running now (from another thread) did by ``end_s``, its
        window's end: ``(its outcome, its rows)`` (``IdleJob.settled``, ``IdleClock.rows_at``)
        without waiting for its step in flight; None when no job runs, or the job cannot
        say (then its run's own return is the answer)."""
        running = self._idle
        if running is None:
            return None
        job, clock = running
        rows = clock.rows_at(end_s)
        outcome = job.settled(rows)
        return None if outcome is None else (outcome, rows)

    def load_weights(self, policy: dict | None = None, drafter: dict | None = None) -> None:
        """Load new policy and/or drafter weights (state dicts) into this worker's modules."""
        if policy is not None:
            self.model.load_state_dict(policy)
        if drafter is not None:
            if self.drafter is None or self.drafter.module is None:
                raise ValueError(f"worker {self.index} has no drafter with weights to update")
            self.drafter.module.load_state_dict(drafter)


class WorkerRun:
    """One worker's rollout of one task, advanced one step at a time (``Worker.begin``): the
    run a dispatch moves work between (``rollout.dispatch.Run``, where each member is said).
    ``queue`` holds the requests not yet admitted (``RequestOutput``s, admitted from the
    front), ``outputs`` every request the run answers for. Requests that move keep their
    uid, so coupled draws give them the tokens they would have had where they were."""

    def __init__(self, worker: Worker, task: WorkerTask, schedule: Schedule, drafter):
        self.worker, self.task, self.schedule = worker, task, schedule
        cfg = task.config
        self.rec = worker._recorder_for(task)
        self.first = len(self.rec.rows)
        self.outputs = [RequestOutput.of(q, worker.index) for q in task.requests]
        self.dec = BatchDecoder(worker.forward, cfg, self.rec, task.eos_id, task.pad_id,
                                drafter if schedule.needs_drafter else None, worker.on_finish,
                                harvest=task.harvest, request_steps=task.request_steps)
        self.cap = cfg.max_batch_size or max(1, len(self.outputs))
        self.queue: deque[RequestOutput] = deque(self.outputs)
        self.moved: dict[int, tuple] = {}  # uid -> (from worker, harvested states), to admit

    @property
    def index(self) -> int:
        return self.worker.index

    @property
    def clock_s(self) -> float:
        """Where this run's next step starts on its worker's clock."""
        return self.rec.mark

    @property
    def busy(self) -> bool:
        """Whether the run holds requests: queued or in its batch."""
        return bool(self.queue) or self.dec.size > 0

    @property
    def running(self) -> list[RequestOutput]:
        """The requests in the batch now."""
        return [self.dec.reqs[i] for i in self.dec.batch.request_ids]

    rows = property(lambda self: self.rec.rows[self.first:])  # this rollout's steps rows
    admitted = property(lambda self: list(self.dec.reqs))  # every request prefilled here

    def order_queue(self, requests: list[RequestOutput]) -> None:
        if sorted(r.uid for r in requests) != sorted(r.uid for r in self.queue):
            raise ValueError(f"order_queue takes worker {self.index}'s queued requests, "
                             f"{[r.uid for r in self.queue]}; got {[r.uid for r in requests]}")
        self.queue = deque(requests)

    def refill_due(self, waiting: int | None = None) -> bool:
        """Whether ``waiting`` requests (default: the queue's) would join at the next step."""
        waiting = len(self.queue) if waiting is None else waiting
        return waiting > 0 and Worker.refill_due(self.task.config, self.cap, self.dec.size,
                                                 waiting)

    def advance(self, resume: bool = False) -> None:
        """One step: the queue's front joins the batch when a refill is due (prefilled),
        then one decode step. ``resume``: the clock resumes at its mark first (sim: others
        ran in this thread since; wall: the step starts now, the wait shows as idle)."""
        if resume:
            self.rec.resume(self.rec.mark)
        queue, dec = self.queue, self.dec
        if queue and self.refill_due():
            joining = [queue.popleft()
                       for _ in range(min(max(1, self.cap - dec.size), len(queue)))]
            moved = {r.uid: self.moved.pop(r.uid) for r in joining if r.uid in self.moved}
            dec.admit(joining, moved)
        if dec.size:
            self.worker._step(dec, self.schedule)

    def take_queued(self, uids) -> list[RequestOutput]:
        """Take the queued requests ``uids`` off this run (to queue them on another)."""
        uids = set(uids)
        taken = [r for r in self.queue if r.uid in uids]
        self.queue = deque(r for r in self.queue if r.uid not in uids)
        self.outputs = [r for r in self.outputs if r.uid not in uids]
        return taken

    def give_queued(self, requests: list[RequestOutput], front: bool = False) -> None:
        """Queue ``requests`` here (another run's, :meth:`take_queued`)."""
        for r in requests:
            r.worker = self.index
        self.outputs.extend(requests)
        self.queue = deque(requests) + self.queue if front else self.queue + deque(requests)

    def release(self, uids) -> list[tuple]:
        """Take the running requests ``uids`` out of this run's batch: ``[(request, its
        harvested states)]`` for another run's :meth:`receive`."""
        out = self.dec.release(uids)
        gone = {r.uid for r, _ in out}
        self.outputs = [r for r in self.outputs if r.uid not in gone]
        return out

    def receive(self, released: list[tuple], source: int, at_s: float) -> None:
        """Requests another run released (``source``'s, at ``at_s`` on its clock), queued
        first: their re-prefill is this run's next step, from ``at_s`` at the earliest."""
        self.wait_until(at_s)
        for r, harvested in released:
            self.moved[r.uid] = (source, harvested)
        self.give_queued([r for r, _ in released], front=True)

    def wait_until(self, at_s: float) -> None:
        """The next step starts at ``at_s`` at the earliest (the time between shows as idle);
        a run that never steps again keeps its end, its rows'."""
        if at_s > self.rec.mark:
            self.rec.mark = at_s

    def held(self) -> list[Request]:
        """Every request this run answers for, as drawn: what a lost worker takes with it
        (a run's outputs come back only with its :meth:`result`)."""
        return [Request(r.uid, r.prompt_id, r.sample_idx, tuple(r.prompt_ids),
                        r.max_new_tokens) for r in self.outputs]

    def result(self) -> WorkerResult:
        """The run's result, once it is not :attr:`busy`."""
        self.dec.finish()
        rows = self.rec.rows[self.first:]
        if self.task.after_s is not None:
            for row in rows:
                row["rerun"] = True
        return WorkerResult(self.index, self.outputs, rows, self.dec.request_rows,
                            self.rec.origin)
