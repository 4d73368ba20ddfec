"""Backends: the one door between the callers of a rollout and the workers that run it.

A backend holds N workers (``rollout.worker``), each with its own policy, forward and drafter,
and is all that the engine, GRPO, TLT and the spot trainer see of them. Its protocol,
:class:`Backend`, has five jobs: start the workers from factories, map a function over them,
push new weights to them, run an *idle-window job* on the workers that finished their shard
early, and close. Nothing above the rollout layer reads a worker, its recorder or its clock.

Glossary:

clock        ``"sim"``: each worker's measured time laid side by side, as if the workers ran
             in parallel (the local backend runs them one after another in this process);
             ``"wall"``: the workers really run in parallel (a backend of processes or Ray
             actors). Never mix the two in one comparison.
idle window  a worker's time from its last rollout step to the end of the step's last one on
             any worker (``Timeline.idle_windows()``, ``IdleWindow``).
idle job     an object with ``run(window, clock) -> outcome`` (:class:`IdleJob`). The backend
             calls it once per window on that window's worker, with an ``IdleClock``:
             ``clock.timed(kind, fn, batch_size) -> (value, row)`` runs one step of the job
             right after the worker's last step, on the worker's clock, preempted at the
             window's end (the row flagged ``preempted``; the job discards that step's work);
             ``clock.policy`` is that worker's policy, for a job that needs one (the drafter's
             training builds its trainer on it: a job never ships a policy of its own).
             Whatever the caller needs comes back in the outcome (losses, new weights, ...):
             a backend of processes runs a *copy* of the job, so changes the job makes to
             itself are not seen by the caller. The local backend runs the caller's object.
progress     ``map(fn, items, progress)``: a callback of the driver's (a progress bar's
             ``update``) that takes a number of finished requests. It never leaves the
             driver's process: the local backend hands it to its workers (live, as requests
             finish); a backend of processes calls it as each worker's result comes back,
             with the number of requests that worker's item held.
worker fault a worker that raised while running a function or a job, or died. Every worker of
             the call runs its part to the end whatever another does; then ``map`` (and
             ``start``, ``update_weights``) raises :class:`WorkerFailed` for the lowest failed
             worker (its index, the cause, the requests it held, the seconds until it
             failed), from the cause, holding every failure of the call (``failures``) and the
             values of the workers that finished (``results``), so that a caller re-runs only
             what was lost (``rollout.recovery``). ``run_idle`` does not raise for a lost
             window: its outcome is ``None``, its failure is in ``IdleRun.failed``, and a
             ``failed`` row marks it in the timeline (idle work is optional, like a preempted
             step). The backend stays started: the caller may resubmit the requests elsewhere
             or start the backend again. Two kinds of exception pass through as they are: a
             ``ValueError`` is bad input (a plan the drafter cannot serve, a schedule's bad
             decision), the caller's to fix, which any worker would raise alike; and an
             interrupt (``KeyboardInterrupt``), which is not the worker's doing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from ..checks import check_int
from .request import Request
from .timeline import IdleWindow, Timeline
from .worker import IdleClock, Worker

__all__ = ["Backend", "LocalBackend", "IdleJob", "IdleRun", "WorkerFailed"]


class WorkerFailed(RuntimeError):
    """Worker ``worker`` raised ``cause`` (the ``__cause__`` too) while holding ``requests``
    (the requests of its shard; empty for work that held none, such as an idle job),
    ``at_s`` seconds after its work began (``None``: unknown). Never raised for a
    ``ValueError`` (bad input) or an interrupt: those pass through as they are.

    The backend fills in the rest of the call (module docstring, "worker fault"):
    ``failures``, every worker that failed in it, by worker (this one first), and
    ``results``, ``{worker: value}`` of the workers that finished."""

    def __init__(self, worker: int, cause: BaseException, requests: Sequence[Request] = (),
                 at_s: float | None = None):
        self.worker, self.cause, self.requests, self.at_s = worker, cause, list(requests), at_s
        self.failures: list[WorkerFailed] = [self]
        self.results: dict[int, object] = {}
        uids = [r.uid for r in self.requests]
        held = f"; it held {len(uids)} request(s), uids {uids[:8]}" + (
            " ..." if len(uids) > 8 else "") if uids else ""
        super().__init__(f"worker {worker} failed: {type(cause).__name__}: {cause}{held}")


def first_failure(failures: Sequence[WorkerFailed], results: dict[int, object]) -> WorkerFailed:
    """What a call raises when ``failures`` (not empty) happened in it: the lowest worker's
    failure, holding all of them and the finished workers' ``results``."""
    failures = sorted(failures, key=lambda failed: failed.worker)
    first = failures[0]
    first.failures, first.results = failures, dict(results)
    return first


def failure_row(failed: WorkerFailed, step: int, start_s: float = 0.0,
                end_s: float = float("inf")) -> dict:
    """The steps-table row that marks ``failed`` (kind ``failed``, timeline.py): from
    ``start_s``, where the lost work began on the step's clock, for its time until the failure
    (0 long when unknown), ending by ``end_s`` at the latest; its batch the requests it held."""
    end = min(start_s + (failed.at_s or 0.0), end_s)
    return {"worker": failed.worker, "step": step, "kind": "failed", "start_s": start_s,
            "end_s": max(end, start_s), "batch_size": len(failed.requests), "tokens": 0,
            "forward_s": 0.0}


class IdleJob(Protocol):
    """Work for idle windows (module docstring, "idle job")."""

    def run(self, window: IdleWindow, clock: IdleClock) -> object:
        """Work in ``window`` through ``clock``; the outcome the caller folds in."""
        ...


@dataclass
class IdleRun:
    """What :meth:`Backend.run_idle` hands back: the job's outcome of each window (in the
    windows' order; ``None`` for a window whose worker failed), the step's timeline with the
    rows the job's steps recorded (and a ``failed`` row per lost window), and the failures."""

    outcomes: list
    timeline: Timeline
    failed: list[WorkerFailed] = field(default_factory=list)


def idle_run(timeline: Timeline, windows: Sequence[IdleWindow], runs: list) -> IdleRun:
    """The :class:`IdleRun` of ``windows``: ``runs[i]`` is window i's ``(outcome, rows)``, or
    the :class:`WorkerFailed` of its worker (the outcome ``None``, a ``failed`` row from the
    window's start, within it, numbered after the worker's rows in ``timeline``)."""
    outcomes, rows, failed = [], [], []
    for window, run in zip(windows, runs):
        if isinstance(run, WorkerFailed):
            steps = timeline.steps.loc[timeline.steps["worker"] == window.worker, "step"]
            step = int(steps.max()) + 1 if len(steps) else 0
            rows.append(failure_row(run, step, window.start_s, window.end_s))
            outcomes.append(None)
            failed.append(run)
        else:
            outcomes.append(run[0])
            rows += run[1]
    return IdleRun(outcomes, timeline.with_steps(rows), failed)


class Backend(Protocol):
    """N workers behind one interface (module docstring). A worker that fails makes any
    method that ran on it raise :class:`WorkerFailed`."""

    name: str
    clock: str  # "sim" or "wall": the clock the workers' times are on
    runs_copies: bool  # the workers run copies of fn, its closure and jobs (processes, actors)

    @property
    def num_workers(self) -> int: ...

    def start(self, policy_factory: Callable[[int], object],
              drafter_factory: Callable[[int, object], object] | None = None,
              num_workers: int = 1) -> None:
        """Build worker ``w``'s policy as ``policy_factory(w)`` and its drafter as
        ``drafter_factory(w, policy)``."""
        ...

    def map(self, fn: Callable[[Worker, object], object], items: list,
            progress: Callable[[int], None] | None = None,
            workers: Sequence[int] | None = None) -> list:
        """``[fn(worker w, items[i]) for i, w in enumerate(workers)]`` (``workers``: distinct
        indices, default ``0..len(items)-1``), each worker's times measured on its own clock.
        ``fn`` runs where the worker lives; what it returns comes back. An item with
        ``requests`` (a ``WorkerTask``) names the requests a failing worker held, and counts
        them for ``progress`` (module docstring)."""
        ...

    def update_weights(self, policy: dict | None = None, drafter: dict | None = None) -> None:
        """Load new policy and/or drafter weights into every worker."""
        ...

    def run_idle(self, job: IdleJob, timeline: Timeline,
                 windows: Sequence[IdleWindow]) -> IdleRun:
        """Run ``job`` in each of ``windows`` (of ``timeline``, the latest rollout's:
        ``timeline.idle_windows()`` or some of them) on the window's worker, after its last
        rollout step and on its clock, and hand back the outcomes and ``timeline`` with the
        rows the job recorded. No step ends past its window, so the step's makespan stays.
        A window whose worker fails is reported in ``IdleRun.failed``, not raised (module
        docstring, "worker fault")."""
        ...

    def close(self) -> None: ...


class LocalBackend:
    """All workers in this process, one after another; times laid side by side (sim clock)."""

    name = "local"
    clock = "sim"
    runs_copies = False

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
                results[w] = _on(w, lambda: fn(worker, item), getattr(item, "requests", ()))
            except WorkerFailed as failed:
                failures.append(failed)
        if failures:
            raise first_failure(failures, results)
        return [results[w] for w in workers]

    def update_weights(self, policy=None, drafter=None) -> None:
        loaded = set()  # workers may share one module here: load each module once
        for worker in self._workers:
            module = getattr(worker.drafter, "module", None)
            worker.load_weights(policy if id(worker.model) not in loaded else None,
                                drafter if id(module) not in loaded else None)
            loaded |= {id(worker.model), id(module)}

    def run_idle(self, job, timeline, windows) -> IdleRun:
        windows = check_windows(windows, self.num_workers)
        for window in windows:
            if self._workers[window.worker].recorder is None:
                raise ValueError(f"worker {window.worker} has no rollout to idle after")
        runs = []
        for window in windows:
            worker = self._workers[window.worker]
            try:
                runs.append(_on(window.worker, lambda: worker.run_idle(job, window)))
            except WorkerFailed as failed:
                runs.append(failed)
        return idle_run(timeline, windows, runs)

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


def check_windows(windows: Sequence[IdleWindow], num_workers: int) -> list[IdleWindow]:
    """``windows`` as a list, each an :class:`IdleWindow` of one of ``num_workers`` workers
    (a ValueError names the first that is not)."""
    windows = list(windows)
    for window in windows:
        if not isinstance(window, IdleWindow) or not 0 <= window.worker < num_workers:
            raise ValueError(f"windows must be IdleWindows of workers 0..{num_workers - 1}"
                             f" (timeline.idle_windows()), got {window!r}")
    return windows


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
