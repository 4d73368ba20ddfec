"""How :class:`~workbench.compress.distill.Distiller` retrains a student: :class:`DistillConfig`,
every field checked when it is built (layer pairs against the models, by
:func:`check_layer_pairs`, when the distiller is built). It holds the harness's
:class:`~workbench.train.TrainConfig`, whose distillation default is warm-up then cosine decay."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..checks import check_bool, check_choice, check_int, check_non_negative, check_positive
from ..nested_config import NestedConfig
from ..train import TrainConfig

MODES = ("kd", "ce")


def _default_train() -> TrainConfig:
    """Distillation's optimisation: AdamW (betas 0.9, 0.95) for 200 steps, 10 of linear
    warm-up to the peak LR, then cosine decay to a tenth of it at the horizon (the shape of
    Minitron's runs: a large step late in a run undoes what the run has learned), clipping at
    1.0,
    a checkpoint every 50 steps."""
    return TrainConfig(horizon=200, lr=1e-3, schedule="cosine", warmup=10, lr_floor=0.1,
                       betas=(0.9, 0.95), checkpoint_every=50)


@dataclass
class DistillConfig(NestedConfig):
    """How :class:`Distiller` retrains a student; every field is checked when the config is
    built (layer pairs against the models when the distiller is built). Flat:
    ``DistillConfig.flat(horizon=200, batch_size=16, lr=1e-3, temperature=1.0, seed=0)``.

    Args:
        mode: ``"kd"``: distil from the teacher; ``"ce"``: cross-entropy on the data alone
            (the CE baseline, or training from scratch with a :func:`scratch_like` student).
        temperature: softens both distributions of the KL (> 0); Minitron uses 1.
        ce_weight: weight of the data's cross-entropy added to the KD loss (>= 0; 0: pure KD).
        layer_pairs: ``(student index, teacher index)`` hidden states compared by a cosine
            loss through a learned projection; indices into HF ``hidden_states`` (0:
            embeddings, i: after decoder layer i, the last after the final norm). Empty (the
            default): logit-only KD, Minitron's choice unless depth was cut a lot.
        batch_size: sequences per step (:func:`distill`).
        eval_every: evaluate every this many steps (0: only before training and at the
            horizon).
        keep_best: with held-out batches, keep the weights of the evaluation with the lowest
            held-out LM loss (the starting point included) and restore them at the horizon,
            so that the student ends no worse than it started; ``False``: end with the last
            weights (to see what the schedule alone does, or to imitate a teacher whatever
            the data's loss).
        train: the harness's optimizer: ``horizon`` (the steps of a run), ``lr`` (the peak),
            ``schedule`` (``"cosine"`` by default: warm-up, then decay over the horizon),
            ``warmup``, ``lr_floor``, ``weight_decay``, ``clip_norm``, ``seed`` (it also draws
            the projections and the batch order), ``checkpoint_every``, ``max_minutes`` (the
            run stops and checkpoints when reached), ``progress``. Its ``checkpoint_dir`` is
            the distiller's.
    """

    mode: str = "kd"
    temperature: float = 1.0
    ce_weight: float = 0.0
    layer_pairs: Sequence[tuple[int, int]] = ()
    batch_size: int = 16
    eval_every: int = 50
    keep_best: bool = True
    train: TrainConfig = field(default_factory=_default_train)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field, its value and what is accepted
        (the optimizer's fields are the held ``TrainConfig``'s, checked when it is built)."""
        check_choice("DistillConfig.mode", self.mode, MODES)
        check_positive("DistillConfig.temperature", self.temperature)
        check_non_negative("DistillConfig.ce_weight", self.ce_weight)
        check_int("DistillConfig.batch_size", self.batch_size, 1)
        check_int("DistillConfig.eval_every", self.eval_every, 0)
        check_bool("DistillConfig.keep_best", self.keep_best)
        self.layer_pairs = _normalized_pairs(self.layer_pairs)
        if self.mode == "ce" and self.layer_pairs:
            raise ValueError(f"DistillConfig.layer_pairs={self.layer_pairs!r} needs "
                             "mode='kd' (mode='ce' has no teacher to compare with)")
        if not isinstance(self.train, TrainConfig):
            raise ValueError(f"DistillConfig.train must be a TrainConfig, got "
                             f"{type(self.train).__name__} (DistillConfig.flat takes flat "
                             "parameters)")


def _normalized_pairs(pairs) -> tuple[tuple[int, int], ...]:
    """``pairs`` as a tuple of ``(int, int)``; ``ValueError`` naming the first malformed one."""
    normalized = []
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"DistillConfig.layer_pairs: {pair!r} is not a pair of layer "
                             "indices; accepted: (student index, teacher index), integers >= 0")
        normalized.append(tuple(check_int(f"DistillConfig.layer_pairs {tuple(pair)!r}: the "
                                          f"{who} index", index, 0)
                                for who, index in zip(("student", "teacher"), pair)))
    return tuple(normalized)


def check_layer_pairs(pairs, student, teacher) -> None:
    """``ValueError`` naming the first pair whose index is past its model's hidden states."""
    for pair in pairs:
        for who, index, model in (("student", pair[0], student), ("teacher", pair[1], teacher)):
            last = model.config.num_hidden_layers
            if not 0 <= index <= last:
                raise ValueError(f"layer pair {tuple(pair)}: {who} index {index} is out of "
                                 f"range; the {who} has hidden states 0..{last} (0: embeddings, "
                                 f"i: after decoder layer i)")
