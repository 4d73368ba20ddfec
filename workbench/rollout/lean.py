"""Lean forward passes through Llama-family decoder layers, for one-token drafting steps.

HF's model forward rebuilds the attention mask and the rotary embedding, checks its inputs and
records outputs on every call. For a drafter that runs several one-token steps per verify, that
fixed cost is most of a step. Here the layers' own modules (norms, projections, MLP) are called
directly, attention is one SDPA call with GQA, cos/sin come from a table, and a one-token step
that may see every cache column gets no mask at all. The arithmetic is the layer's own, so
results equal HF's (the tests check the drafts against HF's layers and ``generate``).

Covered: Llama and Qwen2 with full attention and no per-head q/k norms. Anything else keeps
the HF path (``supports_lean`` says which).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

__all__ = ["supports_lean", "lean_layer", "RopeTable", "causal_mask_4d", "step_mask",
           "LeanForward"]

LEAN_MODEL_TYPES = ("llama", "qwen2")


def supports_lean(config, layer) -> bool:
    """Whether ``layer`` (of a model with ``config``) can run through :func:`lean_layer`."""
    attn = getattr(layer, "self_attn", None)
    return (getattr(config, "model_type", None) in LEAN_MODEL_TYPES and attn is not None
            and all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and not hasattr(attn, "q_norm")
            and not getattr(config, "use_sliding_window", False)
            and getattr(attn, "sliding_window", None) is None)


def causal_mask_4d(mask: torch.Tensor, q_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask ``[B, 1, q, T]`` for the last ``q_len`` of ``T`` columns:
    a query sees visible columns (``mask == 1``) at or before its own."""
    t = mask.shape[1]
    rows = torch.arange(q_len, device=mask.device)[:, None] + (t - q_len)
    cols = torch.arange(t, device=mask.device)[None, :]
    allowed = (cols <= rows)[None] & mask[:, None, :].bool()
    out = torch.zeros(allowed.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def step_mask(mask: torch.Tensor, q_len: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask for ``q_len`` new tokens, or ``None`` when one token sees every column."""
    if q_len == 1 and bool(mask.all()):
        return None
    return causal_mask_4d(mask, q_len, dtype)


class RopeTable:
    """cos/sin at given positions. For plain RoPE they come from a table built once (cheaper
    per one-token step than recomputing them); RoPE variants whose frequencies depend on the
    length (dynamic scaling) are recomputed by the model's own rotary embedding."""

    def __init__(self, rotary):
        self.rotary, self.table = rotary, None

    def __call__(self, x: torch.Tensor, pos: torch.Tensor):
        if getattr(self.rotary, "rope_type", "default") != "default":
            return self.rotary(x, pos)
        need = int(pos.max()) + 1
        table = self.table
        if table is None or table[0].shape[1] < need or table[0].dtype != x.dtype:
            size = max(need, 2 * (0 if table is None else table[0].shape[1]), 512)
            table = self.table = self.rotary(x, torch.arange(size, device=x.device)[None])
        return table[0][0][pos], table[1][0][pos]


def lean_layer(layer, x, attention_mask, position_embeddings, cache, layer_idx: int):
    """One decoder layer on ``x``, the same function as the HF layer, with its KV in entry
    ``layer_idx`` of ``cache``."""
    attn = layer.self_attn
    h = layer.input_layernorm(x)
    shape = (*h.shape[:-1], -1, attn.head_dim)
    q = attn.q_proj(h).view(shape).transpose(1, 2)
    k = attn.k_proj(h).view(shape).transpose(1, 2)
    v = attn.v_proj(h).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
    k, v = cache.update(k, v, layer_idx)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, scale=attn.scaling,
                                         enable_gqa=True)
    x = x + attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


class LeanForward:
    """:class:`~workbench.rollout.batch.PolicyForward`'s contract through :func:`lean_layer`:
    ``(logits, prenorm_hidden)`` for positions ``logits_from:`` of the new tokens."""

    def __init__(self, model):
        if not self.covers(model):
            raise ValueError(f"no lean forward for model type {model.config.model_type!r}; "
                             f"supported: {LEAN_MODEL_TYPES} with full attention")
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.rope = RopeTable(self.decoder.rotary_emb)

    @staticmethod
    def covers(model) -> bool:
        """Whether every decoder layer of ``model`` can run through :func:`lean_layer`."""
        return all(supports_lean(model.config, layer) for layer in model.get_decoder().layers)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @torch.no_grad()
    def __call__(self, input_ids, attention_mask, position_ids, cache, logits_from: int = -1):
        x = self.decoder.embed_tokens(input_ids)
        mask = step_mask(attention_mask, input_ids.shape[1], x.dtype)
        rope = self.rope(x, position_ids)
        for i, layer in enumerate(self.decoder.layers):
            x = lean_layer(layer, x, mask, rope, cache, i)
        return self.lm_head(self.decoder.norm(x[:, logits_from:])), x
