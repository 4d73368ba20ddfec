"""Independent jobs side by side: up to ``width`` at a time, each on a thread of its own with
torch on one intra-op thread.

Why: a sim second is the working thread's CPU time with torch on one thread
(``workbench.clock``), so one job at a time leaves all but one core idle. Jobs that share no
state (the runs of an ablation, each with its own policy, engine and local backend; their
held-out evaluations) can instead run one per core: each job's thread CPU time is still all
of its own work, and another job beside it is just other load, which that clock does not
count. A job's results do not depend on what runs beside it: every random draw in the package
takes its own generator, and each op of one intra-op thread computes in one order.

``torch.set_num_threads`` is process-wide, so it is set once around the whole batch (and
restored after), never by a job; the clock's own ``sim_work`` then finds one thread already.
Jobs run in a copy of the caller's context (``contextvars``), so a clock chosen there
(``clock.sim_seconds``) holds in every job.
"""
from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from .checks import check_int

__all__ = ["side_by_side", "width_for"]

T = TypeVar("T")


def width_for(sim_seconds_kind: str, shares_a_backend: bool) -> int:
    """How many runs of an ablation can go side by side: one per torch thread the process
    was given, when sim seconds are thread CPU time and every run has its own local backend;
    otherwise 1 (wall-time sim seconds count a neighbour's work; runs that take turns on one
    backend cannot overlap)."""
    if sim_seconds_kind != "thread_cpu" or shares_a_backend:
        return 1
    return torch.get_num_threads()


def side_by_side(jobs: Sequence[Callable[[], T]], width: int) -> list[T]:
    """Each of ``jobs`` called once, up to ``width`` at a time; their results in job order.

    ``width`` 1 (or one job) calls them in turn on the caller's thread and changes nothing.
    Wider, torch runs on one intra-op thread until every job is done; a job that raises
    lets the others finish, then its error (the first in job order) is raised."""
    check_int("width", width, low=1)
    if width == 1 or len(jobs) <= 1:
        return [job() for job in jobs]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(min(width, len(jobs))) as pool:
            futures = [pool.submit(contextvars.copy_context().run, job) for job in jobs]
            errors = [f.exception() for f in futures]  # waits for every job
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return [f.result() for f in futures]
    finally:
        torch.set_num_threads(threads)
