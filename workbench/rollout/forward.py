"""The forward passes of the engine: one protocol, a lean implementation and HF's.

Every forward the engine makes (prefill, plain decode step, verify pass, a small-LM drafter's
steps) has one signature::

    forward(input_ids, position_ids, mask, col_pos, cache, logits_from=-1, tree=None)
        -> (logits for positions logits_from: of the new tokens, pre-norm hidden states)

``mask``/``col_pos`` are the batch's visibility and position of every cache column, the new
columns included (``rollout.batch.DecodeBatch``). The attention mask is built here from
positions, not column indices, so causality and sliding windows count real tokens whatever
holes speculative decoding and joining rows leave in the cache. ``tree`` (``[B, q, q]``
bool, ancestor-or-self) feeds a draft tree: tokens of different branches share positions, so
each sees only its own ancestors among the new columns (:func:`attention_mask`).

- :class:`LeanForward` runs each layer's arithmetic on tensors read once from its modules
  (:class:`LayerPlan`: q/k/v and gate/up fused into one matmul each), one SDPA call per layer
  with GQA, cos/sin from a table, and no mask at all for a one-token step that may see every
  column. HF's model forward rebuilds masks and rotary embeddings, checks inputs and records
  outputs on every call; on small models that fixed cost is most of a step.
  Covered: Llama, Qwen2, Mistral (sliding windows included) and Qwen3 layers, whose per-head
  q/k RMSNorms run before RoPE (:func:`supports_lean`).
- :class:`HFForward` runs the model's own decoder with a prepared 4D mask (a dict of masks
  for models that mix full and sliding layers): any other Llama-family architecture.
:func:`policy_forward` picks the lean one where it applies. Both are tested equal to HF.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter

import torch
import torch.nn.functional as F

from .few_rows import pack

__all__ = ["policy_forward"]

LEAN_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3")


# ---- masks ------------------------------------------------------------------------------
def layer_windows(config, num_layers: int) -> list[int | None]:
    """Each decoder layer's sliding window (``None``: full attention), as HF configures it."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        return [window if t == "sliding_attention" else None for t in types[:num_layers]]
    return [window] * num_layers


def attention_mask(mask: torch.Tensor, col_pos: torch.Tensor, q_pos: torch.Tensor,
                   window: int | None, dtype: torch.dtype, allow_none: bool = False,
                   tree: torch.Tensor | None = None) -> torch.Tensor | None:
    """Additive mask ``[B, 1, q, T]``: query ``i`` of row ``b`` (position ``q_pos[b, i]``)
    sees column ``j`` when it is visible, at or before that position, and inside the window
    (``q_pos - col_pos < window``, HF's sliding-window rule). With ``allow_none``, ``None``
    when every query may see every column (no mask needed).

    ``tree`` ``[B, q, m]`` bool: the last ``m`` columns hold draft-tree nodes, which share
    positions across branches, so a query also needs ``tree[b, i, j]`` to see column
    ``T - m + j`` (its ancestors and itself; ``rollout.tree``)."""
    if allow_none and window is None and q_pos.shape[1] == 1 and bool(mask.all()) \
            and tree is None:
        return None  # one new token, nothing hidden: every column is at or before it
    kv, q = col_pos[:, None, :], q_pos[:, :, None]
    allowed = mask[:, None, :].bool() & (kv <= q)
    if window is not None:
        allowed &= kv > q - window
    if tree is not None:
        allowed[..., allowed.shape[-1] - tree.shape[-1]:] &= tree
    if allow_none and bool(allowed.all()):
        return None
    out = torch.zeros(allowed.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def causal_mask_4d(mask: torch.Tensor, q_len: int, dtype: torch.dtype) -> torch.Tensor:
    """The mask for the last ``q_len`` of ``T`` columns of right-padded training sequences,
    whose positions are their column indices."""
    t = mask.shape[1]
    cols = torch.arange(t, device=mask.device).expand(mask.shape[0], -1)
    return attention_mask(mask, cols, cols[:, t - q_len:], None, dtype)


class RopeTable:
    """cos/sin at given positions. For plain RoPE they come from a table built once (cheaper
    per one-token step than recomputing them); RoPE variants whose frequencies depend on the
    length (dynamic scaling) are recomputed by the model's own rotary embedding."""

    def __init__(self, rotary):
        self.rotary, self.table = rotary, None
        self.dynamic = getattr(rotary, "rope_type", "default") != "default"

    def __call__(self, x: torch.Tensor, pos: torch.Tensor, bound: int | None = None):
        """cos/sin ``[B, L, d]`` at ``pos [B, L]``. ``bound``: a number known to exceed every
        position (the compiled step's width: a row's position counts the visible columns
        before it), which saves reading the largest position back from the tensor."""
        if self.dynamic:
            return self.rotary(x, pos)
        need = int(pos.max()) + 1 if bound is None else bound
        table = self.table
        if table is None or table[0].shape[1] < need or table[0].dtype != x.dtype:
            size = max(need, 2 * (0 if table is None else table[0].shape[1]), 512)
            table = self.table = self.rotary(x, torch.arange(size, device=x.device)[None])
        return table[0][0][pos], table[1][0][pos]


# ---- the lean layer ---------------------------------------------------------------------
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "scaling", "head_dim")
_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def supports_lean(config, layer) -> bool:
    """Whether ``layer`` (of a model with ``config``) can run through :func:`lean_layer`:
    Llama-style attention (with Qwen3's per-head q/k RMS norms, both or neither), a gated
    MLP, and RMS norms."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = [getattr(layer, n, None) for n in ("input_layernorm", "post_attention_layernorm")]
    qk_norms = [getattr(attn, n, None) for n in ("q_norm", "k_norm")]
    qk_ok = qk_norms == [None, None] or all(hasattr(n, "variance_epsilon") for n in qk_norms)
    return (getattr(config, "model_type", None) in LEAN_MODEL_TYPES and attn is not None
            and all(hasattr(attn, n) for n in _PROJECTIONS) and qk_ok
            and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))
            and all(hasattr(n, "variance_epsilon") for n in norms))


def rms_norm(weight: torch.Tensor, eps: float, x: torch.Tensor) -> torch.Tensor:
    """An HF RMSNorm's arithmetic without the module call: normalised in float32 (as HF does,
    even for float64 input), cast back, times the weight. (``F.rms_norm`` is a composite of
    more ops than this on the CPU.)"""
    if x.dtype == torch.float32:  # the common case: no casts
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def weights_key(params) -> tuple:
    """Changes whenever a parameter is written in place (``_version``: ``load_state_dict``,
    optimizer steps) or gets new storage (``.data = ...``). (Read once per step: ``map`` over
    the parameters costs a third less than a generator of pairs.)"""
    params = params if isinstance(params, (list, tuple)) else list(params)
    return (*map(_VERSION, params), *map(torch.Tensor.data_ptr, params))


_VERSION = attrgetter("_version")


def _cat(tensors) -> torch.Tensor | None:
    return None if any(t is None for t in tensors) else torch.cat([t.detach() for t in tensors])


@dataclass(frozen=True)
class LayerPlan:
    """A decoder layer's tensors, read once from its modules, with q/k/v and gate/up fused
    into one weight each (one matmul instead of three, and of two). Reading nn.Module
    attributes costs more than some of the ops they feed, so a step reads these instead."""

    ln1: torch.Tensor
    eps1: float
    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    n_q: int
    n_kv: int
    head_dim: int
    scale: float
    w_o: torch.Tensor
    b_o: torch.Tensor | None
    ln2: torch.Tensor
    eps2: float
    w_gate_up: torch.Tensor
    b_gate_up: torch.Tensor | None
    act: object
    w_down: torch.Tensor
    b_down: torch.Tensor | None
    q_norm: torch.Tensor | None = None  # Qwen3's per-head RMSNorm weights [d] (None: none)
    k_norm: torch.Tensor | None = None
    eps_q: float = 0.0
    eps_k: float = 0.0

    @classmethod
    def of(cls, layer) -> "LayerPlan":
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
        d = attn.head_dim
        qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        qk_norms = () if qn is None else (qn.weight, kn.weight, qn.variance_epsilon,
                                         kn.variance_epsilon)
        return cls(layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                   _cat([m.weight for m in qkv]), _cat([m.bias for m in qkv]),
                   attn.q_proj.weight.shape[0] // d, attn.k_proj.weight.shape[0] // d, d,
                   attn.scaling, attn.o_proj.weight, attn.o_proj.bias,
                   layer.post_attention_layernorm.weight,
                   layer.post_attention_layernorm.variance_epsilon,
                   _cat([m.weight for m in gate_up]), _cat([m.bias for m in gate_up]),
                   mlp.act_fn, mlp.down_proj.weight, mlp.down_proj.bias, *qk_norms)

    @cached_property
    def packed(self) -> tuple[torch.Tensor, ...]:
        """``(w_qkv, w_o, w_gate_up, w_down)`` in the few-rows kernel's layout
        (``rollout.few_rows.pack``): made on first use, once per plan (a plan is rebuilt when
        a weight changes); a copy of the weights that only the compiled step's kernel path
        pays for."""
        return tuple(pack(w) for w in (self.w_qkv, self.w_o, self.w_gate_up, self.w_down))


def layer_plan(layer) -> LayerPlan:
    """``layer``'s plan, cached and rebuilt whenever one of its weights changes."""
    key = weights_key(layer.parameters())
    hit = _PLANS.get(layer)
    if hit is None or hit[0] != key:
        hit = _PLANS[layer] = (key, LayerPlan.of(layer))
    return hit[1]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [B, L, heads, d]`` (HF's ``x * cos + rotate_half(x) * sin``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def normed_qk(qkv: torch.Tensor, n_q: int, n_kv: int, q_norm, k_norm, eps_q: float,
              eps_k: float) -> torch.Tensor:
    """The queries and keys ``[B, L, n_q + n_kv, d]`` of fused projections ``qkv [B, L,
    heads, d]``, each head RMS-normed over ``d`` where the layer has q/k norms (Qwen3, before
    RoPE, as HF does), else as projected."""
    n = n_q + n_kv
    if q_norm is None:
        return qkv[:, :, :n]
    return torch.cat([rms_norm(q_norm, eps_q, qkv[:, :, :n_q]),
                      rms_norm(k_norm, eps_k, qkv[:, :, n_q:n])], dim=2)


def run_layer(p: LayerPlan, x, mask, position_embeddings, cache, layer_idx: int):
    """One decoder layer on ``x``, the same arithmetic as the HF layer, with its KV in entry
    ``layer_idx`` of ``cache``; ``mask`` is additive (or ``None``: see everything);
    ``position_embeddings`` are cos/sin ``[B, L, 1, d]`` (:func:`head_rope`). What goes
    is the machinery around the arithmetic: fused matmuls, RoPE on queries and keys in one
    pass, no module calls."""
    h = rms_norm(p.ln1, p.eps1, x)
    qkv = F.linear(h, p.w_qkv, p.b_qkv).view(*h.shape[:-1], -1, p.head_dim)  # [B, L, heads, d]
    n = p.n_q + p.n_kv
    qk = _rotate(normed_qk(qkv, p.n_q, p.n_kv, p.q_norm, p.k_norm, p.eps_q, p.eps_k),
                 *position_embeddings)
    k, v = cache.update(qk[:, :, p.n_q:].transpose(1, 2), qkv[:, :, n:].transpose(1, 2),
                        layer_idx)
    out = F.scaled_dot_product_attention(qk[:, :, :p.n_q].transpose(1, 2), k, v,
                                         attn_mask=mask, scale=p.scale, enable_gqa=True)
    x = x + F.linear(out.transpose(1, 2).reshape(*x.shape[:-1], -1), p.w_o, p.b_o)
    gate, up = F.linear(rms_norm(p.ln2, p.eps2, x), p.w_gate_up, p.b_gate_up).chunk(2, dim=-1)
    return x + F.linear(p.act(gate) * up, p.w_down, p.b_down)


def head_rope(position_embeddings):
    """HF's cos/sin ``[B, L, d]`` shaped for ``[B, L, heads, d]`` queries and keys."""
    return tuple(t.unsqueeze(2) for t in position_embeddings)


def lean_layer(layer, x, mask, position_embeddings, cache, layer_idx: int):
    """:func:`run_layer` on ``layer``'s (cached) plan, with HF's cos/sin ``[B, L, d]``."""
    return run_layer(layer_plan(layer), x, mask, head_rope(position_embeddings), cache,
                     layer_idx)


# ---- the two forwards -------------------------------------------------------------------
class Forward:
    """The protocol (see the module docstring); subclasses implement ``__call__``."""

    def __init__(self, model):
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.windows = layer_windows(model.config, len(self.decoder.layers))
        self.distinct_windows = sorted(set(self.windows), key=lambda w: -1 if w is None else w)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def masks(self, mask, col_pos, q_pos, dtype, allow_none: bool, tree=None) -> dict:
        """``{window: additive mask or None}`` for every distinct window of the layers."""
        return {w: attention_mask(mask, col_pos, q_pos, w, dtype, allow_none, tree)
                for w in self.distinct_windows}


class LeanForward(Forward):
    """The protocol through :func:`run_layer` (Llama, Qwen2, Mistral, Qwen3). The layers' plans are
    checked against the weights once per call (:func:`weights_key`), so weights loaded or
    trained in place are used at the next step. A module given a new parameter object needs
    a new forward."""

    def __init__(self, model):
        if not self.covers(model):
            raise ValueError(f"no lean forward for model type {model.config.model_type!r}; "
                             f"supported: {LEAN_MODEL_TYPES}")
        super().__init__(model)
        self.rope = RopeTable(self.decoder.rotary_emb)
        self.params = list(model.parameters())
        self.key, self.plans = None, []
        # rollout.compiled.compiled_decode_for's CompiledDecode per RolloutConfig.compile mode
        # (True, "auto"), made once per forward so that its graphs and choices outlive a rollout
        self.compiled_decodes: dict = {}

    @staticmethod
    def covers(model) -> bool:
        """Whether every decoder layer of ``model`` can run through :func:`lean_layer`."""
        return all(supports_lean(model.config, layer) for layer in model.get_decoder().layers)

    def _plans(self) -> list[LayerPlan]:
        key = weights_key(self.params)
        if key != self.key:
            self.key, self.plans = key, [LayerPlan.of(layer) for layer in self.decoder.layers]
        return self.plans

    @torch.no_grad()
    def __call__(self, input_ids, position_ids, mask, col_pos, cache, logits_from: int = -1,
                 tree: torch.Tensor | None = None):
        plans = self._plans()
        x = F.embedding(input_ids, self.decoder.embed_tokens.weight)
        masks = self.masks(mask, col_pos, position_ids, x.dtype, allow_none=True, tree=tree)
        rope = head_rope(self.rope(x, position_ids))
        for i, (plan, window) in enumerate(zip(plans, self.windows)):
            x = run_layer(plan, x, masks[window], rope, cache, i)
        norm = self.decoder.norm
        h = rms_norm(norm.weight, norm.variance_epsilon, x[:, logits_from:])
        return F.linear(h, self.lm_head.weight, self.lm_head.bias), x


class HFForward(Forward):
    """The protocol through the model's own decoder forward (any HF Llama-family model)."""

    def __init__(self, model):
        super().__init__(model)
        self._prenorm: torch.Tensor | None = None
        self.decoder.norm.register_forward_pre_hook(self._keep_prenorm)

    def _keep_prenorm(self, module, args):
        self._prenorm = args[0]

    def _mask_argument(self, masks: dict):
        if len(masks) == 1:
            return next(iter(masks.values()))
        by_type = {None: "full_attention"}
        return {by_type.get(w, "sliding_attention"): m for w, m in masks.items()}

    @torch.no_grad()
    def __call__(self, input_ids, position_ids, mask, col_pos, cache, logits_from: int = -1,
                 tree: torch.Tensor | None = None):
        masks = self.masks(mask, col_pos, position_ids, self.dtype, allow_none=False, tree=tree)
        out = self.decoder(input_ids=input_ids, attention_mask=self._mask_argument(masks),
                           position_ids=position_ids, cache=cache, use_cache=True)
        hidden = out.last_hidden_state[:, logits_from:]
        return self.lm_head(hidden), self._prenorm


def policy_forward(model, lean: bool | None = None) -> Forward:
    """The forward the engine uses for ``model``, made once per model and kind (a hook is
    registered once): lean where :meth:`LeanForward.covers` the model, unless ``lean=False``."""
    lean = LeanForward.covers(model) if lean is None else lean
    cache = model.__dict__.setdefault("_workbench_forwards", {})
    if lean not in cache:
        cache[lean] = LeanForward(model) if lean else HFForward(model)
    return cache[lean]
