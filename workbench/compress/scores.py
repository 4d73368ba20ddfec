"""Per-unit scores that decide what a width prune keeps: one number per attention head, MLP
neuron and hidden (embedding) channel. Activation-based importance, weight magnitude and a
random draw all produce this one shape, so pruning and the aggregation ablation compare them
on equal terms: higher means keep."""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["UnitScores"]


@dataclass
class UnitScores:
    """Scores of a model's prunable units (higher = more important).

    Args:
        heads: ``[num_layers, num_attention_heads]``, query heads in the model's order (head
            ``h`` belongs to KV group ``h // (num_attention_heads // num_key_value_heads)``).
        neurons: ``[num_layers, intermediate_size]``, the MLP's hidden units.
        channels: ``[hidden_size]``, the residual stream's (embedding) channels.
    """

    heads: torch.Tensor
    neurons: torch.Tensor
    channels: torch.Tensor

    def check(self, config) -> None:
        """Raise ``ValueError`` naming the field whose shape does not fit ``config``."""
        want = {"heads": (config.num_hidden_layers, config.num_attention_heads),
                "neurons": (config.num_hidden_layers, config.intermediate_size),
                "channels": (config.hidden_size,)}
        for name, shape in want.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"UnitScores.{name} has shape {got}, but the model needs "
                                 f"{shape}")
