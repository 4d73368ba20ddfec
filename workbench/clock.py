"""The seconds a worker's work is measured in, on each of the two clocks, and the CPU share
that work got (docs/design.md, "clocks").

*wall* (a backend whose workers really run in parallel: Ray): ``time.perf_counter``, the
time that passed.

*sim* (the local backend lays its workers' busy times side by side, as if each had a core of
its own): the time each piece of work took, as **the CPU time of the thread that did it, with
torch on one intra-op thread** (:func:`sim_work`). Wall time counts whatever else the machine
runs: a test suite or a second run on the same cores stretches every step, and every figure
read off the steps (makespans, idle windows, the drafter steps that fit in them, the bandit's
costs). A thread's CPU time does not grow while it is descheduled, waits, or while other
threads and processes run. Several intra-op threads cannot be measured that way: the process's
CPU time counts the pool's spin-waits at every barrier, and under load (a sibling thread
descheduled) those grow several-fold, so the work itself would seem to grow. So sim work runs
on one thread; on these CPU-bound small decode steps, which hold the GIL between ops, a second
thread buys little (docs/design.md, "clocks", gives the measured cost).

Runs saved before that rule measured sim seconds as wall time when torch had several threads;
:func:`sim_seconds` chooses that kind for a scope (``"wall"``), so that such a folder resumes
on the clock it recorded. New runs use ``"thread_cpu"``.

Time that is not work (a drafter slowed on purpose, ``speculative.drafters.SlowedDrafter``)
is *charged* to a sim clock (``StepRecorder.wait``) rather than slept: thread time would not
see a sleep, and a charge is exact.

*CPU share* (:func:`usage_probe`): the CPU seconds the work got over the wall seconds it
took, per step. On a machine to itself it is about 1; a step whose share falls under
:data:`DISTURBED_BELOW` was *disturbed*: other work took its core. The sim clock's figures do
not move with that; a wall-clock figure does, and says so.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from time import CLOCK_THREAD_CPUTIME_ID, clock_gettime, monotonic, process_time
from typing import Callable, Iterator

import torch

from .checks import check_choice

__all__ = ["seconds_reader", "wall_seconds", "sim_work", "sim_seconds", "sim_seconds_kind",
           "usage_probe", "cpu_share", "SIM_SECONDS", "DISTURBED_BELOW"]

SIM_SECONDS = ("thread_cpu", "wall")  # what a sim second is: new runs, and folders saved before
"""What a sim second is: the working thread's CPU time (new runs), or wall time (folders saved
before)."""
# a step that got less than this share of a core was disturbed: a quiet 2-core machine gives
# 0.95-1.0 on whole steps, one spinning process per core about 0.5
DISTURBED_BELOW = 0.8
"""A step that got less than this share of a core was disturbed."""

_SIM_SECONDS: ContextVar[str] = ContextVar("sim_seconds", default="thread_cpu")


def _thread_cpu() -> float:
    return time.thread_time()  # looked up at each call: a test's tick clock patches ``time``


def wall_seconds() -> float:
    """The wall clock's reader (``time.perf_counter``): what :func:`seconds_reader` hands a
    wall-clock recorder, or a sim one in a scope of :func:`sim_seconds` ``("wall")``. Public
    and looked up at each :func:`seconds_reader` call, so that a caller (a test) can tell
    which runs read it."""
    return time.perf_counter()


def sim_seconds_kind() -> str:
    """What a sim second is in this scope: ``"thread_cpu"``, or ``"wall"`` where
    :func:`sim_seconds` resumes a run saved on it."""
    return _SIM_SECONDS.get()


@contextmanager
def sim_seconds(kind: str) -> Iterator[None]:
    """Measure sim seconds as ``kind`` (:data:`SIM_SECONDS`) inside the scope: a run resumed
    from a folder keeps the kind its steps were measured in."""
    check_choice("sim_seconds", kind, SIM_SECONDS)
    token = _SIM_SECONDS.set(kind)
    try:
        yield
    finally:
        _SIM_SECONDS.reset(token)


@contextmanager
def sim_work() -> Iterator[None]:
    """Run work measured on the sim clock: with torch on one intra-op thread (restored after)
    while sim seconds are thread CPU time, so that the thread's CPU time is all of the work's
    (module docstring). ``torch.set_num_threads`` is process-wide: nothing else in the process
    computes with torch meanwhile (the local backend runs its workers one after another)."""
    threads = torch.get_num_threads()
    if sim_seconds_kind() != "thread_cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def seconds_reader(clock: str) -> Callable[[], float]:
    """A function of no arguments whose differences are the seconds work took on ``clock``
    (``"sim"`` or ``"wall"``), chosen once: a recorder keeps one reader for a whole rollout.
    Sim work read as thread CPU time must run inside :func:`sim_work`; work on several
    threads is refused rather than under-counted."""
    check_choice("clock", clock, ("sim", "wall"))
    if clock == "wall" or sim_seconds_kind() == "wall":
        return wall_seconds
    if torch.get_num_threads() != 1:
        raise RuntimeError(f"sim-clock work on {torch.get_num_threads()} torch threads: this "
                           "thread's CPU time would miss the others' work; run it inside "
                           "workbench.clock.sim_work()")
    return _thread_cpu


def _usage_thread() -> tuple[float, float]:
    # bound at import, not looked up on ``time``: a test's tick clock patches the module,
    # and a probe must not move the clock it describes
    return clock_gettime(CLOCK_THREAD_CPUTIME_ID), monotonic()


def _usage_process() -> tuple[float, float]:
    return process_time(), monotonic()


def usage_probe(clock: str) -> Callable[[], tuple[float, float]]:
    """A function of no arguments that reads ``(CPU seconds, wall seconds)`` of the work on
    ``clock``: this thread's CPU time on the sim clock (its work is this thread's), the
    process's CPU time on the wall clock (a Ray actor, a benchmark: a process of its own);
    differences of two readings give a step's :func:`cpu_share`. Work on several threads
    reads at most 1 quiet (capped: the pool's spin-waits count) and falls under the bound
    only when it got less than that share of one core: it is flagged less readily."""
    check_choice("clock", clock, ("sim", "wall"))
    return _usage_thread if clock == "sim" else _usage_process


def cpu_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share of a core the work between two :func:`usage_probe` readings got: its CPU
    seconds over its wall seconds, at most 1 (1 for no wall time at all)."""
    cpu, wall = after[0] - before[0], after[1] - before[1]
    return 1.0 if wall <= 0 else float(min(1.0, max(0.0, cpu / wall)))
