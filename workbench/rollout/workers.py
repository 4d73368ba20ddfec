"""Workers: who runs each shard of a rollout step, and on which clock its times are read.

A backend maps ``fn(worker_id, shard) -> steps rows`` over the shards. The local backend runs
the shards one after another in this process and times each for real from its own start, so
laying them side by side gives the *sim* clock of N workers running in parallel. A Ray
backend fills the same interface with really parallel workers (clock ``wall``); never mix the
two clocks in one comparison.
"""
from __future__ import annotations

from typing import Callable, Protocol

__all__ = ["Backend", "LocalBackend"]


class Backend(Protocol):
    name: str
    clock: str  # "sim" or "wall": the clock the workers' times are on

    def map(self, fn: Callable[[int, list], list[dict]], shards: list[list]) -> list[list[dict]]:
        """``[fn(w, shards[w]) for w]``, each worker's times measured from its own start."""
        ...


class LocalBackend:
    """All workers in this process, one after another; times laid side by side (sim clock)."""

    name = "local"
    clock = "sim"

    def map(self, fn, shards):
        return [fn(w, shard) for w, shard in enumerate(shards)]
