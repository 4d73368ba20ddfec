"""The shell every RL trainer runs in: one GRPO run, its checkpoint, history, timelines and log.

Why one shell: TLT (``rl.tlt``), the long-tail remedies (``rl.remedies``) and the staleness
study (``rl.staleness``) differ only in what one step does and in the state that step keeps;
the loop around it (resume from an atomic checkpoint, ``run(steps)``, the history, every
step's timeline, per-step scalars to TensorBoard, closing the backend) is the same, so it is
written here once. A trainer derives from :class:`RLLoop`, builds its :class:`~workbench.rl.
grpo.GRPO` and its parts, then calls ``RLLoop.__init__`` (which resumes), and supplies
:meth:`RLLoop._step` (one step; its history row) and, where it keeps state of its own,
:meth:`RLLoop._own_state` and :meth:`RLLoop._load_own_state`. ``RLLoop`` itself is plain
GRPO: its step is a rollout and an update.

What others read of a run is its :attr:`RLLoop.record` (a :class:`RunRecord`: the history
rows, the timeline of each step, what its adaptive engine learned), a snapshot, so no reader
reaches into the trainer; what they may ask of its workers are :meth:`RLLoop.start_workers`
and :meth:`RLLoop.policy_changed`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd

from ..progress import tqdm
from ..scalar_log import check_report_to, scalar_log
from .checkpoint import has_state, load_state, save_state
from .grpo import GRPO

__all__ = ["RLLoop", "RunRecord"]


@dataclass(frozen=True)
class RunRecord:
    """What one RL run has to show, read by the ablation and the figures (a snapshot: the
    run goes on without it).

    Args:
        rows: one history row per RL step done (``RLLoop.history``'s rows).
        timelines: RL step -> the ``Timeline`` of its (first) rollout.
        learned: what the run's adaptive engine learned of this machine
            (``AdaptiveSchedule.learned``: per bucket, plain's and the best SD arm's
            tokens/s and the arm it now chooses); None without an adaptive engine.
        compile_choices: with ``RolloutConfig.compile="auto"``, the path each bucket's
            steps decode on (``{bucket: "compiled" | "eager"}``, as the rollouts returned
            them: ``RolloutResult.compile_choices``), saved in the run's checkpoint and
            reused, untimed, when it resumes (``GRPO.load_state_dict``).
    """

    rows: list = field(default_factory=list)
    timelines: dict = field(default_factory=dict)
    learned: pd.DataFrame | None = None
    compile_choices: dict = field(default_factory=dict)

    @property
    def history(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def check_checkpoint_dir(checkpoint_dir) -> None:
    """Refuse a ``checkpoint_dir`` that is an existing file (it must be a folder)."""
    if checkpoint_dir is not None and Path(checkpoint_dir).is_file():
        raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} is an existing file; it "
                         "must be a folder (created if missing)")


class RLLoop:
    """One GRPO run in the shell (module docstring): plain GRPO steps, or a subclass's.

    Args:
        grpo: the run's :class:`~workbench.rl.grpo.GRPO` (its policy, optimizer, engine).
        checkpoint_dir: atomic checkpoint of the whole loop after each step of :meth:`run`;
            a run built on a folder that holds one resumes from it.
        report_to: ``"none"`` or ``"tensorboard"``: every numeric column of each step's
            history row as a scalar (``workbench.scalar_log``), in ``run_dir/tensorboard``;
            a resumed run writes no step twice.
        run_dir: the run's folder, where its log goes (default: ``checkpoint_dir``).
    """

    STATE_FILE: ClassVar[str] = "rl_state.pt"
    drafter = spot = schedule = None  # TLT's parts (``TLTConfig.parts``), where a run has them

    def __init__(self, grpo: GRPO, checkpoint_dir: str | os.PathLike | None = None,
                 report_to: str = "none", run_dir: str | os.PathLike | None = None):
        check_checkpoint_dir(checkpoint_dir)
        self.run_dir = run_dir if run_dir is not None else checkpoint_dir
        check_report_to(report_to, self.run_dir)
        self.grpo, self.checkpoint_dir, self.report_to = grpo, checkpoint_dir, report_to
        self.timelines: dict[int, object] = {}  # RL step -> its (first) rollout's timeline
        self._log = None  # opened at the first step (it knows where the run resumed)
        if checkpoint_dir is not None and self.has_checkpoint(checkpoint_dir):
            self.load_checkpoint(checkpoint_dir)

    # ---- what a trainer supplies --------------------------------------------------------
    def _step(self) -> dict:
        """One RL step; its history row (plain GRPO here; a trainer's own in a subclass)."""
        rl = self.grpo.rollout()
        self.timelines[rl.step] = rl.result.timeline
        return self.grpo.update(rl)

    def _own_state(self) -> dict:
        """The trainer's state beyond GRPO's and TLT's parts, for its checkpoint."""
        return {}

    def _load_own_state(self, state: dict) -> None:
        """Take back what :meth:`_own_state` saved."""

    def _checkpoint_due(self) -> bool:
        """Whether :meth:`run` checkpoints after the step just done (every step here)."""
        return True

    # ---- the run ------------------------------------------------------------------------
    @property
    def model(self):
        return self.grpo.model

    @property
    def rl_step(self) -> int:
        """RL steps done (one history row each, with or without an update)."""
        return len(self.grpo.rows)

    @property
    def history(self) -> pd.DataFrame:
        return self.grpo.history

    @property
    def record(self) -> RunRecord:
        """The run so far (:class:`RunRecord`), for readers outside the trainer."""
        learned = self.schedule.learned() if self.schedule is not None else None
        return RunRecord(list(self.grpo.rows), dict(self.timelines), learned,
                         dict(self.grpo.compile_choices))

    def step(self) -> dict:
        """One RL step (the trainer's), its row sent to the run's log; returns the row."""
        if self._log is None:
            done = self.grpo.rows
            self._log = scalar_log(self.report_to, self.run_dir, self.rl_step,
                                   sum(float(r.get("step_s", 0.0)) for r in done))
        row = self._step()
        self._log.row(row["step"], row)
        return row

    def run(self, steps: int, progress: bool = True, desc: str = "RL") -> pd.DataFrame:
        """``steps`` more RL steps (checkpointing after each when ``checkpoint_dir`` is set);
        the history."""
        try:
            for _ in tqdm(range(steps), desc=desc, disable=not progress):
                self.step()
                if self.checkpoint_dir is not None and self._checkpoint_due():
                    self.save_checkpoint()
        finally:
            self.close_log()
        return self.history

    def close_log(self) -> None:
        """Flush and close the run's log (a later step opens it again where the run stands)."""
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        """Close the log and the backend made from a name (``GRPO.close``)."""
        self.close_log()
        self.grpo.close()

    # ---- the workers --------------------------------------------------------------------
    def start_workers(self, workers: int, policy_factory) -> None:
        """Start the run's backend with ``workers`` workers on ``policy_factory(w)``
        (``RolloutEngine.start``): runs that take turns on one backend start it once."""
        self.grpo.engine.start(workers, policy_factory)

    def policy_changed(self) -> None:
        """Say the workers hold other weights than this run's policy (another run stepped on
        them): they get this run's before its next rollout (``RolloutEngine.policy_changed``)."""
        self.grpo.engine.policy_changed()

    def restore_timelines(self, timelines: dict) -> None:
        """Take back the timelines of steps done (saved apart from the checkpoint)."""
        self.timelines.update({n: t for n, t in timelines.items() if n < self.rl_step})

    # ---- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The whole loop's state: GRPO's, TLT's parts (bandit, spot trainer, and the
        drafter's learnable ``module`` where no spot trainer holds it: a registered drafter
        that learns as it drafts, a plugin's too) and the trainer's own."""
        return {"grpo": self.grpo.state_dict(), "schedule": self.schedule,
                "spot": self.spot.state_dict() if self.spot is not None else None,
                "drafter": self._drafter_module_state(), **self._own_state()}

    def _drafter_module_state(self) -> dict | None:
        """The serving drafter's ``module`` weights, unless it has none or the spot trainer's
        state already holds them."""
        if self.spot is not None or self.drafter is None or self.drafter.module is None:
            return None
        return {k: v.detach().clone() for k, v in self.drafter.module.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        # a plain GRPO checkpoint written before the shell held GRPO's state flat
        self.grpo.load_state_dict(state["grpo"] if "grpo" in state else state)
        self.schedule = state.get("schedule")  # older remedy checkpoints: plain decoding
        if self.spot is not None:
            self.spot.load_state_dict(state["spot"])
        drafter = state.get("drafter")  # None: saved before drafters' modules were, or none
        if drafter is not None:
            if self.spot is not None or self.drafter is None or self.drafter.module is None:
                raise ValueError("the checkpoint holds a drafter module's weights, but this "
                                 "run's drafter has no module of its own to load them into; "
                                 "resume it with the drafter it was saved with "
                                 "(TLTConfig.drafter)")
            self.drafter.module.load_state_dict(drafter)
        self._load_own_state(state)

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Write the whole loop's state atomically (an interruption leaves the previous)."""
        return save_state(path if path is not None else self.checkpoint_dir, self.STATE_FILE,
                          self.state_dict())

    @classmethod
    def has_checkpoint(cls, path) -> bool:
        return has_state(path, cls.STATE_FILE)

    def load_checkpoint(self, path: str | os.PathLike | None = None) -> None:
        """Resume from ``path`` (default: ``checkpoint_dir``); a damaged file is a
        ``DamagedFileError`` naming it."""
        path = path if path is not None else self.checkpoint_dir
        self.load_state_dict(load_state(path, self.STATE_FILE))
