"""How the training loop trains: :class:`TrainConfig` (every field checked when built) and
the learning-rate schedule :func:`lr_at`, a pure function of the step so that a resumed run
continues it exactly. The loop itself is :class:`workbench.train.Trainer`."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

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
        for name in ("horizon", "warmup", "seed", "checkpoint_every", "log_every"):
            v = getattr(self, name)
            if v is None and name == "horizon":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2 ** 63:
                accepted = "an integer >= 0" + (" or None" if name == "horizon" else "")
                raise ValueError(f"TrainConfig.{name} must be {accepted}, got {v!r}")
        for name, (accepted, ok) in _REAL_FIELDS.items():
            v = getattr(self, name)
            if not (v is None and name == "clip_norm") and not (_is_real(v) and ok(v)):
                raise ValueError(f"TrainConfig.{name} must be {accepted}, got {v!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"TrainConfig.schedule must be one of {SCHEDULES}, "
                             f"got {self.schedule!r}")
        if self.schedule == "cosine" and self.horizon is None:
            raise ValueError("TrainConfig.schedule='cosine' decays over a horizon, and "
                             "TrainConfig.horizon is None; give horizon (the steps the LR "
                             "decays over) or use schedule='constant'")
        if (not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2
                or not all(_is_real(b) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"TrainConfig.betas must be two numbers in [0, 1), "
                             f"got {self.betas!r}")
        for name in ("train_mode", "resume", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TrainConfig.{name} must be True or False, "
                                 f"got {getattr(self, name)!r}")


_REAL_FIELDS = {  # field: (what is accepted, the test)
    "lr": ("a finite number > 0", lambda v: 0 < v < math.inf),
    "lr_floor": ("a number in [0, 1]", lambda v: 0 <= v <= 1),
    "weight_decay": ("a finite number >= 0", lambda v: 0 <= v < math.inf),
    "eps": ("a finite number > 0", lambda v: 0 < v < math.inf),
    "clip_norm": ("a finite number > 0 or None", lambda v: 0 < v < math.inf),
    "max_minutes": ("a number > 0 (inf: no cap)", lambda v: v > 0),
    "checkpoint_every_s": ("a number > 0 (inf: never)", lambda v: v > 0),
}


def _is_real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


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
