"""The seconds a worker's work is measured in, on each of the two clocks (docs/design.md,
"clocks").

*wall* (a backend whose workers really run in parallel: Ray): ``time.perf_counter``, the
time that passed.

*sim* (the local backend lays its workers' busy times side by side, as if each had a core of
its own): the time each piece of work took. Wall time counts whatever else the machine runs:
a test suite or a second run on the same cores stretches every step, and every figure read
off the steps (makespans, idle windows, the drafter steps that fit in them, the bandit's
costs). When torch computes on the calling thread alone (one intra-op thread:
``torch.get_num_threads() == 1``), that thread's CPU time (``time.thread_time``) is the work
itself, and it does not grow when other processes share the cores. Measured on this 2-core
machine with two other busy processes: 200 matmuls of 512 x 512 took 1.7-2.2 s of wall time
and 0.54-0.55 s of thread time. With more threads the work is spread
over threads that this one's CPU time does not see, and the sim clock reads wall time.

Time that is not work (a drafter slowed on purpose, ``speculative.drafters.SlowedDrafter``)
is *charged* to a sim clock (``StepRecorder.wait``) rather than slept: thread time would not
see a sleep, and a charge is exact.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

__all__ = ["seconds_reader", "reads_cpu_time"]


def _thread_cpu() -> float:
    return time.thread_time()  # looked up at each call: a test's tick clock patches ``time``


def _wall() -> float:
    return time.perf_counter()


def reads_cpu_time(clock: str) -> bool:
    """Whether work on ``clock`` is measured in the calling thread's CPU time now (module
    docstring): the sim clock, with torch on one thread."""
    return clock == "sim" and torch.get_num_threads() == 1


def seconds_reader(clock: str) -> Callable[[], float]:
    """A function of no arguments whose differences are the seconds work took on ``clock``
    (``"sim"`` or ``"wall"``), chosen once: a recorder keeps one reader for a whole rollout,
    so that a change of torch's thread count mid-way cannot mix two clocks."""
    return _thread_cpu if reads_cpu_time(clock) else _wall
