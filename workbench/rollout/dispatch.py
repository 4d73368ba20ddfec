"""Dispatch: where requests run when the workers of one rollout are advanced together, in
sim-time order (``LocalBackend.map_steps``; docs/design.md, "The local execution model, and
its seam"), or on Ray in rounds of one step of every busy actor (``rollout.ray_steps``).

By default each worker decodes its own shard to the end, one worker after another, and the
sim clock lays their times side by side. A :class:`Dispatch` is handed every worker's run
(:class:`Run`: a ``WorkerRun``, or on Ray the driver's mirror of one) and asked where work
goes:

- ``begin(runs)``: before any step (every run's queue holds its shard): it may reorder the
  queues or deal the requests again;
- ``before(run, runs)``: before ``run``'s next step, which starts at ``run.clock_s``, the
  earliest clock of the busy runs: it may reorder ``run``'s queue or fill it;
- ``idle(run, runs)``: ``run`` holds nothing, and its clock is not past the earliest busy
  run's: it may move work to it, queued (``take_queued`` / ``give_queued``: free) or running
  (``release`` / ``receive``: the receiving worker re-prefills the request's prompt and
  tokens, a ``prefill`` row of its own with ``moved_from``, on its clock, from the source's
  clock at the earliest);
- ``lost(run, requests, runs)``: ``run``'s worker failed; ``requests``, fresh outputs of
  every request it answered for (none came back), run again from scratch on ``runs``, the
  survivors, whose clocks are all at the failure or past it by then (``rollout.recovery``,
  "on the dispatch path").

A drafter that serves every worker (``RolloutEngine.rollout(drafter=...)``) keeps per-row
state between ``begin`` and the last step of a worker's rollout; with the workers' steps
interleaved, each worker drafts with a view of its own (:func:`drafter_view`).

Requests keep their uids wherever they run, so coupled draws give every request the tokens it
would have had on its first worker (a re-prefill computes in one pass what the steps computed
one at a time: equal in float64; in float32 it may round differently).
"""
from __future__ import annotations

import copy
from typing import Protocol

__all__ = ["Dispatch", "Run", "drafter_view"]


class Run(Protocol):
    """What a dispatch reads and moves of one worker's rollout: the local backend's
    ``WorkerRun`` itself, or, on Ray, the driver's mirror of the one its actor holds
    (``rollout.ray_steps``), whose reads are as of the latest round.

    Reads: ``index`` (the worker), ``clock_s`` (where its next step starts on the step's
    clock), ``busy`` (it holds queued or running requests), ``queue`` (queued
    ``RequestOutput``s, admitted from the front), ``running`` (those in the batch), ``cap``
    (its batch's rows at most), ``outputs`` (every request it answers for), ``rows`` (this
    rollout's steps rows so far), ``admitted`` (every request prefilled on it so far).
    Moves: ``order_queue`` (the queued requests, in a new order), ``take_queued`` /
    ``give_queued`` (free), ``release`` / ``receive`` (the receiving worker re-prefills)."""

    index: int
    clock_s: float
    busy: bool
    queue: object
    running: list
    cap: int
    outputs: list
    rows: list
    admitted: list

    def refill_due(self, waiting: int | None = None) -> bool:
        """Whether ``waiting`` requests (default: the queue's) would join at its next step."""

    def order_queue(self, requests: list) -> None:
        """Queue ``requests``, its queued ones, in this order (front first)."""

    def take_queued(self, uids) -> list:
        """Take its queued requests ``uids`` (to queue them on another run)."""

    def give_queued(self, requests: list, front: bool = False) -> None:
        """Queue ``requests`` on it (at the back, or the front)."""

    def release(self, uids) -> list:
        """Take its running requests ``uids`` out of the batch: ``[(request, harvested)]``."""

    def receive(self, released: list, source: int, at_s: float) -> None:
        """Queue first what ``source`` released at ``at_s`` on its clock, to re-prefill."""


class Dispatch:
    """Where requests run in a rollout whose workers advance in sim-time order (module
    docstring); every hook defaults to leaving the work where it is."""

    def begin(self, runs: list) -> None:
        """Before any step."""

    def before(self, run, runs: list) -> None:
        """Before ``run``'s next step."""

    def idle(self, run, runs: list) -> None:
        """``run`` holds nothing while its clock is the earliest."""

    def lost(self, run, requests: list, runs: list) -> None:
        """``run``'s worker was lost: ``requests`` (fresh ``RequestOutput``s of its whole
        share) go to ``runs``, the survivors; by default dealt round-robin, in their order,
        over the survivors by clock (the earliest first; ties: the lower worker), at the
        back of each queue, so that the first free survivor starts the first of them."""
        order = sorted(runs, key=lambda r: (r.clock_s, r.index))
        for k, survivor in enumerate(order):
            survivor.give_queued(requests[k::len(order)])

    def end(self, runs: list) -> None:
        """After the last step (every run idle)."""


def drafter_view(drafter):
    """``drafter`` for one worker of a rollout whose workers' steps interleave: a shallow
    copy, sharing its weights and memory, whose ``begin`` gives it per-row state of its own
    (each drafter's ``begin`` assigns that state afresh); a set's members (``members``) and a
    wrapped drafter (``drafter``) viewed alike. None stays None (each worker's own)."""
    if drafter is None:
        return None
    view = copy.copy(drafter)
    if drafter.members:  # the protocol's hook, read directly as plan.py does (None: one drafter)
        view.members = {name: drafter_view(d) for name, d in drafter.members.items()}
    inner = vars(drafter).get("drafter")
    if inner is not None:
        vars(view)["drafter"] = drafter_view(inner)
    return view
