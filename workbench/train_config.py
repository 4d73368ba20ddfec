"""How the training loop trains: :class:`TrainConfig` (every field checked when built) and
the learning-rate schedule :func:`lr_at`, a pure function of the step so that a resumed run
continues it exactly. The loop itself is :class:`workbench.train.Trainer`."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .checks import (check_bool, check_choice, check_fraction, check_int, check_non_negative,
                     check_positive)

__all__ = ["SCHEDULES", "TrainConfig", "lr_at"]

SCHEDULES = ("constant", "cosine")
@dataclass
class TrainConfig:
    """How :class:`Trainer` trains; every field is checked when the config is built.

    Args:
        horizon: the training's length in optimizer steps: :meth:`Trainer.run` given no
            ``steps`` trains up to it, and the cosine schedule decays over it (past it the LR
            stays at the floor). ``None``: open-ended training (GRPO, the spot trainer during
            RL), which only a constant LR allows; ``run`` then needs ``steps`` or ``stop``.
        lr: peak learning rate of AdamW.
        schedule: ``"constant"``: linear warm-up, then ``lr`` (a run of N steps is exactly the
            first N steps of a longer one: the policy recipe). ``"cosine"``: linear warm-up,
            then cosine decay from ``lr`` to ``lr * lr_floor`` at ``horizon`` (EAGLE).
        warmup: linear warm-up steps (step ``s`` < ``warmup`` gets ``lr * (s + 1) / warmup``).
        lr_floor: the cosine schedule's final LR as a fraction of ``lr``, in [0, 1].
        betas, weight_decay, eps: AdamW's.
        clip_norm: gradient-norm clipping threshold; ``None`` turns clipping off.
        seed: seeds the trainer's own ``torch.Generator`` (never the global RNGs).
        train_mode: put the model in train mode for the run (``False``: eval mode, e.g. a
            policy whose dropout must stay off); its previous modes come back afterwards.
        max_minutes: wall-clock cap over the whole training, resumed runs included.
        checkpoint_dir: folder of the atomic checkpoint. When it holds one and ``resume`` is
            true, the trainer starts from it.
        checkpoint_every: also checkpoint every this many steps (0: only when a run ends).
        checkpoint_every_s: also checkpoint when this many seconds passed since the last one.
        resume: start from ``checkpoint_dir`` when a checkpoint is there.
        progress: show a tqdm progress bar.
        desc: the bar's label.
        log_every: print a line (mean loss, LR, elapsed) every this many steps; 0: never.
    """

    horizon: int | None = None
    lr: float = 1e-3
    schedule: str = "constant"
    warmup: int = 0
    lr_floor: float = 0.1
    betas: tuple = (0.9, 0.999)
    weight_decay: float = 0.0
    eps: float = 1e-8
    clip_norm: float | None = 1.0
    seed: int = 0
    train_mode: bool = True
    max_minutes: float = math.inf
    checkpoint_dir: str | os.PathLike | None = None
    checkpoint_every: int = 0
    checkpoint_every_s: float = math.inf
    resume: bool = True
    progress: bool = True
    desc: str = "train"
    log_every: int = 0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field, its value and what is accepted."""
        check_int("TrainConfig.horizon", self.horizon, 0, optional="open-ended training")
        for name in ("warmup", "checkpoint_every", "log_every"):
            check_int(f"TrainConfig.{name}", getattr(self, name), 0)
        check_int("TrainConfig.seed", self.seed, 0, 2 ** 63 - 1)  # a torch.Generator's range
        for name in ("lr", "eps"):
            check_positive(f"TrainConfig.{name}", getattr(self, name))
        check_fraction("TrainConfig.lr_floor", self.lr_floor)
        check_non_negative("TrainConfig.weight_decay", self.weight_decay)
        check_positive("TrainConfig.clip_norm", self.clip_norm, optional="no clipping")
        for name in ("max_minutes", "checkpoint_every_s"):  # inf: no cap, never
            check_positive(f"TrainConfig.{name}", getattr(self, name), allow_inf=True)
        check_choice("TrainConfig.schedule", self.schedule, SCHEDULES)
        if self.schedule == "cosine" and self.horizon is None:
            raise ValueError("TrainConfig.schedule='cosine' decays over a horizon, and "
                             "TrainConfig.horizon is None; give horizon (the steps the LR "
                             "decays over) or use schedule='constant'")
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"TrainConfig.betas must be two numbers in [0, 1), "
                             f"got {self.betas!r}")
        for i, beta in enumerate(self.betas):
            check_fraction(f"TrainConfig.betas[{i}]", beta, high_open=True)
        for name in ("train_mode", "resume", "progress"):
            check_bool(f"TrainConfig.{name}", getattr(self, name))


def lr_at(step: int, config: TrainConfig) -> float:
    """The learning rate of optimizer step ``step`` (0-based): a pure function of the step, so
    the schedule's position needs no state of its own and a resumed run continues it exactly."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    if config.schedule == "constant":
        return config.lr
    progress = min(1.0, (step - config.warmup) / max(1, config.horizon - config.warmup))
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return config.lr * (config.lr_floor + (1 - config.lr_floor) * cosine)
