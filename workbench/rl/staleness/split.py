"""A staleness run on two cores: the trajectory in one process, the drafters in another.

On one core a lead-setting step's GRPO and its measuring and training of the drafters cost
the same order of time (RESULTS.md, ``staleness_400``); the two halves only meet through the
step's rollout, so they can run side by side. :class:`StalenessTrajectory` runs GRPO (rollout with harvest, update) and, after
each rollout, puts the step's observation on the spool (:mod:`workbench.rl.staleness.spool`);
:class:`SplitObserver` takes them in step order and runs steps 2) and 3) of
:meth:`~workbench.rl.staleness.run.StalenessRun.step` on them with the same
:class:`~workbench.rl.staleness.observer.StalenessObserver`, on its own copy of the policy.
:func:`split_history` joins the two processes' rows by step: the one-process run's history,
row for row (wall seconds aside).

Each process checkpoints its own state into its own folder; a resumed pair goes on from its
checkpoints and the spool. The observer deletes an observation only once its checkpoint
covers it, so a resumed observer finds every step after its checkpoint on the spool (or
written again by the resumed trajectory, identically: the trajectory is deterministic).
"""
from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from ...checks import check_choice, check_int
from ...tasks import Problem, exact_match_reward
from ..checkpoint import has_state, load_state, save_state, saved_config
from ..grpo import GRPO
from ..loop import RLLoop
from ..setup import rl_setup
from .observer import StalenessObserver
from .run import (StalenessConfig, check_run_inputs, check_same_config,
                        held_out_accuracy, record_step, run_steps)
from .spool import Observation, Spool, replay_backend

__all__ = ["StalenessTrajectory", "SplitObserver", "joined_rows", "split_history",
           "split_setup", "split_state", "run_side_by_side", "trajectory_step",
           "clear_for_resume"]

TRAJECTORY_FILE, OBSERVER_FILE = "trajectory_state.pt", "observer_state.pt"


def _detached(policy) -> dict:
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


class StalenessTrajectory(RLLoop):
    """The trajectory process: GRPO on ``config.grpo``, each step's observation on ``spool``
    before its update, held-out accuracy as ``StalenessRun``'s (``config.eval_every``), in
    the RL loop shell (:class:`~workbench.rl.loop.RLLoop`; its step checkpoints every
    ``config.checkpoint_every`` steps, ``staleness.record_step``).

    Args:
        policy, tokenizer, problems, reward, held_out: as ``StalenessRun``'s.
        config: a ``StalenessConfig`` (the observer's must be the same).
        spool: the :class:`~workbench.rl.staleness.spool.Spool` it writes.
        checkpoint_dir: its own checkpoint folder (not the observer's); resumed from.
    """

    STATE_FILE = TRAJECTORY_FILE

    def __init__(self, policy, tokenizer, problems: list[Problem], spool: Spool,
                 reward=exact_match_reward, config: StalenessConfig | None = None,
                 held_out: list[Problem] | None = None,
                 checkpoint_dir: str | os.PathLike | None = None):
        self.config = c = check_run_inputs(config, held_out, checkpoint_dir)
        self.tokenizer, self.held_out, self.spool = tokenizer, held_out, spool
        self._evals: list[dict] = []
        super().__init__(GRPO(policy, tokenizer, problems, reward, c.grpo), checkpoint_dir)

    def _step(self) -> dict:
        """One RL step: wait for room on the spool, rollout, observation, update; its GRPO
        row (the observer's figures join it in :func:`split_history`)."""
        grpo = self.grpo
        self.spool.wait_for_room(grpo.rl_step)
        weights = _detached(grpo.model)  # as they sample this step
        rl = grpo.rollout(harvest=True)
        self.timelines[rl.step] = rl.result.timeline
        self.spool.put(Observation(rl.step, weights, rl, grpo.engine.backend.recorders))
        row = grpo.update(rl)
        record_step(self)
        return row

    def _evaluate(self) -> None:
        self._evals.append(held_out_accuracy(self.grpo.model, self.tokenizer, self.held_out,
                                             self.config, self.rl_step))

    def run_to(self, steps: int, on_step=None) -> pd.DataFrame:
        """Run until ``steps`` RL steps are done, as ``StalenessRun.run_to``; GRPO's rows."""
        try:
            run_steps(self, check_int("steps", steps, 0), on_step=on_step)
        finally:
            self.close_log()
        return self.grpo.history

    @property
    def rows(self) -> list[dict]:
        """GRPO's row of each step done."""
        return self.grpo.rows

    @property
    def evals(self) -> pd.DataFrame:
        """Held-out greedy accuracy: ``step`` (RL steps done), ``accuracy``."""
        return pd.DataFrame(self._evals, columns=["step", "accuracy"])

    def _checkpoint_due(self) -> bool:
        """Never after :meth:`run`'s steps: the step checkpoints itself when due."""
        return False

    def _own_state(self) -> dict:
        return {"config": repr(self.config), "evals": list(self._evals)}

    def load_state_dict(self, state: dict) -> None:
        check_same_config(state, self.config, self.checkpoint_dir)
        super().load_state_dict(state)

    def _load_own_state(self, state: dict) -> None:
        self._evals = list(state["evals"])


class SplitObserver:
    """The observer process: ``config.drafters`` on its own ``policy`` (any weights: each
    observation's are loaded into it in place), steps 2) and 3) of every observation on
    ``spool`` in step order.

    Args:
        policy, tokenizer, drafter_head, config: as ``StalenessRun``'s (the same config as
            the trajectory's).
        spool: the :class:`~workbench.rl.staleness.spool.Spool` it reads.
        checkpoint_dir: its own checkpoint folder (not the trajectory's); resumed from.
    """

    def __init__(self, policy, tokenizer, drafter_head, config: StalenessConfig, spool: Spool,
                 checkpoint_dir: str | os.PathLike | None = None):
        if not isinstance(config, StalenessConfig):
            raise ValueError(f"config must be a StalenessConfig, got {type(config).__name__}")
        self.config, self.policy, self.spool = config, policy, spool
        self.checkpoint_dir = checkpoint_dir
        self.observer = StalenessObserver(policy, tokenizer, drafter_head, config)
        self.rows: list[dict] = []
        self.rl_step = 0  # the next step to observe
        if checkpoint_dir is not None and has_state(checkpoint_dir, OBSERVER_FILE):
            state = load_state(checkpoint_dir, OBSERVER_FILE)
            check_same_config(state, config, checkpoint_dir)
            self.observer.load_state_dict(state)
            self.rows, self.rl_step = list(state["rows"]), int(state["rl_step"])
        spool.mark_consumed(self.rl_step)  # back to the checkpoint: later steps again

    def step(self) -> dict:
        """Observe the next step: its weights into the policy, then steps 2) and 3); its row."""
        obs = self.spool.take(self.rl_step)
        self.policy.load_state_dict(obs.policy)  # in place: the drafters stay bound to it
        backend = replay_backend(self.policy, obs.recorders)
        row = {"step": obs.step, **self.observer.observe(obs.rl, backend)}
        self.rows.append(row)
        self.rl_step += 1
        self.spool.mark_consumed(self.rl_step)
        if self.checkpoint_dir is None:
            self.spool.drop_before(self.rl_step)
        elif self.rl_step % self.config.checkpoint_every == 0:
            self.save_checkpoint()
        return row

    def run_to(self, steps: int, on_step=None) -> pd.DataFrame:
        """Observe until ``steps`` steps are done; the observer's rows."""
        check_int("steps", steps, 0)
        while self.rl_step < steps:
            row = self.step()
            if on_step is not None:
                on_step(row)
        if self.checkpoint_dir is not None:
            self.save_checkpoint()
        return pd.DataFrame(self.rows)

    @property
    def positions(self) -> pd.DataFrame:
        return self.observer.positions

    def save_checkpoint(self):
        """Write the observer's state, then delete the observations it covers."""
        state = {"config": repr(self.config), "rl_step": self.rl_step, "rows": list(self.rows),
                 **self.observer.state_dict()}
        path = save_state(self.checkpoint_dir, OBSERVER_FILE, state)
        self.spool.drop_before(self.rl_step)
        return path


def joined_rows(trajectory_rows: list[dict], observer_rows: list[dict]) -> list[dict]:
    """The one-process rows: each GRPO row (:attr:`StalenessTrajectory.rows`) with the
    observer's row of its step (:attr:`SplitObserver.rows`) over it, whose
    ``idle_fraction`` and ``wasted_fraction`` count the drafters' training."""
    by_step = {row["step"]: row for row in observer_rows}
    missing = [row["step"] for row in trajectory_rows if row["step"] not in by_step]
    if missing:
        raise ValueError(f"the observer has no row of steps {missing}: run it to the "
                         "trajectory's step")
    return [{**row, **{k: v for k, v in by_step[row["step"]].items() if k != "step"}}
            for row in trajectory_rows]


def split_history(trajectory_rows: list[dict], observer_rows: list[dict]) -> pd.DataFrame:
    """The one-process history of a pair's rows (:func:`joined_rows`)."""
    return pd.DataFrame(joined_rows(trajectory_rows, observer_rows))


def split_state(trajectory_dir: str | os.PathLike, observer_dir: str | os.PathLike) -> dict:
    """A one-process ``StalenessRun`` checkpoint state from a finished pair's checkpoints
    (``StalenessRun.load_state_dict``): the trajectory's GRPO and held-out accuracy, the
    observer's drafters and tau by position, the rows joined (:func:`split_history`)."""
    trajectory = load_state(trajectory_dir, TRAJECTORY_FILE)
    observer = load_state(observer_dir, OBSERVER_FILE)
    config = saved_config(trajectory["config"])
    if config != saved_config(observer["config"]):
        raise ValueError(f"the checkpoints in {str(trajectory_dir)!r} and "
                         f"{str(observer_dir)!r} were made with different configurations")
    grpo = dict(trajectory["grpo"])
    grpo["rows"] = joined_rows(grpo["rows"], observer["rows"])
    return {"config": config, "grpo": grpo, "drafters": observer["drafters"],
            "positions": observer["positions"], "evals": trajectory["evals"]}


def trajectory_step(trajectory_dir: str | os.PathLike) -> int:
    """The RL step a trajectory process resumes from: its checkpoint's in ``trajectory_dir``
    (0 without one)."""
    if not has_state(trajectory_dir, TRAJECTORY_FILE):
        return 0
    return int(load_state(trajectory_dir, TRAJECTORY_FILE)["grpo"]["rl_step"])


def clear_for_resume(spool: Spool, trajectory_dir: str | os.PathLike) -> int:
    """Before a pair starts (again): delete the spool's observations that the trajectory will
    write anew (``Spool.drop_from`` its checkpoint's step), so that the observer, which may
    start first, never takes a stopped run's. The step the trajectory resumes from."""
    step = trajectory_step(trajectory_dir)
    spool.drop_from(step)
    return step


def split_setup(role: str, config: StalenessConfig, spool: Spool,
                checkpoint_dir: str | os.PathLike | None = None, model: str = "default",
                task: str = "running_sum", rl_problems: int = 4000, eval_problems: int = 200,
                reward: str = "exact", *, drafter="auto", fit=None):
    """The ``role`` (``"trajectory"`` or ``"observer"``) process of a two-core run, as
    ``staleness_setup`` makes a one-process one (the same ``rl_setup``: the observer's
    policy is loaded too, then overwritten by each observation's weights)."""
    check_choice("role", role, ("trajectory", "observer"))
    if not isinstance(config, StalenessConfig):
        raise ValueError(f"config must be a StalenessConfig, got {type(config).__name__}")
    if checkpoint_dir is not None and Path(checkpoint_dir).is_file():
        raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} is an existing file; it "
                         "must be a folder (created if missing)")
    variants = ["static_sd"] if role == "observer" else ["baseline"]  # the head, or none
    s = rl_setup(model, task, rl_problems, eval_problems, reward, drafter=drafter,
                 variants=variants, fit=fit)
    if role == "observer":
        return SplitObserver(s.policy, s.tokenizer, s.drafter_head, config, spool,
                             checkpoint_dir)
    return StalenessTrajectory(s.policy, s.tokenizer, s.pool, spool, s.reward, config,
                               s.held_out, checkpoint_dir)


def run_side_by_side(targets: dict[str, tuple[Callable, tuple]], threads: int = 1,
                     poll_s: float = 0.5) -> None:
    """Run each ``name: (fn, args)`` of ``targets`` as a process of its own (the spawn
    method, ``OMP_NUM_THREADS=threads``) and wait for all. When one fails (its traceback is
    on stderr), the others are stopped and a ``RuntimeError`` names it and its exit code."""
    check_int("threads", threads, 1)
    context = multiprocessing.get_context("spawn")
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # what a spawned child starts with
    try:
        procs = {name: context.Process(target=fn, args=args, name=name)
                 for name, (fn, args) in targets.items()}
        for proc in procs.values():
            proc.start()
    finally:
        if old is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = old
    try:
        while any(proc.is_alive() for proc in procs.values()):
            failed = [n for n, p in procs.items() if p.exitcode not in (None, 0)]
            if failed:
                break
            time.sleep(poll_s)
        failed = [n for n, p in procs.items() if p.exitcode not in (None, 0)]
    finally:
        for proc in procs.values():  # a failure, or an interrupt of this process
            if proc.is_alive():
                proc.terminate()
            proc.join()
    if failed:
        raise RuntimeError(f"the {failed[0]} process failed (exit code "
                           f"{procs[failed[0]].exitcode}; its error is above); the others "
                           f"({[n for n in procs if n != failed[0]]}) were stopped")
