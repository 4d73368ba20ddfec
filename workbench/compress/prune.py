"""Structured pruning: slice an HF causal LM down to a :class:`~.plan.PrunePlan`, keeping the
units its :class:`~.scores.UnitScores` rank highest, into a new HF model of the same class.

The result is an ordinary model with an ordinary config (smaller sizes, explicit ``head_dim``,
per-layer lists cut to the kept layers), so it saves with ``save_pretrained``, loads with
``AutoModelForCausalLM.from_pretrained`` and runs in the rollout engine like any other.
Kept units stay in their original order, so a plan that keeps everything reproduces the source
bit for bit. RMSNorm over fewer channels averages over the kept channels only: pruning hidden
channels changes every norm's scale, which is why Minitron retrains by distillation afterwards.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers.initialization import no_init_weights

from .plan import PrunePlan, check_model_type, head_dim
from .scores import UnitScores

__all__ = ["prune"]

PER_LAYER_LISTS = ("layer_types", "mlp_layer_types")  # config lists with one entry per layer


@dataclass
class KeptUnits:
    """Indices of the source's units that a prune keeps, ascending.

    ``heads`` and ``neurons`` hold one tensor per kept layer, in the plan's layer order;
    ``heads`` are query-head indices of the source layer."""

    channels: torch.Tensor
    heads: list[torch.Tensor]
    neurons: list[torch.Tensor]


def _top(scores: torch.Tensor | None, keep: int) -> torch.Tensor:
    """The ``keep`` highest of ``scores`` (the first ``keep`` if None), in original order;
    ties go to the earlier unit."""
    if scores is None:
        return torch.arange(keep)
    order = torch.argsort(-scores.detach().double().cpu(), stable=True)
    return order[:keep].sort().values


def _kept_heads(scores: torch.Tensor | None, config, keep: int) -> torch.Tensor:
    """Query heads kept in one layer: the best ``keep`` inside each KV group."""
    group = config.num_attention_heads // config.num_key_value_heads
    kept = []
    for g in range(config.num_key_value_heads):
        inside = None if scores is None else scores[g * group:(g + 1) * group]
        kept.append(g * group + _top(inside, keep))
    return torch.cat(kept)


def kept_units(config, plan: PrunePlan, scores: UnitScores | None = None) -> KeptUnits:
    """Which channels, heads and neurons ``prune`` keeps (checked against ``config``)."""
    plan.check(config)
    if scores is not None:
        scores.check(config)
    heads = None if scores is None else scores.heads
    neurons = None if scores is None else scores.neurons
    return KeptUnits(
        _top(None if scores is None else scores.channels, plan.hidden_size),
        [_kept_heads(None if heads is None else heads[i], config, plan.heads_per_group)
         for i in plan.layers],
        [_top(None if neurons is None else neurons[i], plan.intermediate_size)
         for i in plan.layers])


def pruned_config(config, plan: PrunePlan):
    """A copy of ``config`` describing the pruned model; valid under GQA because ``head_dim``
    is explicit (transformers 5 otherwise demands heads dividing the hidden size)."""
    check_model_type(config)
    plan.check(config)
    values = config.to_dict()
    values.update(hidden_size=plan.hidden_size, intermediate_size=plan.intermediate_size,
                  num_attention_heads=plan.num_attention_heads(config),
                  num_key_value_heads=config.num_key_value_heads, head_dim=head_dim(config),
                  num_hidden_layers=len(plan.layers))
    for name in PER_LAYER_LISTS:
        if values.get(name) is not None:
            values[name] = [values[name][i] for i in plan.layers]
    if values.get("max_window_layers") is not None:  # Qwen: layers below it attend fully
        values["max_window_layers"] = sum(i < values["max_window_layers"] for i in plan.layers)
    return type(config).from_dict(values)


def _linear(module, rows: torch.Tensor | None, cols: torch.Tensor | None) -> dict:
    """A linear layer's weight (and bias) cut to ``rows`` outputs and ``cols`` inputs."""
    weight = module.weight
    if rows is not None:
        weight = weight[rows]
    out = {"weight": weight if cols is None else weight[:, cols]}
    if module.bias is not None:
        out["bias"] = module.bias if rows is None else module.bias[rows]
    return out


def _head_rows(heads: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows of q_proj (columns of o_proj) that belong to ``heads``."""
    return (heads[:, None] * dim + torch.arange(dim)).reshape(-1)


def _slice_attention(attn, channels: torch.Tensor, heads: torch.Tensor, dim: int) -> dict:
    """q rows and o columns of the kept query heads; k/v lose only hidden input columns;
    Qwen3's q_norm/k_norm act over head_dim, which stays, so they are copied whole."""
    rows = _head_rows(heads, dim)
    parts = {"q_proj": _linear(attn.q_proj, rows, channels),
             "k_proj": _linear(attn.k_proj, None, channels),
             "v_proj": _linear(attn.v_proj, None, channels),
             "o_proj": _linear(attn.o_proj, channels, rows)}
    for norm in ("q_norm", "k_norm"):
        if hasattr(attn, norm):
            parts[norm] = {"weight": getattr(attn, norm).weight}
    return parts


def _slice_mlp(mlp, channels: torch.Tensor, neurons: torch.Tensor) -> dict:
    """gate/up keep the kept neurons' rows, down their columns; all three lose channels."""
    return {"gate_proj": _linear(mlp.gate_proj, neurons, channels),
            "up_proj": _linear(mlp.up_proj, neurons, channels),
            "down_proj": _linear(mlp.down_proj, channels, neurons)}


def _slice_layer(layer, channels, heads, neurons, dim: int) -> dict:
    """One decoder layer's tensors, named relative to the layer."""
    parts = {norm: {"weight": getattr(layer, norm).weight[channels]}
             for norm in ("input_layernorm", "post_attention_layernorm")}
    parts.update({f"self_attn.{k}": v for k, v in
                  _slice_attention(layer.self_attn, channels, heads, dim).items()})
    parts.update({f"mlp.{k}": v for k, v in _slice_mlp(layer.mlp, channels, neurons).items()})
    return parts


def _slice_embeddings(model, channels: torch.Tensor) -> dict:
    """Input embeddings, final norm and LM head cut to the kept channels (one tensor when
    tied: the new model ties them again)."""
    decoder = model.get_decoder()
    prefix = model.base_model_prefix
    parts = {f"{prefix}.embed_tokens": {"weight": decoder.embed_tokens.weight[:, channels]},
             f"{prefix}.norm": {"weight": decoder.norm.weight[channels]}}
    parts["lm_head"] = _linear(model.get_output_embeddings(), None, channels)
    return parts


@torch.no_grad()
def _state_dict(model, plan: PrunePlan, kept: KeptUnits) -> dict:
    """The pruned model's full state dict, under the names of the new model."""
    dim, layers = head_dim(model.config), model.get_decoder().layers
    parts = _slice_embeddings(model, kept.channels)
    for new, old in enumerate(plan.layers):
        sliced = _slice_layer(layers[old], kept.channels, kept.heads[new], kept.neurons[new], dim)
        parts.update({f"{model.base_model_prefix}.layers.{new}.{k}": v for k, v in sliced.items()})
    return {f"{module}.{name}": tensor
            for module, tensors in parts.items() for name, tensor in tensors.items()}


def prune(model, plan: PrunePlan, scores: UnitScores | None = None):
    """A new model of ``model``'s class, cut to ``plan``, keeping the units ``scores`` rank
    highest (the first ones if None), in their original order. ``model`` is left untouched.

    Every kept layer is built afresh from the new config, so its ``layer_idx`` (its KV-cache
    slot) and attention type follow its new position. Raises ``ValueError`` for an
    unsupported architecture, a plan that does not fit, or scores of the wrong shape."""
    check_model_type(model.config)
    kept = kept_units(model.config, plan, scores)
    config = pruned_config(model.config, plan)
    weight = model.get_output_embeddings().weight
    with no_init_weights():  # every tensor is loaded below; skipping init also skips tying
        new = type(model)(config)
    new.tie_weights()
    new.to(device=weight.device, dtype=weight.dtype)
    new.load_state_dict(_state_dict(model, plan, kept), strict=True)
    new.generation_config = copy.deepcopy(model.generation_config)
    return new.train(model.training)
