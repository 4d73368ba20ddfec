"""The Minitron distillation loss as a function of tensors: forward KL on logits at a
temperature, optional cross-entropy on the data, and cosine losses on intermediate hidden
states through learned projections, balanced against the logit loss.

Every term is a token mean over the positions ``mask`` marks (real, non-pad positions whose
next token exists), so a batch's padding never counts and a long sequence weighs by its tokens.
Pure tensors in, scalars out: :mod:`workbench.compress.distill` feeds it model outputs, and a
test can hold it against a hand computation.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["kd_loss"]


def _wide(x: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    """``x`` in the widest dtype of the tensors given, at least float32: a softmax over a
    vocabulary loses too much in half precision, and float64 stays float64 for exact tests."""
    dtype = torch.float32
    for t in (x, *others):
        dtype = torch.promote_types(dtype, t.dtype)
    return x.to(dtype)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values [B, T]`` over the positions where ``mask [B, T]`` is nonzero (0 when
    none is): the token mean every term of the loss uses."""
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp(min=1)


def forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor,
               temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher || student) of the distributions softened by ``temperature``, scaled by
    ``temperature**2`` (so the gradient's size does not shrink as the temperature grows),
    token mean over ``mask``. Logits are ``[B, T, V]``."""
    log_student = F.log_softmax(_wide(student_logits, teacher_logits) / temperature, dim=-1)
    log_teacher = F.log_softmax(_wide(teacher_logits, student_logits) / temperature, dim=-1)
    per_token = F.kl_div(log_student, log_teacher, log_target=True, reduction="none").sum(-1)
    return masked_mean(per_token, mask) * temperature ** 2


def token_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``logits [B, T, V]`` against the data's next tokens ``targets [B, T]``,
    token mean over ``mask`` (pad targets are never scored)."""
    per_token = F.cross_entropy(_wide(logits).flatten(0, 1), targets.flatten(),
                                reduction="none").view(targets.shape)
    return masked_mean(per_token, mask)


def cosine_loss(student_hidden: Sequence[torch.Tensor], teacher_hidden: Sequence[torch.Tensor],
                projections: Sequence[torch.nn.Module], mask: torch.Tensor) -> torch.Tensor:
    """Mean over layer pairs of the token mean of ``1 - cos(projection(student), teacher)``.

    Pair ``i`` is ``student_hidden[i] [B, T, Hs]``, ``teacher_hidden[i] [B, T, Ht]`` and
    ``projections[i]`` (``Hs -> Ht``): the projection lets a narrower, width-pruned student
    be compared with its teacher, and is learned with the student.
    """
    if not len(student_hidden) == len(teacher_hidden) == len(projections):
        raise ValueError(f"one projection per layer pair: got {len(student_hidden)} student "
                         f"states, {len(teacher_hidden)} teacher states and "
                         f"{len(projections)} projections")
    losses = []
    for student_state, teacher_state, projection in zip(student_hidden, teacher_hidden,
                                                        projections):
        projected = _wide(projection(student_state), teacher_state)
        cos = F.cosine_similarity(projected, _wide(teacher_state, projected), dim=-1)
        losses.append(masked_mean(1 - cos, mask))
    return torch.stack(losses).mean()


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor,
            temperature: float = 1.0, *, targets: torch.Tensor | None = None,
            ce_weight: float = 0.0, student_hidden: Sequence[torch.Tensor] = (),
            teacher_hidden: Sequence[torch.Tensor] = (),
            projections: Sequence[torch.nn.Module] = ()) -> tuple[torch.Tensor, dict]:
    """``(total, metrics)`` of Minitron's distillation loss on aligned tensors.

    ``total = L_logits + alpha * L_intermediate + ce_weight * CE`` where ``L_logits`` is
    :func:`forward_kl`, ``L_intermediate`` is :func:`cosine_loss` over the hidden-state pairs
    (none: logit-only KD, the default) and ``alpha = L_logits / L_intermediate`` detached, so
    the intermediate term always weighs as much as the logit term but its size does not pull
    the gradient. ``targets`` (the data's next tokens) give the CE, which is reported in the
    metrics whenever given and added only when ``ce_weight`` > 0. Metrics are detached
    scalars: ``kl``, and ``ce``, ``intermediate``, ``alpha`` when they apply.
    """
    logit_loss = forward_kl(student_logits, teacher_logits, mask, temperature)
    total, metrics = logit_loss, {"kl": logit_loss.detach()}
    if len(student_hidden) or len(teacher_hidden) or len(projections):
        intermediate = cosine_loss(student_hidden, teacher_hidden, projections, mask)
        ratio = logit_loss.detach() / intermediate.detach()
        alpha = torch.where(intermediate.detach() > 0, ratio, torch.zeros_like(ratio))
        total = total + alpha * intermediate
        metrics.update(intermediate=intermediate.detach(), alpha=alpha)
    if targets is not None:
        ce = token_ce(student_logits, targets, mask)
        if ce_weight > 0:
            total = total + ce_weight * ce
        metrics["ce"] = ce.detach()
    return total, metrics
