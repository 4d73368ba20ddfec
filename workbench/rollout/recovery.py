"""Recovery: a rollout step that loses a worker still returns every request.

When ``backend.map`` raises :class:`~workbench.rollout.failures.WorkerFailed` during a
rollout, what the surviving workers returned is kept (``WorkerFailed.results``) and only the
lost shards run again: each failed worker's requests (``WorkerFailed.requests``; none of them
came back) re-run on a surviving worker, in one more ``map`` call.

The rule: lost shards go to the survivors in the order the survivors finished on the step's
clock (the end of their last step; ties by worker), one each, round-robin over the failed
workers in worker order: the first survivor to finish takes the lowest failed worker's shard.
A survivor is already started and loaded with the step's weights, so the re-run waits for no
new worker (a Ray actor that died is replaced in the background, for the next call). The
re-run continues the survivor's own clock (``WorkerTask.after_s``): it starts once the
survivor is free and the failure has happened (sim clock: charged where it would have run;
wall clock: when the driver resubmits).

Token for token: coupled draws depend only on (seed, uid, position) and greedy decoding on
the policy alone (``rollout.sampling``), so a request re-run on another worker with the same
weights has the tokens it would have had on its own.

Idle jobs (``tail``, ``Backend.map_tail``) run in the first map only: a map that loses a
worker hands back no job outcome (backend.py, "tail jobs"), and the re-run runs none, so the
step's drafter keeps serving the next one.

No second chance: a failure during the re-run raises its ``WorkerFailed`` (it names the
survivor and the requests it was re-running). With no survivor, the first failure is raised.

The timeline marks both (``rollout.timeline``): a ``failed`` steps row for each lost worker,
the re-run's steps flagged ``rerun``, and each re-run request's ``failed_worker``.

On the dispatch path (``Backend.map_steps``, :func:`run_steps`: the workers advance together
and a ``rollout.dispatch.Dispatch`` moves work between them) the re-run happens inside the
call, and the survivors keep going. A lost worker takes its whole share with it (every
request it answered for, queued, running or finished: a run's outputs come back only at its
end, which it never reaches), and once every busy worker's clock has reached the failure
(on Ray at once: ``rollout.ray_steps``), that share, from scratch, goes to ``dispatch.lost``
with the survivors (by default dealt round-robin over them, the earliest clock first; Seer's
divided rollout puts it in its pool, longest predicted first), none of it starting before
the failure. The same rules hold: no
second chance (a worker lost while it holds a request that already re-runs raises, naming
the requests it held, the first failure in its ``__context__``), and with no survivor the
lowest worker's failure is raised. The timeline has the ``failed`` row and each re-run
request's ``failed_worker``, as above; no step is flagged ``rerun``, since a survivor's steps
mix its own requests with the re-run ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from .backend import Backend
from .failures import WorkerFailed, failure_row
from .idle import IdleRun, TailJobs
from .timeline import rollout_end_s
from .worker import WorkerResult, WorkerTask

__all__ = ["Shards", "run_shards", "run_steps"]


@dataclass
class Shards:
    """What the workers gave back for one rollout step: every request's ``WorkerResult``
    (the survivors', then the re-runs'), the ``failed`` steps rows of the lost workers,
    uid -> the worker that failed holding it, for each re-run request, and what the idle
    jobs handed back (none without a ``tail``, or after a lost worker)."""

    results: list[WorkerResult]
    failed_rows: list[dict] = field(default_factory=list)
    failed_worker: dict[int, int] = field(default_factory=dict)
    idle: IdleRun = field(default_factory=IdleRun)


def run_shards(backend: Backend, fn: Callable, tasks: list[WorkerTask],
               progress: Callable[[int], None] | None = None,
               tail: TailJobs | None = None) -> Shards:
    """``backend.map(fn, tasks, progress)`` (task i on worker i), or with ``tail``'s jobs in
    the idle windows (``backend.map_tail``), with each failed worker's shard re-run on a
    survivor (module docstring)."""
    try:
        if tail is None:
            return Shards(backend.map(fn, tasks, progress))
        results, idle = backend.map_tail(fn, tasks, tail, progress)
        return Shards(results, idle=idle)
    except WorkerFailed as failed:
        return _rerun(backend, fn, {task.worker: task for task in tasks}, failed, progress)


def _rerun(backend: Backend, fn: Callable, tasks: dict[int, WorkerTask], failed: WorkerFailed,
           progress) -> Shards:
    survivors = sorted(failed.results,
                       key=lambda w: (rollout_end_s(failed.results[w].steps), w))
    if not survivors:
        raise failed
    shares: dict[int, list[WorkerFailed]] = {}
    for i, lost in enumerate(failed.failures):
        shares.setdefault(survivors[i % len(survivors)], []).append(lost)
    reruns = [replace(tasks[w], requests=[q for lost in share for q in lost.requests],
                      after_s=max(lost.at_s or 0.0 for lost in share))
              for w, share in shares.items()]
    again = backend.map(fn, reruns, progress, workers=list(shares))  # a failure here raises
    return Shards([failed.results[w] for w in sorted(failed.results)] + list(again),
                  [failure_row(lost, 0) for lost in failed.failures],
                  {q.uid: lost.worker for lost in failed.failures for q in lost.requests})



def run_steps(backend: Backend, begin: Callable, tasks: list[WorkerTask], dispatch,
              progress: Callable[[int], None] | None = None,
              tail: TailJobs | None = None) -> Shards:
    """``backend.map_steps(begin, tasks, dispatch, progress, tail)``, the workers advanced
    together under ``dispatch``, as :class:`Shards`: a lost worker's share was re-run by the
    survivors inside the call (module docstring, "on the dispatch path"), and its value, a
    ``WorkerFailed``, becomes its ``failed`` row and its requests' ``failed_worker``."""
    values, idle = backend.map_steps(begin, tasks, dispatch, progress, tail)
    lost = [value for value in values if isinstance(value, WorkerFailed)]
    return Shards([value for value in values if not isinstance(value, WorkerFailed)],
                  [failure_row(failed, 0) for failed in lost],
                  {q.uid: failed.worker for failed in lost for q in failed.requests}, idle)
