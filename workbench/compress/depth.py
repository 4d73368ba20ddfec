"""Depth importance (Minitron): which decoder layers a Llama-family model can lose.

Two per-layer measures, as in the paper: the LM-loss increase when one layer is removed, and
Block Importance BI = 1 - cos(layer input, layer output) averaged over valid tokens (a layer
that barely turns the residual stream scores near 0). Minitron found that for Llama-3.1 a
contiguous block judged as a whole worked best, so ``block_removal_scan`` scores every block of
a given length by the LM loss without it.

A removed layer is swapped for a pass-through module in ``model.model.layers``, so the
ModuleList keeps its length and ``config.layer_types`` / ``layer_idx`` stay aligned; the cache
is switched off meanwhile and the original layers come back afterwards, also on exceptions.
"""
from __future__ import annotations

from contextlib import contextmanager

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from ..checks import check_int
from ..progress import tqdm

from .data import lm_loss
from .importance import check_batches, check_supported, evaluating

__all__ = ["block_removal_scan", "depth_scores"]


class _SkippedLayer(nn.Module):
    """Stands in for a removed decoder layer: the residual stream passes through unchanged."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


@contextmanager
def layers_removed(model, indices):
    """``model`` with the decoder layers at ``indices`` skipped, for the duration only."""
    layers = model.model.layers
    saved = {i: layers[i] for i in indices}
    use_cache = model.config.use_cache
    try:
        model.config.use_cache = False  # a skipped layer writes no cache entry
        for i in saved:
            layers[i] = _SkippedLayer()
        yield model
    finally:
        for i, layer in saved.items():
            layers[i] = layer
        model.config.use_cache = use_cache


def _removal_losses(model, batches, blocks: list[range], desc: str,
                    progress: bool) -> tuple[float, list[float]]:
    """LM loss of the whole model and of the model without each block in ``blocks``."""
    check_supported(model)
    batches = check_batches(batches)
    with evaluating(model):
        with layers_removed(model, []):  # no layer removed, but the cache off like the rest
            full = lm_loss(model, batches)
        losses = []
        for block in tqdm(blocks, desc=desc, unit="block", disable=not progress):
            with layers_removed(model, block):
                losses.append(lm_loss(model, batches))
    return full, losses


def layer_removal(model, batches, progress: bool = True) -> pd.DataFrame:
    """One row per layer: ``layer``, ``lm_loss`` without it, ``increase`` over the full
    model's loss (nats per token; higher = the layer matters more)."""
    check_supported(model)
    num_layers = model.config.num_hidden_layers
    full, losses = _removal_losses(model, batches, [range(i, i + 1) for i in range(num_layers)],
                                   "layer removal", progress)
    return pd.DataFrame({"layer": range(num_layers), "lm_loss": losses,
                         "increase": [loss - full for loss in losses]})


def _check_block_length(length, num_layers: int) -> None:
    """A block leaves at least one layer: 1 to ``num_layers - 1`` layers."""
    check_int(f"block length (the model has {num_layers} layers)", length, 1, num_layers - 1)


def block_removal_scan(model, batches, length: int, progress: bool = True) -> pd.DataFrame:
    """Every contiguous block of ``length`` layers removed in turn: one row per start with
    ``start``, ``length``, ``lm_loss`` and ``increase`` over the full model."""
    check_supported(model)
    num_layers = model.config.num_hidden_layers
    _check_block_length(length, num_layers)
    starts = range(num_layers - length + 1)
    full, losses = _removal_losses(model, batches, [range(s, s + length) for s in starts],
                                   f"blocks of {length}", progress)
    return pd.DataFrame({"start": starts, "length": length, "lm_loss": losses,
                         "increase": [loss - full for loss in losses]})


def _cosine_distance_hook(sums: torch.Tensor, layer_idx: int, mask_holder: dict):
    """Forward hook adding, for one layer, 1 - cos(input, output) summed over valid tokens."""
    def hook(module, args, kwargs, output):
        hidden_in = args[0] if args else kwargs["hidden_states"]
        hidden_out = output[0] if isinstance(output, tuple) else output
        distance = 1 - F.cosine_similarity(hidden_in.double(), hidden_out.double(), dim=-1)
        sums[layer_idx] += (distance * mask_holder["mask"]).sum()
    return hook


def block_importance(model, batches, progress: bool = True) -> pd.DataFrame:
    """One row per layer: ``layer`` and ``block_importance`` = 1 - cos(input, output) of the
    layer, the token mean over all valid tokens of ``batches``."""
    check_supported(model)
    batches = check_batches(batches)
    device = model.get_input_embeddings().weight.device
    sums = torch.zeros(model.config.num_hidden_layers, dtype=torch.float64, device=device)
    mask_holder, handles, tokens = {}, [], 0
    with evaluating(model):
        try:
            for i, layer in enumerate(model.model.layers):
                handles.append(layer.register_forward_hook(
                    _cosine_distance_hook(sums, i, mask_holder), with_kwargs=True))
            for ids, mask, *_ in tqdm(batches, desc="block importance", unit="batch",
                                  disable=not progress):
                mask_holder["mask"] = mask.to(device=device, dtype=torch.float64)
                model.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                            use_cache=False)
                tokens += int(mask.sum())
        finally:
            for handle in handles:
                handle.remove()
    return pd.DataFrame({"layer": range(len(sums)), "block_importance": (sums / tokens).tolist()})


def depth_scores(model, batches, progress: bool = True) -> pd.DataFrame:
    """Both per-layer measures side by side: ``layer``, ``lm_loss``, ``increase``,
    ``block_importance``."""
    check_supported(model)
    removal = layer_removal(model, batches, progress)
    return removal.merge(block_importance(model, batches, progress), on="layer")
