"""A dispatch on Ray (``RayBackend.map_steps``): work moves between actors that decode in
parallel, in rounds.

Each actor holds its worker's :class:`~workbench.rollout.worker.WorkerRun` (:class:`RunHost`,
its side); the driver holds a :class:`RunMirror` of each, the ``rollout.dispatch.Run`` that
the dispatch reads and moves, and runs the dispatch's loop (:func:`run_rounds`):

- **a round** is one step of every busy actor, all at once; the driver waits for every one
  of them, and each reports its run's state (:class:`RunState`: its clock, queue, batch,
  new steps rows). Between rounds the actors are idle, and the dispatch is asked where work
  goes on the reported state, as the local loop asks it on the runs themselves: ``idle`` for
  every actor that holds nothing, then ``before`` for every busy one (the earliest clock
  first; ties: the lower worker). So a dispatch sees the other workers as they stood at the
  latest round's end, to one step, as on the local backend, and the order of its decisions
  does not depend on how long anything took.
- **a move** is a call on the actors, at once, each reporting again: queued requests go
  freely (``take_queued`` / ``give_queued``); a running one is released by its actor and
  received by the other, which re-prefills it (prompt and tokens, a ``prefill`` row with
  ``moved_from``) at its next step, on Ray's wall clock: the step starts when the round
  does, no earlier than the source's clock (``WorkerRun.receive``).

The driver's requests are one object per uid (the mirrors update them in place from each
report), so a dispatch that keeps requests between hooks (Seer's predictors read their
tokens) reads them current. Requests keep their uids, so the tokens are the local backend's
(equal in float64). The wait between an actor's steps, the driver's round trip and its
dispatch, shows as idle on the wall clock (``WorkerRun.advance(resume=True)``). The price of
a round of one step: a round trip per step, and each report carries the run's requests with
their tokens so far (its rows only from the last report on), so it grows with the rollout.

A worker lost in a round (its step raised, or its actor died) is handled as on the local
backend (``rollout.recovery``, "on the dispatch path"): its whole share, from scratch, goes
to ``dispatch.lost`` with the survivors at once (on the wall clock the failure is already
past); no second chance, and no survivor, raise. A worker lost during a move raises. Tail
jobs do not run beside a dispatch on Ray: a tail is refused before anything starts.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import ray
import torch

from .backend import check_rerun
from .failures import WorkerFailed, first_failure
from .request import Request, RequestOutput
from .worker import Worker, WorkerResult, WorkerRun

__all__ = ["RunState", "RunHost", "RunMirror", "run_rounds", "ray_failure"]


@dataclass
class RunState:
    """What an actor reports of its run after each call: ``clock_s`` (where its next step
    starts on the step's wall clock), whether it is ``busy``, its batch's ``cap``, copies of
    its ``outputs`` (every request it answers for), the uids of its ``queue`` (front first),
    of its batch (``running``) and of every request prefilled on it (``admitted``), and its
    steps rows from the ``seen``-th on (``rows``)."""

    clock_s: float
    busy: bool
    cap: int
    outputs: list[RequestOutput]
    queue: list[int]
    running: list[int]
    admitted: list[int]
    rows: list[dict]

    @classmethod
    def of(cls, run: WorkerRun, seen: int) -> "RunState":
        """``run``'s state now, its rows from the ``seen``-th on."""
        return cls(run.clock_s, run.busy, run.cap, list(run.outputs),
                   [r.uid for r in run.queue], [r.uid for r in run.running],
                   [r.uid for r in run.admitted], run.rows[seen:])


class RunHost:
    """An actor's side of a dispatch (mixed into ``ray_backend.WorkerHost``, whose
    ``worker`` it steps): the run of the latest :meth:`begin_run`, which calls advance and
    move; each reports the run's state after it."""

    def begin_run(self, begin: Callable, item, origin: float) -> tuple:
        """``begin(worker, item)``, this actor's run, with its clock counting from ``origin``
        (the driver's wall time at submit, every actor's 0): its task's config, and its
        state."""
        self.worker.origin = origin
        self.run = begin(self.worker, item)
        return self.run.task.config, RunState.of(self.run, 0)

    def on_run(self, op: Callable, args: tuple, seen: int) -> tuple[object, RunState]:
        """``op(run, *args)`` (a step, or a move); its value, and the run's state, its rows
        from the ``seen``-th on."""
        with torch.inference_mode():
            value = op(self.run, *args)
        return value, RunState.of(self.run, seen)

    def run_result(self) -> WorkerResult:
        """The run's result (it is over), the run let go."""
        run, self.run = self.run, None
        return run.result()


def _order(run: WorkerRun, uids: list[int]) -> None:
    """Queue ``run``'s queued requests in the order of ``uids`` (on the actor: its own
    objects)."""
    queued = {r.uid: r for r in run.queue}
    run.order_queue([queued[uid] for uid in uids])


class RunMirror:
    """The driver's view of worker ``index``'s run on ``actor`` (a ``rollout.dispatch.Run``),
    as of its latest report; its requests are ``known``'s, one object per uid across the
    mirrors. Each move is a call on the actor, which reports again; ``config`` is its task's
    (for :meth:`refill_due`)."""

    def __init__(self, index: int, actor, config, state: RunState, known: dict[int, object],
                 origin: float):
        self.index, self.actor, self.config, self.known = index, actor, config, known
        self.origin, self.rows = origin, []
        self.update(state)

    def update(self, state: RunState) -> None:
        """Take ``state``, the actor's latest report."""
        for out in state.outputs:
            self._know(out)
        self.clock_s, self.busy, self.cap = state.clock_s, state.busy, state.cap
        self.outputs = [self.known[r.uid] for r in state.outputs]
        self.queue = deque(self.known[uid] for uid in state.queue)
        self.running = [self.known[uid] for uid in state.running]
        self.admitted = [self.known[uid] for uid in state.admitted]
        self.rows.extend(state.rows)

    def _know(self, out: RequestOutput) -> RequestOutput:
        """The driver's object of ``out``'s uid, updated to ``out`` (an actor's copy)."""
        if out.uid in self.known:
            vars(self.known[out.uid]).update(vars(out))
        else:
            self.known[out.uid] = out
        return self.known[out.uid]

    def step(self):
        """One step on the actor (its ref: a round waits for every busy actor's)."""
        return self.actor.on_run.remote(WorkerRun.advance, (True,), len(self.rows))

    def _now(self, op: Callable, *args):
        """``op(run, *args)`` on the actor, now; its value (a worker lost here raises)."""
        try:
            value, state = ray.get(self.actor.on_run.remote(op, args, len(self.rows)))
        except ray.exceptions.RayError as exc:
            raise lost_in(self, exc) from exc
        self.update(state)
        return value

    def refill_due(self, waiting: int | None = None) -> bool:
        waiting = len(self.queue) if waiting is None else waiting
        return waiting > 0 and Worker.refill_due(self.config, self.cap, len(self.running),
                                                 waiting)

    def order_queue(self, requests: list) -> None:
        uids = [r.uid for r in requests]
        if uids != [r.uid for r in self.queue]:  # a round trip only for a new order
            self._now(_order, uids)

    def take_queued(self, uids) -> list:
        return [self._know(r) for r in self._now(WorkerRun.take_queued, list(uids))]

    def give_queued(self, requests: list, front: bool = False) -> None:
        if requests:
            self._now(WorkerRun.give_queued, list(requests), front)

    def release(self, uids) -> list:
        released = self._now(WorkerRun.release, list(uids))
        for out, _ in released:
            self._know(out)
        return released

    def receive(self, released: list, source: int, at_s: float) -> None:
        self._now(WorkerRun.receive, released, source, at_s)

    def held(self) -> list[Request]:
        """Every request the run answers for, as drawn (what a lost worker takes with it)."""
        return [Request(r.uid, r.prompt_id, r.sample_idx, tuple(r.prompt_ids),
                        r.max_new_tokens) for r in self.outputs]


def lost_in(mirror: RunMirror, exc: Exception) -> Exception:
    """What a failure of ``mirror``'s actor raises (:func:`ray_failure`): its run's whole
    share, at the wall seconds since the driver's submit."""
    return ray_failure(mirror.index, exc, mirror.held(), time.time() - mirror.origin)


def ray_failure(worker: int, exc: Exception, requests: Sequence, at_s: float) -> Exception:
    """What a failure on ``worker``'s actor, ``at_s`` seconds into the call, raises: the
    ValueError its work raised (bad input, from the remote error that carries the actor's
    traceback), else :class:`WorkerFailed` with the exception raised there, or the actor's
    death, as cause (``RayBackend``'s calls and a dispatch's rounds alike)."""
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, ValueError):
        cause.__cause__ = exc
        return cause
    failed = WorkerFailed(worker, cause, requests, at_s)
    failed.__cause__ = cause
    return failed


def run_rounds(actors: list, begin: Callable, items: list, dispatch,
               progress: Callable[[int], None] | None = None) -> list:
    """``begin(worker w, items[w])`` on ``actors[w]``, advanced in rounds under
    ``dispatch`` (module docstring): each worker's ``WorkerResult``, or the
    :class:`WorkerFailed` of a worker lost on the way, whose share the survivors re-ran;
    ``progress`` told each worker's request count as its result comes back."""
    origin, known = time.time(), {}
    begin_ref = ray.put(begin)
    begun = _begun([actor.begin_run.remote(begin_ref, item, origin)
                    for actor, item in zip(actors, items)], origin)
    live = [RunMirror(w, actor, config, state, known, origin)
            for w, (actor, (config, state)) in enumerate(zip(actors, begun))]
    mirrors, lost = list(live), {}
    dispatch.begin(live)
    while True:
        for run in sorted((r for r in live if not r.busy), key=lambda r: (r.clock_s, r.index)):
            dispatch.idle(run, live)  # an actor with nothing left: work may move to it
        busy = sorted((r for r in live if r.busy), key=lambda r: (r.clock_s, r.index))
        if not busy:
            break
        for run in busy:
            dispatch.before(run, live)
        failures = _round(busy)
        live = [run for run in live if run.index not in {f.worker for f in failures}]
        for failed in failures:  # no second chance, nor no survivor (backend.check_rerun)
            check_rerun(failed, [*lost.values(), *(f for f in failures if f is not failed)],
                        live)
        lost.update((failed.worker, failed) for failed in failures)
        for failed in failures:
            dispatch.lost(mirrors[failed.worker], [RequestOutput.of(q, -1)
                                                   for q in failed.requests], live)
    dispatch.end(live)
    results = ray.get([run.actor.run_result.remote() for run in live])
    for result in results:
        if progress is not None:
            progress(len(result.requests))
    done = {result.worker: result for result in results}
    return [lost[w] if w in lost else done[w] for w in range(len(mirrors))]


def _begun(refs: list, origin: float) -> list:
    """Each actor's begun run, ``(its config, its state)``, once every one is; a failure
    raises (the lowest worker's, holding every failure; a ValueError, bad input, as it is):
    nothing ran yet, nothing to re-run."""
    ray.wait(refs, num_returns=len(refs))
    begun, failures = [], []
    for w, ref in enumerate(refs):
        try:
            begun.append(ray.get(ref))
        except ray.exceptions.RayError as exc:
            failure = ray_failure(w, exc, (), time.time() - origin)
            if isinstance(failure, ValueError):
                raise failure
            failures.append(failure)
    if failures:
        raise first_failure(failures, {})
    return begun


def _round(busy: list[RunMirror]) -> list[WorkerFailed]:
    """One step of every ``busy`` run at once, each mirror updated from its report; the
    failures of the workers lost in it (a ValueError, bad input, passes through)."""
    refs = [run.step() for run in busy]
    ray.wait(refs, num_returns=len(refs))  # every actor's step is over before anything raises
    failures = []
    for run, ref in zip(busy, refs):
        try:
            _, state = ray.get(ref)
        except ray.exceptions.RayError as exc:
            failure = lost_in(run, exc)
            if isinstance(failure, ValueError):
                raise failure
            failures.append(failure)
        else:
            run.update(state)
    return failures
