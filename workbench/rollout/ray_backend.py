"""The Ray backend: each worker a Ray actor, all of them really running in parallel.

:class:`RayBackend` keeps the ``rollout.backend.Backend`` protocol, so the engine, GRPO, TLT
and the spot trainer run on it unchanged, and its timelines are on the *wall* clock: every
worker's times count from one origin, the driver's wall time when a call is submitted, so the
steps table's makespan is the parallel step's real one (result transfer back excluded).

Glossary:

actor        a Ray actor process holding one :class:`~workbench.rollout.worker.Worker` (its
             policy, forward and drafter, built inside the actor by the start's factories),
             with torch pinned to its CPU share (``threads_per_worker`` threads and as many
             Ray CPUs) and, on a cluster with GPUs, one GPU of its own (the policy factory
             puts the model there; Ray makes it the actor's only visible GPU).
object store Ray's shared memory: a function, an idle job or a state dict goes in once per
             call (``ray.put``) and every actor reads it from there; nothing is pickled per
             actor. The start's factories go in once too, for a restarted actor to reuse.
tail         ``map_tail`` (backend.py, "tail jobs"): as each actor's shard comes back, the
             driver asks the tail for its job and submits it to that actor, which starts
             training while the other actors still decode; when the last shard is back, the
             driver sends every running job ``stop`` with the window's end (that shard's last
             step, on the step's wall clock), and collects the outcomes (``stop_wait_s``: at
             most the step in flight). An actor runs its work methods one at a time (its
             default concurrency group), and ``stop`` beside them (the ``control`` group, a
             thread of its own), so a stop reaches a job mid-step.
copies       whatever ``fn`` or an idle job holds travels as a copy: changes an actor makes
             to it never reach the driver (``runs_copies``). A *learning schedule* (the
             adaptive bandit, ``speculative.bandit.AdaptiveSchedule``) therefore learns, on
             each actor, in a copy of the driver's schedule as it was at the call; the steps
             table brings every decision back, and the engine hands it to the schedule's
             ``absorb``, which replays them: after the rollout the driver's schedule has
             learned what every actor saw (within the rollout, each actor learns from its
             own steps only). Tokens are unaffected (a schedule decides speed only).
loopback     a Ray this backend starts listens on 127.0.0.1 only (``workbench.ray_cluster``,
             where every user of Ray in the package reaches it).
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable, Sequence

import ray
import torch

from ..checks import check_int
from ..plugins import file_plugins
from ..ray_cluster import connect, known_cpus, resolve_address
from .backend import Backend, check_placement
from .failures import WorkerFailed, first_failure
from .idle import IdleRun, TailJobs, WindowEnd
from .ray_steps import RunHost, ray_failure, run_rounds
from .timeline import IdleWindow
from .worker import Worker

__all__ = ["RayBackend"]


class WorkerHost(RunHost):
    """An actor's body: one :class:`Worker` on the wall clock, built inside the actor, and
    its run of a dispatched rollout (``RunHost``). Its work methods run one at a time;
    :meth:`stop` runs beside them (module docstring, "tail")."""

    def __init__(self, index: int, factories: tuple, threads: int):
        torch.set_num_threads(threads)
        policy_factory, drafter_factory = factories
        model = policy_factory(index)
        drafter = drafter_factory(index, model) if drafter_factory is not None else None
        self.worker = Worker(index, model, drafter, "wall")
        self.window_end = WindowEnd()

    def ready(self) -> int:
        """The worker's index, once the factories have run (their failure raises here)."""
        return self.worker.index

    def call(self, fn: Callable, item, origin: float) -> tuple[object, float | None]:
        """``fn(worker, item)`` with the worker's clock counting from ``origin``; its value,
        and where the worker's idle window after it starts (``Worker.rollout_end_s``)."""
        self.worker.origin = origin
        self.window_end = WindowEnd()  # the window after this call: open until its stop
        return fn(self.worker, item), self.worker.rollout_end_s

    def load_weights(self, policy: dict | None, drafter: dict | None) -> None:
        self.worker.load_weights(policy, drafter)

    def run_idle(self, job, window: IdleWindow) -> tuple[object, list[dict]]:
        return self.worker.run_idle(job, window, self.window_end)

    @ray.method(concurrency_group="control")
    def stop(self, end_s: float) -> tuple[object, list[dict]] | None:
        """Close the idle window of the latest call at ``end_s``, and hand back at once what
        its job did by then (``Worker.idle_at``: the step in flight goes on beside the
        driver's next work, its update discarded); None when the job cannot say, or is not
        running: its run's return answers then."""
        self.window_end.close(end_s)
        return self.worker.idle_at(end_s)


class RayBackend(Backend):
    """N workers as Ray actors, in parallel, on the wall clock (module docstring).

    Args:
        address: a Ray cluster to attach to, ``"host:port"`` (or ``"ray://host:port"``, a Ray
            client); ``None`` reads ``$RAY_ADDRESS``, and without it a local instance starts
            on loopback with ``num_cpus`` CPUs and no dashboard. An address is checked to
            answer (within ``ray_cluster.CONNECT_TIMEOUT_S``) before anything starts. A cluster with
            token authentication (Ray's default for one that ``ray.init`` started) also
            needs ``RAY_AUTH_MODE=token`` and its token (``~/.ray/auth_token`` or
            ``$RAY_AUTH_TOKEN``). A Ray already initialised in this process is reused as it is.
        num_cpus: CPUs of a local instance (default: the machine's count).
        threads_per_worker: torch threads of each actor, and the Ray CPUs it holds.
        log_dir: where a local instance keeps its session folder, logs included (Ray's temp
            root, reached through a short link: ``ray_cluster._ray_root``; default Ray's own,
            ``/tmp/ray``).

    ``start`` refuses more workers x threads than the cluster has CPUs (or more workers than
    it has GPUs, where it has any) before any actor starts, and a local Ray too small for them
    before it starts that Ray; :meth:`check_fits` says so without starting anything. A
    worker that dies or raises makes the call raise ``WorkerFailed`` naming it, with the
    other workers' results (a ValueError, bad input, passes through); the others finish
    their part first, so the backend is idle after the raise (a job lost in its idle window
    is reported in ``IdleRun.failed``: backend.py, "worker fault"). An actor that died is
    replaced at once, in the background (its factories run again, the latest weights queued
    behind them); :meth:`restart` does the same and waits. ``close`` kills the actors and
    undoes this backend's ``ray.init``: a local instance it started shuts down, a cluster it
    attached to is left (only this process disconnects)."""

    name, clock = "ray", "wall"
    runs_copies = dispatches = True

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 threads_per_worker: int = 1, log_dir: str | os.PathLike | None = None):
        self.address = resolve_address(address)
        self.num_cpus = check_int("num_cpus", num_cpus, 1, optional="the machine's CPU count")
        self.threads_per_worker = check_int("threads_per_worker", threads_per_worker, 1)
        self.log_dir = None if log_dir is None else Path(log_dir).resolve()
        self._actors: list = []
        self._factories = None       # ObjectRef of (policy_factory, drafter_factory)
        self._weights = (None, None)  # ObjectRefs of the latest policy and drafter weights
        self._gpus = 0               # GPUs per actor
        self._initialised_ray = False  # this backend called ray.init: close undoes it

    @property
    def num_workers(self) -> int:
        return len(self._actors)

    # ---- life ---------------------------------------------------------------------------
    def start(self, policy_factory, drafter_factory=None, num_workers: int = 1) -> None:
        num_workers = check_int("num_workers", num_workers, 1)
        if not ray.is_initialized():
            self.check_fits(num_workers)  # a local Ray that cannot hold them never starts
        self._connect()
        self._gpus = self._placement(num_workers)
        self._kill_actors()
        _ship_file_plugins_by_value()  # a plugin drafter's class in the drafter factory
        self._factories = ray.put((policy_factory, drafter_factory))
        self._weights = (None, None)
        self._actors = [self._spawn(w) for w in range(num_workers)]
        self._gather([actor.ready.remote() for actor in self._actors], range(num_workers),
                     revive=False)

    def check_fits(self, num_workers: int) -> None:
        """Refuse ``num_workers`` actors of ``threads_per_worker`` CPUs each that the Ray
        cannot hold, where its CPUs are known without starting or attaching anything
        (``ray_cluster.known_cpus``: this process's Ray, or a local one yet to start), so that
        a caller refuses before it writes a file or starts Ray. A cluster at an address is
        checked by :meth:`start`, once attached."""
        cpus = known_cpus(self.address, self.num_cpus)
        if cpus is not None:
            self._check_cpus(check_int("num_workers", num_workers, 1), cpus)

    def restart(self, worker: int) -> None:
        """Give ``worker`` a fresh actor (its old one killed, dead or alive), built by the
        start's factories and loaded with the latest weights pushed by ``update_weights``."""
        if not self._actors:
            raise ValueError("the backend has no workers to restart: start it first")
        worker = check_int("worker", worker, 0, self.num_workers - 1)
        refs = self._revive(worker)
        self._gather(refs, [worker] * len(refs), revive=False)

    def close(self) -> None:
        self._kill_actors()
        if self._initialised_ray:
            ray.shutdown()
            self._initialised_ray = False

    # ---- work ---------------------------------------------------------------------------
    def map(self, fn, items, progress=None, workers=None):
        workers = check_placement(items, workers, self.num_workers)
        refs, origin, held = self._submit(fn, items, workers)
        values, failures = self._collect(refs, workers, origin, held, progress)
        values = [None if value is None else value[0] for value in values]  # (value, start)
        _raise_failures(failures, workers, values)
        return values

    def map_tail(self, fn, items, tail: TailJobs, progress=None):
        workers = check_placement(items, None, self.num_workers)
        refs, origin, held = self._submit(fn, items, workers)
        values, starts, failures, jobs = [None] * len(refs), {}, {}, {}
        try:
            for i, arrived in self._arrivals(refs, workers, origin, held, progress):
                if isinstance(arrived, Exception):
                    failures[i] = arrived
                    continue
                values[i], starts[workers[i]] = arrived
                if len(starts) + len(failures) < len(refs) and not failures:
                    window = IdleWindow(workers[i], starts[workers[i]], math.inf)
                    job = tail.job(window, [value for value in values if value is not None])
                    if job is not None:  # on its actor now, while the others still decode
                        jobs[window.worker] = self._actors[window.worker].run_idle.remote(
                            job, window)
        finally:  # whatever happens to the map, no job waits for a stop that never comes
            run = self._stop(jobs, starts, max(starts.values(), default=0.0))  # last shard's end
        self._settle(failures, workers)
        _raise_failures(failures, workers, values)  # the jobs' outcomes dropped (backend.py)
        return values, run

    def map_steps(self, begin, items, dispatch, progress=None, tail=None):
        """Rounds of one step of every busy actor, ``dispatch`` asked between them where work
        goes (``rollout.ray_steps``); a dead actor is replaced after. No tail jobs run here."""
        if tail is not None:
            raise ValueError("the 'ray' backend runs no tail jobs beside a dispatch; accepted: "
                             "tail=None, or the local backend")
        workers = check_placement(items, None, self.num_workers)
        values = run_rounds([self._actors[w] for w in workers], begin, items, dispatch, progress)
        self._settle({w: v for w, v in enumerate(values) if isinstance(v, WorkerFailed)}, workers)
        return values, IdleRun()

    def update_weights(self, policy=None, drafter=None) -> None:
        refs = tuple(None if state is None else ray.put(state) for state in (policy, drafter))
        # the latest weights first: an actor revived during the load gets these
        self._weights = tuple(new if new is not None else old
                              for new, old in zip(refs, self._weights))
        self._gather([actor.load_weights.remote(*refs) for actor in self._actors],
                     range(self.num_workers))

    # ---- helpers ------------------------------------------------------------------------
    def _submit(self, fn, items: list, workers: list[int]) -> tuple[list, float, list]:
        """``fn`` over ``items`` on ``workers``' actors (``fn`` put once): the refs, the wall
        time that is every worker's 0 (the wall makespan includes shipping), and the requests
        each item holds."""
        origin = time.time()
        _ship_file_plugins_by_value()  # a plugin arm in fn's schedule, a plugin drafter
        fn_ref = ray.put(fn)
        refs = [self._actors[w].call.remote(fn_ref, item, origin)
                for w, item in zip(workers, items)]
        return refs, origin, [list(getattr(item, "requests", ())) for item in items]

    def _connect(self) -> None:
        """Attach to ``address``, reuse this process's Ray, or start one on loopback
        (``workbench.ray_cluster.connect``)."""
        if connect(self.address, self.num_cpus, self.log_dir):
            self._initialised_ray = True

    def _placement(self, num_workers: int) -> int:
        """GPUs per actor (1 on a cluster with GPUs, else 0), after checking that the
        cluster holds ``num_workers`` actors of ``threads_per_worker`` CPUs."""
        resources = ray.cluster_resources()
        self._check_cpus(num_workers, resources.get("CPU", 0))
        where = self.address or "the local Ray instance"
        gpus = resources.get("GPU", 0)
        if 0 < gpus < num_workers:
            raise ValueError(f"num_workers={num_workers} actors need a GPU each, but {where} "
                             f"has {gpus:g}; accepted: at most {gpus:g} workers")
        return 1 if gpus else 0

    def _check_cpus(self, num_workers: int, cpus: float) -> None:
        """Refuse ``num_workers`` x ``threads_per_worker`` CPUs more than ``cpus``."""
        need = num_workers * self.threads_per_worker
        if cpus < need:
            raise ValueError(
                f"num_workers={num_workers} x threads_per_worker={self.threads_per_worker} "
                f"need {need} CPUs, but {self.address or 'the local Ray instance'} has "
                f"{cpus:g}; accepted: at most {cpus:g} CPUs in all (fewer workers or threads, "
                "or a Ray with more CPUs)")

    def _revive(self, worker: int) -> list:
        """Give ``worker`` a fresh actor (its old one killed, dead or alive), built by the
        start's factories, with the latest weights queued behind them; the refs of its start
        and of that load, to wait on (or not)."""
        ray.kill(self._actors[worker])
        actor = self._actors[worker] = self._spawn(worker)
        refs = [actor.ready.remote()]
        if self._weights != (None, None):
            refs.append(actor.load_weights.remote(*self._weights))
        return refs

    def _spawn(self, worker: int):
        host = ray.remote(concurrency_groups={"control": 1})(WorkerHost).options(
            num_cpus=self.threads_per_worker, num_gpus=self._gpus)
        return host.remote(worker, self._factories, self.threads_per_worker)

    def _kill_actors(self) -> None:
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    def _gather(self, refs: list, workers: Sequence[int], revive: bool = True) -> list:
        """The values of ``refs`` (``refs[i]`` ran on worker ``workers[i]``), in order, once
        all are done; a failure raises (:func:`~workbench.rollout.backend.first_failure`)."""
        values, failures = self._collect(refs, workers, time.time(), revive=revive)
        if failures:
            raise first_failure(list(failures.values()), {})
        return values

    def _collect(self, refs: list, workers: Sequence[int], since: float,
                 held: list | None = None, progress: Callable[[int], None] | None = None,
                 revive: bool = True) -> tuple[list, dict[int, Exception]]:
        """The values of ``refs`` (``refs[i]`` ran on worker ``workers[i]`` holding the
        requests ``held[i]``) once all are done, ``None`` where one failed, and the failures
        by position (:meth:`_arrivals`), settled (:meth:`_settle`)."""
        values, failures = [None] * len(refs), {}
        for i, arrived in self._arrivals(refs, workers, since, held, progress):
            if isinstance(arrived, Exception):
                failures[i] = arrived
            else:
                values[i] = arrived
        self._settle(failures, workers, revive)
        return values, failures

    @staticmethod
    def _arrivals(refs: list, workers: Sequence[int], since: float, held: list | None = None,
                  progress: Callable[[int], None] | None = None):
        """``(i, value)`` for each of ``refs`` as it is done, the first done first, or ``(i,
        failure)`` (:func:`_failure`, its ``at_s`` counted from the wall time ``since``);
        ``progress`` is told each worker's request count as its value arrives."""
        position = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            (ref,), pending = ray.wait(pending, num_returns=1)
            i = position[ref]
            try:
                value = ray.get(ref)
            except ray.exceptions.RayError as exc:
                yield i, ray_failure(workers[i], exc, held[i] if held is not None else (),
                                  time.time() - since)
                continue
            if progress is not None and held is not None:
                progress(len(held[i]))
            yield i, value

    def _settle(self, failures: dict[int, Exception], workers: Sequence[int],
                revive: bool = True) -> None:
        """After a call's ``failures`` (by position): an actor that died is revived (unless
        ``revive`` is false: its start is what failed); a ValueError (bad input) is raised,
        the lowest worker's."""
        order = sorted(failures, key=lambda i: workers[i])
        dead = {workers[i] for i in order if isinstance(failures[i], WorkerFailed)
                and isinstance(failures[i].cause, ray.exceptions.RayActorError)}
        for worker in sorted(dead) if revive else ():
            self._revive(worker)
        bad = [failures[i] for i in order if isinstance(failures[i], ValueError)]
        if bad:
            raise bad[0]

    def _stop(self, jobs: dict, starts: dict[int, float], end_s: float) -> IdleRun:
        """Stop the running ``jobs`` (worker -> the ref of its job) at ``end_s`` on the step's
        clock: their :class:`IdleRun`, in the order they started, from what each stop handed
        back (``WorkerHost.stop``), or, for a job that could not say, from its run once it
        returns; with the seconds waited (a job that died is a failure of its window, its
        ``failed`` row 0 long: the driver sees it only now)."""
        since, workers = time.time(), list(jobs)
        stops = [self._actors[w].stop.remote(end_s) for w in workers]
        runs, failures = self._collect(stops, workers, since)
        # a job that could not say what it did by the end (or was not running) answers by
        # its run's return; the others' step in flight is not waited for
        waiting = [i for i, run in enumerate(runs) if run is None and i not in failures]
        done, lost = self._collect([jobs[workers[i]] for i in waiting],
                                   [workers[i] for i in waiting], since)
        for j, i in enumerate(waiting):
            runs[i] = done[j]
            if j in lost:
                failures[i] = lost[j]
        for failed in failures.values():
            failed.at_s = None  # seen only now: when in its window it failed is unknown
        windows = [IdleWindow(w, starts[w], end_s) for w in workers]
        return IdleRun.of(windows, [failures.get(i, runs[i]) for i in range(len(workers))],
                          time.time() - since)


def _ship_file_plugins_by_value() -> None:
    """Have Ray pickle the classes of the plugins loaded from files by value (what a
    function, item or idle job holds of them travels whole; ``plugins.file_plugins``): an
    actor cannot import a module named after a file on the driver. Idempotent; called before
    anything is put, since a plugin may be loaded after the backend started."""
    for module in file_plugins():
        ray.cloudpickle.register_pickle_by_value(module)


def _raise_failures(failures: dict[int, Exception], workers: list[int], values: list) -> None:
    """Raise the lowest failed worker's :class:`WorkerFailed` of a map whose ``failures`` (by
    position) are settled, with the finished workers' ``values``; nothing when none failed."""
    if failures:
        raise first_failure(list(failures.values()),
                            {w: v for i, (w, v) in enumerate(zip(workers, values))
                             if i not in failures})

