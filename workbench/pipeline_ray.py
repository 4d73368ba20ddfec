"""A pipeline's runs as Ray tasks (``workbench pipeline run --ray``), in parallel.

Each run is one Ray task that executes the pipeline's own run function (papermill into the
run folder, then ``run.json``), so run folders, skipping and the results table are those of
a local pipeline; only where the kernels run changes. A task holds ``threads`` Ray CPUs and
gives its kernel as many torch threads (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``: kernels
that together ask for more threads than there are cores run several times slower), so Ray
runs as many at once as its CPUs hold. Ray is reached through :mod:`workbench.ray_cluster`:
a local instance on 127.0.0.1 only, or a cluster by address, whose nodes need the project at
the same path and the runs root on a shared filesystem. A task lost with its node is retried
by Ray (a run starts from an emptied folder); an interrupt cancels the tasks still running.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable

import ray

from .ray_cluster import connect, known_cpus, resolve_address

__all__ = ["ray_tasks"]

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def ray_tasks(execute: Callable, address: str | None, threads: int):
    """A context that yields ``submit(*args)``: ``execute(*args)`` as a Ray task of
    ``threads`` CPUs, whose ``result()`` waits for its value. ``address`` is checked now
    (its form; whether it answers, on entering), and so is ``threads`` against a local Ray
    yet to start (this machine's CPUs: refused before it starts; a Ray already up, or a
    cluster, on entering); a Ray this context started is shut down on leaving it."""
    address = resolve_address(address)
    if not ray.is_initialized() and address is None:  # one node: this machine
        _check_fits(threads, address, known_cpus(address))
    return _tasks(execute, address, threads)


@contextmanager
def _tasks(execute: Callable, address: str | None, threads: int):
    started = connect(address)
    try:
        _check_fits(threads, address, _largest_node())
    except ValueError:
        if started:
            ray.shutdown()
        raise
    task = ray.remote(num_cpus=threads)(_with_threads)
    submitted = []

    def submit(*args) -> _Future:
        submitted.append(task.remote(execute, threads, *args))
        return _Future(submitted[-1])
    try:
        yield submit
    except BaseException:
        for ref in submitted:  # nothing keeps writing run folders after an interrupt
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def _largest_node() -> float:
    """The CPUs of the Ray's largest live node (a task runs on one node)."""
    return max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]),
               default=0)


def _check_fits(threads: int, address: str | None, largest: float) -> None:
    """Refuse, before any task is submitted, tasks of ``threads`` CPUs that no node of the
    Ray holds (``largest``: its largest node's CPUs; Ray would keep them pending for ever)."""
    if largest < threads:
        raise ValueError(f"threads={threads}: each run's task needs {threads} CPUs on one node, "
                         f"but the largest node of {address or 'the local Ray instance'} has "
                         f"{largest:g}; accepted: threads <= {largest:g}")


def _with_threads(execute: Callable, threads: int, *args):
    """``execute(*args)`` in a Ray worker, with ``threads`` torch threads for the kernels it
    starts (they inherit the environment; a worker runs one task at a time)."""
    os.environ.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    return execute(*args)


class _Future:
    """A Ray task's value as a future: ``result()`` waits for it."""

    def __init__(self, ref):
        self.ref = ref

    def result(self):
        return ray.get(self.ref)
