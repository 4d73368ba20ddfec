"""The best weights a retraining has held, by held-out loss, kept so that they can be put back.

Why: a student that starts near its teacher (a light prune) has little to gain and much to
lose, and one learning rate too high for it makes it end worse than it began (issue 25: KD at
lr 1e-3 took a near-teacher student from 0.285 to 0.307 nats). Keeping the best evaluated
weights, the starting point included, and restoring them at the end means a retraining can
only end at or below the held-out loss it started from, whatever its schedule does.

The kept weights are a copy in memory; :meth:`BestWeights.state` and :meth:`BestWeights.load`
carry them in the trainer's checkpoint, so an interrupted run that resumes keeps the best of
the evaluations made before the interruption too.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class BestWeights:
    """The lowest held-out loss offered so far, the step it was measured at, and a copy of the
    weights that gave it (ties keep the earlier: a later equal loss is no improvement)."""

    def __init__(self):
        self.step: int | None = None
        self.loss = math.inf
        self._weights: dict[str, torch.Tensor] | None = None

    def offer(self, module: nn.Module, step: int, loss: float) -> bool:
        """Keep a copy of ``module``'s weights if ``loss`` is the lowest yet; True if kept."""
        if not loss < self.loss:  # NaN never wins
            return False
        self.step, self.loss = step, float(loss)
        self._weights = {k: v.detach().clone() for k, v in _weights(module).items()}
        return True

    def restore(self, module: nn.Module) -> int | None:
        """Copy the kept weights back into ``module`` (in place, so tied weights stay tied);
        returns the step they come from, None when nothing was kept."""
        if self._weights is None:
            return None
        with torch.no_grad():
            for name, tensor in _weights(module).items():
                tensor.copy_(self._weights[name])
        return self.step

    def state(self) -> dict:
        """What a checkpoint holds of this (the kept weights included)."""
        return {"step": self.step, "loss": self.loss, "weights": self._weights}

    def load(self, state: dict | None) -> None:
        """Take back :meth:`state` (``None``: a checkpoint written before anything was kept)."""
        state = state or {"step": None, "loss": math.inf, "weights": None}
        self.step, self.loss, self._weights = state["step"], state["loss"], state["weights"]


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, without the module's extra state (which holds this)."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}
