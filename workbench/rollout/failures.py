"""Worker faults as values: the exception a backend raises for a lost worker, and the
``failed`` steps row that marks it on the timeline (``rollout.backend``'s glossary, "worker
fault"). Its own module because the backends, the idle-window machinery and recovery all
build on it."""
from __future__ import annotations

from typing import Sequence

from .request import Request

__all__ = ["WorkerFailed", "first_failure", "failure_row"]


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
