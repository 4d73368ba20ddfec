"""The same RL steps on the local backend (sim clock) and on Ray (wall clock), side by side.

What notebook 08 shows: does the sim clock, which lays the local backend's one-after-another
workers side by side, predict what workers that really run in parallel take? Every system runs
the same GRPO steps from the same policy with coupled sampling, so the tokens are equal and
only the clocks differ (checked: ``tokens_equal``).

Glossary:

system       ``"local"``: the local backend with ``workers`` workers in this process, one
             after another (``makespan_s`` on the sim clock); ``"ray-k"``: k Ray actors in
             parallel (``makespan_s`` on the wall clock, from the driver's submit to the last
             worker's last step). Every worker has ``threads`` torch threads: the local run
             sets this process's threads to it, each actor is started with it.
wall_s       the driver's time for the rollout call (a local run: every worker in turn).
overhead_s   what Ray adds to a step outside the workers' steps: results back (``wall_s``
             minus ``makespan_s``) plus the new policy's weights out (``weights_s``:
             ``update_weights``, one ``ray.put``). 0 for the local backend, which shares the
             policy in memory.
dispatch_s   on Ray, the wait from the driver's submit to the first step of any worker
             (Ray's dispatch: the call reaching the actors), which no simulated worker has;
             0 for the local backend.
sim_error    the relative error of the sim clock's prediction of the workers' wall makespan,
             ``|sim - (wall - dispatch)| / (wall - dispatch)`` per step, for the local run
             against Ray with as many actors as it has workers: the sim clock times the
             workers' work, and Ray's dispatch is reported beside it (``dispatch_s``).
disturbed    ``disturbed_share`` and ``cpu_share`` of each system's steps (``Timeline.usage_s``,
             ``workbench.clock``: on Ray each actor measures its own process): a wall
             makespan stretched by other work on the machine says so.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace

import pandas as pd
import torch

from ..adapt import SpotConfig
from ..checks import check_int
from ..rollout import RolloutEngine
from ..rollout.backend import LocalBackend
from ..rollout.timeline_stats import usage_shares
from .config import GRPOConfig
from .grpo import GRPO
from .tlt import TLTTrainer, tokens_digest
from .variants import tlt_config

__all__ = ["BackendComparison", "compare_backends", "compare_idle_rules"]


@dataclass
class BackendComparison:
    """Per system and RL step: ``makespan_s``, ``dispatch_s``, ``wall_s``, ``weights_s``,
    ``overhead_s``, ``clock``, ``workers``, ``start_s`` (starting the workers, before any
    step: Ray's actors import torch and build their policy), the rollout's ``measured_s``,
    ``disturbed_s`` and ``cpu_s`` (``Timeline.usage_s``) and ``tokens_digest`` (module
    docstring) in ``steps``."""

    steps: pd.DataFrame

    def tokens_equal(self) -> bool:
        """Whether every system decoded the same tokens at every step."""
        return bool((self.steps.groupby("step")["tokens_digest"].nunique() == 1).all())

    def per_system(self) -> pd.DataFrame:
        """Mean makespan, wall time and overhead per step of each system."""
        return (self.steps.groupby("system", sort=False)[
            ["makespan_s", "dispatch_s", "wall_s", "weights_s", "overhead_s"]].mean()
            .reset_index())

    def sim_error(self, ray_system: str) -> pd.Series:
        """Per step, ``|sim - wall| / wall`` of the local run against ``ray_system``, Ray's
        dispatch taken out of its wall makespan (module docstring)."""
        by = self.steps.set_index(["system", "step"])
        sim = by.loc["local", "makespan_s"]
        wall = by.loc[ray_system, "makespan_s"] - by.loc[ray_system, "dispatch_s"]
        return ((sim - wall).abs() / wall).rename("sim_error")

    def usage(self, system: str) -> dict[str, float]:
        """``disturbed_share`` and ``cpu_share`` of ``system``'s steps, pooled by their
        seconds (``rollout.timeline_stats.usage_shares``)."""
        mine = self.steps[self.steps["system"] == system]
        return usage_shares(mine[["measured_s", "disturbed_s", "cpu_s"]].to_dict("records"))

    def metrics(self, ray_system: str) -> dict:
        """notebook 08's metrics.json figures against ``ray_system`` (e.g. ``"ray-2"``)."""
        per = self.per_system().set_index("system")
        ray_usage, sim_usage = self.usage(ray_system), self.usage("local")
        return {"ray_makespan_s": float(per.loc[ray_system, "makespan_s"]),
                "ray_dispatch_s_per_step": float(per.loc[ray_system, "dispatch_s"]),
                "ray_disturbed_share": ray_usage["disturbed_share"],
                "ray_cpu_share": ray_usage["cpu_share"],
                "sim_disturbed_share": sim_usage["disturbed_share"],
                "sim_makespan_s": float(per.loc["local", "makespan_s"]),
                "sim_error": float(self.sim_error(ray_system).median()),
                "ray_overhead_s_per_step": float(per.loc[ray_system, "overhead_s"]),
                "local_wall_s": float(per.loc["local", "wall_s"]),
                "ray_wall_s": float(per.loc[ray_system, "wall_s"]),
                "wall_speedup_ray": float(per.loc["local", "wall_s"] / per.loc[ray_system, "wall_s"]),
                "tokens_equal": self.tokens_equal()}


def compare_backends(policy, tokenizer, problems, reward, grpo: GRPOConfig, steps: int,
                     actors=(1, 2), threads: int = 1, ray_address: str | None = None,
                     log_dir=None, progress: bool = True) -> BackendComparison:
    """Run ``steps`` GRPO steps of ``grpo`` (its ``workers`` on the local backend; ``k``
    actors for each k of ``actors`` on Ray) from copies of ``policy``, with coupled sampling
    (``grpo``'s own sampling when greedy); every worker with ``threads`` torch threads. One
    Ray serves every actor count: the cluster at ``ray_address``, or a local instance started
    here, with its logs in ``log_dir`` (``workbench.ray_cluster.connect``), and shut down at
    the end."""
    import ray

    from ..ray_cluster import connect, resolve_address
    from ..rollout.ray_backend import RayBackend
    steps = check_int("steps", steps, 1)
    threads = check_int("threads", threads, 1)
    actors = [check_int("actors", k, 1) for k in actors]
    ray_address = resolve_address(ray_address)
    if grpo.rollout.temperature > 0 and grpo.rollout.spec_mode != "coupled":
        grpo = grpo.updated(spec_mode="coupled")  # the same tokens on every system
    systems = [("local", grpo.rollout.workers, lambda: LocalBackend())]
    systems += [(f"ray-{k}", k, lambda: RayBackend(ray_address, threads_per_worker=threads))
                for k in actors]
    started_ray = bool(actors) and connect(ray_address, log_dir=log_dir)
    rows = []
    try:
        for name, workers, make_backend in systems:
            backend = make_backend()
            try:
                rows += _run(name, policy, tokenizer, problems, reward,
                             grpo.updated(workers=workers), steps, backend, threads, progress)
            finally:
                backend.close()  # its actors; the Ray stays for the next system
    finally:
        if started_ray:
            ray.shutdown()
    return BackendComparison(pd.DataFrame(rows))


def _run(name, policy, tokenizer, problems, reward, grpo, steps, backend, threads, progress):
    """One system's steps: rollout timed on the driver, update, new weights pushed out."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)  # a local worker as an actor: ``threads`` threads
    try:
        model = copy.deepcopy(policy)
        engine = RolloutEngine(model, tokenizer, backend=backend)
        started = time.perf_counter()
        engine.start(grpo.rollout.workers)  # actors up before the clock runs
        start_s = time.perf_counter() - started
        trainer = GRPO(model, tokenizer, problems, reward, grpo, engine=engine)
        rows = []
        for step in range(steps):
            # 1) the rollout, timed on the driver: the workers' steps plus results back
            started = time.perf_counter()
            rl = trainer.rollout()
            wall = time.perf_counter() - started
            timeline = rl.result.timeline
            makespan = timeline.makespan_s
            # 2) the update, then its weights out to the workers that hold copies
            trainer.update(rl)
            started = time.perf_counter()
            engine.sync_policy()
            weights = time.perf_counter() - started
            rows.append({"system": name, "step": step, "workers": grpo.rollout.workers,
                         "clock": backend.clock, "start_s": start_s, "makespan_s": makespan, "wall_s": wall,
                         "weights_s": weights,
                         "overhead_s": (max(0.0, wall - makespan) + weights
                                        if backend.runs_copies else 0.0),
                         "dispatch_s": float(timeline.steps["start_s"].min()),
                         **timeline.usage_s(),
                         "tokens_digest": tokens_digest(rl.result)})
            if progress:
                print(f"{name} step {step}: makespan {makespan:.2f} s ({backend.clock}), "
                      f"driver {wall:.2f} s", flush=True)
        return rows
    finally:
        torch.set_num_threads(saved)


IDLE_RULES = ("first", "all")


def compare_idle_rules(policy, tokenizer, problems, reward, drafter_head, grpo: GRPOConfig,
                       steps: int, spot: SpotConfig | None = None,
                       progress: bool = True) -> pd.DataFrame:
    """Drafter training on every idle worker against the first finisher alone, on the same
    rollouts: two TLT trainers of the ``adaptive_drafter`` variant (static chain, spot
    trainer on; ``SpotConfig.idle_workers`` "all" and "first") from copies of ``policy``, one
    RL step each in turn (the order alternating), with coupled sampling, so that their tokens
    and policy updates are identical and only the drafter that serves them differs. One row
    per step and rule: ``drafter_steps``, ``drafter_workers``, ``drafter_window_s``,
    ``drafter_preempted``, ``accept_len`` (tau of the drafter that served the step) and
    ``tokens_digest``. ``spot``: the spot trainer's configuration, its rule aside."""
    steps = check_int("steps", steps, 1)
    spot = spot if spot is not None else SpotConfig()
    if grpo.rollout.temperature > 0:
        grpo = grpo.updated(spec_mode="coupled")
    trainers = {rule: TLTTrainer(copy.deepcopy(policy), tokenizer, problems, reward,
                                 tlt_config("adaptive_drafter", grpo,
                                            spot=replace(spot, idle_workers=rule)),
                                 drafter_head=drafter_head)
                for rule in IDLE_RULES}
    rows = []
    for step in range(steps):
        for rule in IDLE_RULES if step % 2 == 0 else IDLE_RULES[::-1]:
            row = trainers[rule].step()
            rows.append({"step": step, "rule": rule, **{k: row[k] for k in (
                "drafter_steps", "drafter_workers", "drafter_window_s", "drafter_preempted",
                "accept_len", "tokens_digest")}})
            if progress:
                print(f"step {step}, {rule} idle worker(s): {row['drafter_steps']} drafter steps "
                      f"on {row['drafter_workers']} workers, tau {row['accept_len']:.2f}",
                      flush=True)
    return pd.DataFrame(rows).sort_values(["step", "rule"], ignore_index=True)
