"""What the compression notebooks start from: the teacher, its tokenizer, the calibration
batches, the distillation batches and their held-out part, and the teacher's own LM loss."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .data import distill_data, lm_loss
from .importance import calibration_batches
from .plan import check_model_type, param_count

__all__ = ["compress_setup"]


@dataclass
class CompressSetup:
    """The teacher and the data every compression study shares."""

    teacher: object
    tokenizer: object
    calibration: list      # (ids, mask) batches for importance
    train: list            # (ids, mask, scored) distillation batches, seeded order
    held_out: list         # (ids, mask, scored) batches for LM loss
    teacher_loss: float    # the teacher's LM loss on held_out
    source: str

    def label(self, budget: str = "") -> str:
        """The line under every figure: the teacher, its size, the data, and ``budget``."""
        return (f"teacher {param_count(self.teacher.config):,} params; data {self.source}; "
                f"{len(self.calibration)} calibration batches" + (f"; {budget}" if budget else ""))


def compress_setup(model: str | os.PathLike = "default", source: str | os.PathLike = "running_sum",
                   calibration_size: int = 256, train_size: int = 512, eval_size: int = 64,
                   max_len: int = 256, batch_size: int = 16, seed: int = 0) -> CompressSetup:
    """Load ``model`` (the teacher) and draw its calibration texts (``calibration_size``) and
    distillation texts (``train_size`` to train on, ``eval_size`` held out) from ``source``: a
    task name, a JSONL task or a text file."""
    from ..models import load_model
    teacher, tokenizer = load_model(model)
    check_model_type(teacher)  # before any data is drawn
    calibration = calibration_batches(tokenizer, source, calibration_size, max_len=max_len)
    train, held_out = distill_data(tokenizer, source, train_size, eval_size, batch_size, seed,
                                   max_len)
    return CompressSetup(teacher, tokenizer, calibration, train, held_out,
                         lm_loss(teacher, held_out), str(source))
