"""Backends: the one door between the callers of a rollout and the workers that run it.

A backend holds N workers (``rollout.worker``), each with its own policy, forward and drafter,
and is all that the engine, GRPO, TLT and the spot trainer see of them. Its protocol,
:class:`Backend`, has five jobs: start the workers from factories, map a function over them,
map a rollout whose workers each run an *idle-window job* once their shard is done
(``map_tail``), push new weights to them, and close. Nothing above the rollout layer reads a
worker, its recorder or its clock.

Glossary:

clock        ``"sim"``: each worker's measured time laid side by side, as if the workers ran
             in parallel (the local backend runs them one after another in this process);
             ``"wall"``: the workers really run in parallel (a backend of processes or Ray
             actors). Never mix the two in one comparison.
idle window  a worker's time from its last rollout step to the end of the step's last one on
             any worker (``Timeline.idle_windows()``, ``IdleWindow``).
tail jobs    what ``map_tail(fn, items, tail)`` runs in the idle windows of its map: an object
             with ``job(window, returned) -> IdleJob | None`` (:class:`TailJobs`). As each
             worker's value comes back, the backend asks it for that worker's job (``window``
             starts at the worker's last step, its end not yet known on the wall clock;
             ``returned``: the values that came back so far, that worker's included) and runs
             the job on that worker. When the map's last value comes back, the window closes
             at that worker's last step: the jobs still running stop there, and the backend
             hands back their outcomes (:class:`IdleRun`). *Sim*: every shard has run before
             any job starts, so ``returned`` holds every value and each window's end is known
             from the start; the jobs run after the map, one after another, each charged
             right after its worker's last step. *Wall*: a job starts on its worker as soon
             as its shard is back, while the others still decode, and the driver's stop
             reaches it from beside the work and hands back at once what the job did by the
             window's end (``IdleJob.settled``): the one step in flight finishes beside the
             driver's next work (the policy update), cut at the end, its work discarded. A
             job that cannot say so is waited for; the waiting is ``stop_wait_s``.
             A map that loses a worker runs no job to its end: the local backend runs none,
             Ray stops those already running and drops their outcomes (the survivors' actors
             must be free to re-run the lost shard, and a step that lost a worker is rare
             enough that its drafter steps are not worth a second rule).
idle job     an object with ``run(window, clock) -> outcome`` (:class:`IdleJob`), run once on
             its window's worker with an ``IdleClock``: ``clock.fits(seconds)`` says whether
             a step that long still ends inside the window; ``clock.timed(kind, fn,
             batch_size) -> (value, row)`` runs one step on the worker's clock (sim: right
             after its last step; wall: at its real time), preempted at the window's end (the
             row flagged ``preempted``; the job discards that step's work);
             ``clock.settle(undoable)`` waits for an open window's end and says how many of
             the job's latest steps ended past it (to discard); ``clock.policy`` is that
             worker's policy, for a job that needs one (the drafter's training builds its
             trainer on it: a job never ships a policy of its own). Whatever the caller needs
             comes back in the outcome (losses, new weights, ...): a backend of processes
             runs a *copy* of the job, so changes the job makes to itself are not seen by the
             caller. The local backend runs the caller's object.
progress     ``map(fn, items, progress)``: a callback of the driver's (a progress bar's
             ``update``) that takes a number of finished requests. It never leaves the
             driver's process: the local backend hands it to its workers (live, as requests
             finish); a backend of processes calls it as each worker's result comes back,
             with the number of requests that worker's item held.
worker fault a worker that raised while running a function or a job, or died. Every worker of
             the call runs its part to the end whatever another does; then ``map`` (and
             ``map_tail``, ``start``, ``update_weights``) raises :class:`WorkerFailed` for the
             lowest failed worker (its index, the cause, the requests it held, the seconds
             until it failed), from the cause, holding every failure of the call
             (``failures``) and the values of the workers that finished (``results``), so
             that a caller re-runs only what was lost (``rollout.recovery``). A lost idle job
             does not raise: its outcome is ``None``, its failure is in ``IdleRun.failed``,
             and a ``failed`` row marks it in the timeline (idle work is optional, like a
             preempted step); nor does a worker lost in ``map_steps``, whose share the
             survivors re-run inside the call (its value is its failure). The backend stays
             started: the caller may resubmit the requests
             elsewhere or start the backend again. Two kinds of exception pass through as
             they are: a ``ValueError`` is bad input (a plan the drafter cannot serve, a
             schedule's bad decision), the caller's to fix, which any worker would raise
             alike; and an interrupt (``KeyboardInterrupt``), which is not the worker's doing.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from ..checks import check_int
from ..clock import sim_work
from .request import Request, RequestOutput
from .timeline import IdleWindow, Timeline
from .failures import WorkerFailed, first_failure
from .idle import IdleRun, TailJobs
from .worker import Worker

__all__ = ["Backend", "LocalBackend", "check_capacity"]


class Backend:
    """N workers behind one interface (module docstring): a backend subclasses it and
    defines every method below but :meth:`check_fits`, which has a default. A worker that
    fails makes any method that ran on it raise :class:`WorkerFailed`."""

    name: str
    clock: str  # "sim" or "wall": the clock the workers' times are on
    runs_copies: bool  # the workers run copies of fn, its closure and jobs (processes, actors)
    dispatches = False  # map_steps moves work between its workers (a Dispatch; local, Ray)

    @property
    def num_workers(self) -> int:
        raise NotImplementedError

    def check_fits(self, num_workers: int) -> None:
        """Refuse ``num_workers`` workers this backend cannot hold, where it can tell before
        it starts (a Ray's CPUs), so that a caller refuses before it writes a file or starts
        anything; the default (the local backend holds any number) refuses nothing."""

    def start(self, policy_factory: Callable[[int], object],
              drafter_factory: Callable[[int, object], object] | None = None,
              num_workers: int = 1) -> None:
        """Build worker ``w``'s policy as ``policy_factory(w)`` and its drafter as
        ``drafter_factory(w, policy)``."""
        raise NotImplementedError

    def map(self, fn: Callable[[Worker, object], object], items: list,
            progress: Callable[[int], None] | None = None,
            workers: Sequence[int] | None = None) -> list:
        """``[fn(worker w, items[i]) for i, w in enumerate(workers)]`` (``workers``: distinct
        indices, default ``0..len(items)-1``), each worker's times measured on its own clock.
        ``fn`` runs where the worker lives; what it returns comes back. An item with
        ``requests`` (a ``WorkerTask``) names the requests a failing worker held, and counts
        them for ``progress`` (module docstring)."""
        raise NotImplementedError

    def map_tail(self, fn: Callable[[Worker, object], object], items: list, tail: TailJobs,
                 progress: Callable[[int], None] | None = None) -> tuple[list, IdleRun]:
        """``map(fn, items, progress)`` (item i on worker i) whose workers, as each one's
        value comes back, run ``tail``'s job for them in their idle window until the map's
        last value comes back (module docstring, "tail jobs"): the values, and the jobs'
        :class:`IdleRun`. No job step ends past its window, so the step's makespan stays. A
        worker lost in the map raises as ``map`` does (its jobs' outcomes dropped); one lost
        in its job is reported in ``IdleRun.failed``."""
        raise NotImplementedError

    def update_weights(self, policy: dict | None = None, drafter: dict | None = None) -> None:
        """Load new policy and/or drafter weights into every worker."""
        raise NotImplementedError

    def map_steps(self, begin: Callable[[Worker, object], object], items: list, dispatch,
                  progress: Callable[[int], None] | None = None,
                  tail: TailJobs | None = None) -> tuple[list, IdleRun]:
        """A rollout whose workers advance together, in sim-time order, with ``dispatch``
        (``rollout.dispatch.Dispatch``) moving work between them: ``begin(worker w,
        items[w])`` gives each worker's ``WorkerRun``; the runs' results, and ``tail``'s jobs
        run in the idle windows after (as ``map_tail``). A worker lost on the way has its
        whole share re-run by the survivors inside the call (``dispatch.lost``); its value
        is its :class:`WorkerFailed`, and no job runs (``rollout.recovery``, "on the
        dispatch path"). Only a backend that orders its workers' steps itself has it (the
        local one in sim-time order, Ray's in rounds); the default refuses."""
        raise ValueError(f"the {self.name!r} backend moves no work between its workers (a "
                         "Dispatch); accepted: the local or Ray backend")

    def close(self) -> None:
        raise NotImplementedError


class LocalBackend(Backend):
    """All workers in this process, one after another; times laid side by side (sim clock).
    Each worker's work runs inside ``clock.sim_work()`` (torch on one thread), so that its
    seconds are its thread's CPU time, which other work on the machine does not stretch."""

    name = "local"
    clock = "sim"
    runs_copies = False
    dispatches = True

    def __init__(self):
        self._workers: list[Worker] = []

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def start(self, policy_factory, drafter_factory=None, num_workers: int = 1) -> None:
        num_workers = check_int("num_workers", num_workers, 1)
        self.close()
        for w in range(num_workers):
            model = policy_factory(w)
            drafter = drafter_factory(w, model) if drafter_factory is not None else None
            self._workers.append(Worker(w, model, drafter, self.clock))

    def map(self, fn, items, progress=None, workers=None):
        workers = check_placement(items, workers, self.num_workers)
        for worker in self._workers:  # the driver's own process: progress goes in, live
            worker.on_finish = progress or (lambda finished: None)
        results, failures = {}, []
        for w, item in zip(workers, items):
            worker = self._workers[w]
            try:
                with sim_work():
                    results[w] = _on(w, lambda: fn(worker, item), getattr(item, "requests", ()))
            except WorkerFailed as failed:
                failures.append(failed)
        if failures:
            raise first_failure(failures, results)
        return [results[w] for w in workers]

    def map_steps(self, begin, items, dispatch, progress=None, tail=None):
        """The seam of the local execution model (docs/design.md): a small discrete-event
        loop that always steps the busy run whose clock is earliest (ties: the lower
        worker), so that what a run sees of the others (their queues, their requests'
        tokens) is where they stood at its time, to one step. Before each step ``dispatch``
        may fill or reorder that run's queue; a run with nothing left whose clock is not
        past the earliest busy one is offered work (``dispatch.idle``). Each step runs
        inside ``clock.sim_work`` on its worker's own clock, resumed at its mark. A worker
        that fails is lost, not raised: its whole share goes to ``dispatch.lost`` for the
        survivors, from scratch, once every busy clock has reached the failure; its value is
        its ``WorkerFailed``, and no tail job runs (``rollout.recovery``, "on the dispatch
        path", which also says when it raises)."""
        workers = check_placement(items, None, self.num_workers)
        for worker in self._workers:
            worker.on_finish = progress or (lambda finished: None)
        with sim_work(), torch.inference_mode():  # one thread throughout: the clocks' reads
            runs = [begin(self._workers[w], item) for w, item in zip(workers, items)]
            lost = _in_time_order(runs, dispatch)
            values = [lost[run.index] if run.index in lost else run.result() for run in runs]
        if tail is None or lost:
            return values, IdleRun()
        ends = {w: self._workers[w].rollout_end_s for w in workers}
        last = max(ends.values(), default=0.0)
        windows = sorted((IdleWindow(w, start, last) for w, start in ends.items()),
                         key=lambda window: (window.start_s, window.worker))
        return values, self._run_windows(tail, windows, values)

    def update_weights(self, policy=None, drafter=None) -> None:
        loaded = set()  # workers may share one module here: load each module once
        for worker in self._workers:
            module = None if worker.drafter is None else worker.drafter.module
            worker.load_weights(policy if id(worker.model) not in loaded else None,
                                drafter if id(module) not in loaded else None)
            loaded |= {id(worker.model), id(module)}

    def map_tail(self, fn, items, tail, progress=None):
        values = self.map(fn, items, progress)  # a lost worker raises here: no job runs
        ends = {w: self._workers[w].rollout_end_s for w in range(len(items))}
        last = max(ends.values(), default=0.0)
        windows = sorted((IdleWindow(w, start, last) for w, start in ends.items()),
                         key=lambda window: (window.start_s, window.worker))
        return values, self._run_windows(tail, windows, values)

    def run_idle(self, tail: TailJobs, timeline: Timeline, returned: list) -> IdleRun:
        """``tail``'s jobs in the idle windows of ``timeline``, a rollout that is over (its
        values ``returned``), on its workers' clocks (the recorders of that rollout, this
        backend's own or replayed: :meth:`replay_recorders`): what ``map_tail`` runs after
        its map, for a caller that trains after the fact (the staleness observer)."""
        if timeline.num_workers != self.num_workers:
            raise ValueError(f"a timeline of {timeline.num_workers} workers for a backend of "
                             f"{self.num_workers}; accepted: the timeline of this backend's "
                             "latest rollout (or of the recorders it replays)")
        return self._run_windows(tail, timeline.idle_windows(), returned)

    def _run_windows(self, tail: TailJobs, windows: list[IdleWindow], returned: list) -> IdleRun:
        """Each job ``tail`` gives for ``windows`` (the first to open first; a window of no
        time has none), run on its worker in turn, its end known from the start."""
        used, runs = [], []
        for window in windows:
            job = tail.job(window, returned) if window.seconds > 0 else None
            if job is None:
                continue
            worker = self._workers[window.worker]
            try:
                with sim_work():
                    runs.append(_on(window.worker, lambda: worker.run_idle(job, window)))
            except WorkerFailed as failed:
                runs.append(failed)
            used.append(window)
        return IdleRun.of(used, runs)

    @property
    def recorders(self) -> list:
        """Each worker's step recorder of its latest rollout (None before one): the clocks
        an idle-window job resumes, which another process can replay
        (:meth:`replay_recorders`)."""
        return [worker.recorder for worker in self._workers]

    def replay_recorders(self, recorders: Sequence) -> None:
        """Give the workers the ``recorders`` of another backend's latest rollout (one per
        worker), so that ``run_idle`` after it runs on that rollout's clocks here."""
        if len(recorders) != self.num_workers:
            raise ValueError(f"{len(recorders)} recorders for {self.num_workers} workers; "
                             "start the backend with one worker per recorder")
        for worker, recorder in zip(self._workers, recorders):
            worker.recorder = recorder

    def close(self) -> None:
        self._workers = []


def check_capacity(backend: Backend, num_workers: int) -> None:
    """Refuse ``num_workers`` workers that ``backend`` cannot hold, where it can tell before
    it starts (:meth:`Backend.check_fits`: a Ray backend's CPUs), so that a caller refuses
    before it writes a file or starts anything. A backend that cannot tell is checked by its
    ``start``."""
    backend.check_fits(num_workers)


def check_placement(items: list, workers: Sequence[int] | None, num_workers: int) -> list[int]:
    """The worker of each of ``items``: ``workers`` (distinct indices of the ``num_workers``
    workers, one per item) or, by default, item i on worker i; a ValueError otherwise."""
    if workers is None:
        if len(items) > num_workers:
            raise ValueError(f"{len(items)} items for {num_workers} workers; start the "
                             "backend with enough workers")
        return list(range(len(items)))
    workers = list(workers)
    if (len(workers) != len(items) or len(set(workers)) != len(workers)
            or not all(isinstance(w, int) and 0 <= w < num_workers for w in workers)):
        raise ValueError(f"workers must be one distinct worker of 0..{num_workers - 1} per "
                         f"item ({len(items)} items), got {workers!r}")
    return workers


def _in_time_order(runs: list, dispatch) -> dict[int, WorkerFailed]:
    """``LocalBackend.map_steps``'s loop over ``runs`` under ``dispatch``, to the end; the
    workers lost on the way, each with its ``WorkerFailed`` (its share handed to
    ``dispatch.lost`` once the earliest busy clock reached the failure)."""
    live, lost, pending = list(runs), {}, []  # pending: lost, the share not yet handed out
    dispatch.begin(live)
    while True:
        busy = [r for r in live if r.busy]
        now = min((r.clock_s for r in busy), default=float("inf"))
        for failed in [f for f in pending if f.at_s <= now]:  # the failure is known by now
            pending.remove(failed)
            for run in live:  # none of the share starts before the failure
                run.wait_until(failed.at_s)
            dispatch.lost(runs[failed.worker], [RequestOutput.of(q, -1) for q in
                                                failed.requests], live)
        for run in sorted((r for r in live if not r.busy and r.clock_s <= now),
                          key=lambda r: (r.clock_s, r.index)):
            dispatch.idle(run, live)  # a worker with nothing left: work may move to it
        busy = [r for r in live if r.busy]
        if not busy:
            break
        run = min(busy, key=lambda r: (r.clock_s, r.index))
        dispatch.before(run, live)
        failed = _step(run)
        if failed is not None:
            live.remove(run)
            check_rerun(failed, list(lost.values()), live)
            lost[run.index] = failed
            pending.append(failed)
    dispatch.end(live)
    return lost


def _step(run) -> WorkerFailed | None:
    """One step of ``run``; None, or its worker's failure (a ValueError, bad input, passes
    through as it is), holding the run's whole share (``WorkerRun.held``: none of it came
    back), at its worker's clock."""
    try:
        run.advance(resume=True)
    except ValueError:
        raise
    except Exception as exc:
        failed = WorkerFailed(run.index, exc, run.held(), run.rec.now())
        failed.__cause__ = exc
        return failed
    return None


def check_rerun(failed: WorkerFailed, earlier: list[WorkerFailed], survivors: list) -> None:
    """Raise ``failed`` where recovery gives no second chance: its worker held a request
    that was already re-running one of ``earlier``'s (it names them, the one it re-ran in
    its ``__context__``), or no worker survives (the lowest worker's failure, holding every
    failure, as ``Backend.map`` raises)."""
    uids = {q.uid for q in failed.requests}
    for first in earlier:
        if uids & {q.uid for q in first.requests}:
            failed.failures, failed.results = [failed, *earlier], {}
            failed.__context__ = first
            raise failed
    if not survivors:
        raise first_failure([*earlier, failed], {})


def _on(worker: int, call: Callable[[], object], requests: Sequence[Request] = ()):
    """``call()``, whose failure is worker ``worker``'s (:class:`WorkerFailed`, with the
    seconds the call ran; a ValueError, bad input, passes through as it is)."""
    start = time.perf_counter()
    try:
        return call()
    except ValueError:
        raise
    except Exception as exc:
        raise WorkerFailed(worker, exc, requests, time.perf_counter() - start) from exc
