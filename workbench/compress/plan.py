"""What a structured prune keeps (:class:`PrunePlan`), and what that costs: parameters and
forward FLOPs per token of a config, pruned or not, computed from the config alone so that an
architecture search can price thousands of candidates without building a model.

Minitron's axes: depth (which decoder layers stay), the residual stream's width
(``hidden_size``), the MLP's width (``intermediate_size``) and attention heads. Under GQA the
key/value heads are shared by a group of query heads, so heads are pruned inside their groups:
every KV head stays, each keeps ``heads_per_group`` query heads, and ``head_dim`` stays too.
Attention's width ``num_key_value_heads * heads_per_group * head_dim`` may then differ from
``hidden_size``, which is why a pruned config names ``head_dim`` explicitly.
:meth:`PrunePlan.for_model` builds a plan from what differs from the source only, with the
query heads as a total count if that reads better.

Every function here that reads a config refuses a model family other than the Llama family
by name (:func:`check_model_type`) before reading anything else of it. The counts are written
once, as arithmetic that takes numbers or numpy arrays alike, so that the architecture
search prices a whole grid of candidates at once with the very formulas of
:func:`param_count` and :func:`flops_per_token`.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from ..checks import check_int

__all__ = ["PrunePlan", "head_dim", "param_count", "flops_per_token"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
# what the parts of a plan_label stand for, for legends and panels that show labels
LABEL_KEY = ("plan labels: 6L = layers kept ([0,1,2] lists them when some are dropped), "
             "h = hidden size (embedding channels), m = MLP size (neurons per layer), "
             "q = query heads per KV group")
"""What the parts of a `plan_label` stand for, for legends and panels that show labels."""


def check_model_type(model_or_config) -> None:
    """Refuse, by name, a model family whose decoder blocks compression does not know (their
    layout differs: GPT-2's fused ``c_attn``, no GQA, no gated MLP), given a model or its
    config, before anything else of it is read."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported model family: model_type {model_type!r} "
                         f"({type(model_or_config).__name__}); workbench.compress accepts the "
                         f"Llama-family decoder blocks of model types "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")


def head_dim(config) -> int:
    """The attention head size: explicit in the config, else hidden_size / heads."""
    check_model_type(config)
    return int(getattr(config, "head_dim", None)
               or config.hidden_size // config.num_attention_heads)


def _group_size(config) -> int:
    check_model_type(config)
    return config.num_attention_heads // config.num_key_value_heads


def llama_refuses(config, hidden, heads):
    """Whether transformers' ``LlamaConfig`` refuses a hidden size (numbers or arrays): it
    demands that the query heads divide it, even with an explicit ``head_dim`` (Qwen2, Qwen3
    and Mistral accept it)."""
    return (config.model_type == "llama") & (hidden % heads != 0)


def _ranges(indices) -> str:
    """Ascending indices as runs: ``0-2, 4`` (a single layer as ``layer 3``)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"layer {text}" if len(indices) == 1 else f"layers {text}"


@dataclass(frozen=True)
class PrunePlan:
    """The architecture a prune produces; which units fill it is the scores' business.

    Args:
        layers: indices of the decoder layers to keep, ascending, unique, at least one.
        hidden_size: channels of the residual stream (embeddings, norms) to keep.
        intermediate_size: MLP neurons to keep in every kept layer.
        heads_per_group: query heads to keep in each KV group (every KV head stays), so the
            pruned model has ``num_key_value_heads * heads_per_group`` attention heads.

    What needs no source config is checked on construction; :meth:`check` checks the rest.
    """

    layers: tuple[int, ...]
    hidden_size: int
    intermediate_size: int
    heads_per_group: int

    def __post_init__(self):
        layers = tuple(check_int(f"PrunePlan.layers[{n}]", index, 0)
                       for n, index in enumerate(self.layers))
        object.__setattr__(self, "layers", layers)
        if not layers:
            raise ValueError("PrunePlan.layers is empty: keep at least one decoder layer")
        if list(layers) != sorted(set(layers)):
            raise ValueError(f"PrunePlan.layers {layers} must be ascending and unique (layers "
                             "cannot be reordered or repeated)")
        for name in ("hidden_size", "intermediate_size", "heads_per_group"):
            object.__setattr__(self, name, check_int(f"PrunePlan.{name}", getattr(self, name), 1))

    @classmethod
    def full(cls, config) -> "PrunePlan":
        """The plan that keeps everything of ``config``."""
        check_model_type(config)
        return cls(tuple(range(config.num_hidden_layers)), config.hidden_size,
                   config.intermediate_size, _group_size(config))

    @classmethod
    def for_model(cls, model, *, layers=None, hidden_size: int | None = None,
                  intermediate_size: int | None = None, num_heads: int | None = None,
                  heads_per_group: int | None = None) -> "PrunePlan":
        """The plan of ``model`` (an HF model or its config) that keeps what is not given:
        every layer (a width-only plan names no layers), the source's widths, every head.
        Heads are given as ``num_heads``, the total query heads to keep (a multiple of the
        KV heads, since every KV head stays), or as ``heads_per_group``, not both. The plan
        is checked against ``model`` (:meth:`check`)."""
        config = getattr(model, "config", model)
        full = cls.full(config)
        if num_heads is not None and heads_per_group is not None:
            raise ValueError(f"PrunePlan.for_model got num_heads={num_heads!r} and "
                             f"heads_per_group={heads_per_group!r}; accepted: one of them (the "
                             f"total query heads, or the query heads per KV group)")
        if num_heads is not None:
            heads_per_group = _per_group(config, num_heads)
        plan = cls(full.layers if layers is None else tuple(layers),
                   full.hidden_size if hidden_size is None else hidden_size,
                   full.intermediate_size if intermediate_size is None else intermediate_size,
                   full.heads_per_group if heads_per_group is None else heads_per_group)
        plan.check(config)
        return plan

    def describe(self, num_layers: int | None = None) -> str:
        """The plan in words, for titles and printouts: ``3 of 6 layers kept (0-2), hidden
        size 256, MLP size 512, 2 query heads per KV group`` (``num_layers``: the source's,
        when known)."""
        kept = len(self.layers)
        count = (f"{kept} of {num_layers} layers" if num_layers is not None
                 else f"{kept} layer{'s' * (kept != 1)}")
        return (f"{count} kept ({_ranges(self.layers)}), hidden size {self.hidden_size}, MLP "
                f"size {self.intermediate_size}, {self.heads_per_group} query head"
                f"{'s' * (self.heads_per_group != 1)} per KV group")

    def __str__(self) -> str:
        return self.describe()

    def num_attention_heads(self, config) -> int:
        """Query heads of the pruned model: every KV head keeps ``heads_per_group``."""
        check_model_type(config)
        return config.num_key_value_heads * self.heads_per_group

    def format_problem(self, config) -> str | None:
        """Why the pruned config would not load in transformers, or None
        (:func:`llama_refuses`)."""
        heads = self.num_attention_heads(config)
        if llama_refuses(config, self.hidden_size, heads):
            return (f"PrunePlan.hidden_size {self.hidden_size} is not a multiple of the pruned "
                    f"model's {heads} query heads ({config.num_key_value_heads} KV groups x "
                    f"heads_per_group {self.heads_per_group}); transformers' LlamaConfig "
                    f"refuses that; accepted: a hidden size divisible by {heads}")
        return None

    def check(self, config) -> None:
        """Raise ``ValueError`` naming the field that does not fit ``config``, and what would."""
        check_model_type(config)
        n = config.num_hidden_layers
        bad = [i for i in self.layers if not 0 <= i < n]
        if bad:
            raise ValueError(f"PrunePlan.layers has indices {bad} out of range; accepted: "
                             f"0..{n - 1} (the source has {n} layers)")
        group = _group_size(config)
        if self.heads_per_group > group:
            raise ValueError(
                f"PrunePlan.heads_per_group is {self.heads_per_group}, but each of the "
                f"{config.num_key_value_heads} KV groups has {group} query heads "
                f"({config.num_attention_heads} heads); accepted: 1..{group}")
        why = self.format_problem(config)
        if why:
            raise ValueError(why)
        for name in ("hidden_size", "intermediate_size"):
            mine, source = getattr(self, name), getattr(config, name)
            if mine > source:
                raise ValueError(f"PrunePlan.{name} {mine} is larger than the source's {source}; "
                                 f"accepted: 1..{source} (pruning only removes units)")


def _per_group(config, num_heads) -> int:
    """Query heads per KV group of a total of ``num_heads``; refused, naming the counts that
    are accepted, unless every KV group can keep the same number of them."""
    kv, group = config.num_key_value_heads, _group_size(config)
    accepted = [kv * q for q in range(1, group + 1)]
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral) \
            or num_heads not in accepted:
        raise ValueError(f"PrunePlan num_heads={num_heads!r} cannot be kept: each of the {kv} "
                         f"KV groups keeps the same number of its {group} query heads; "
                         f"accepted: {', '.join(map(str, accepted))}")
    return int(num_heads) // kv


def plan_label(plan: PrunePlan, num_layers: int | None = None) -> str:
    """A short unique name: ``6L h176 m352 q2`` (layers, hidden, MLP, query heads per group;
    :data:`LABEL_KEY` says so in words); the kept layers are listed when some are dropped
    (``num_layers``: the source's)."""
    layers = len(plan.layers)
    which = ("" if num_layers is not None and layers == num_layers
             else "[" + ",".join(map(str, plan.layers)) + "]")
    return (f"{layers}L{which} h{plan.hidden_size} m{plan.intermediate_size} "
            f"q{plan.heads_per_group}")


def _shape(config, plan: PrunePlan | None) -> tuple[PrunePlan, int]:
    """The plan (full if None), checked, and the number of query heads it keeps."""
    check_model_type(config)
    plan = PrunePlan.full(config) if plan is None else plan
    plan.check(config)
    return plan, plan.num_attention_heads(config)


def _biases(config) -> tuple[bool, bool, bool]:
    """Whether (q/k/v, o, MLP) projections carry biases, per architecture."""
    check_model_type(config)
    if config.model_type == "qwen2":
        return True, False, False
    attention = bool(getattr(config, "attention_bias", False))
    return attention, attention, bool(getattr(config, "mlp_bias", False))


def _layer_params(config, hidden, mlp, heads):
    """Parameters of one decoder layer of the given widths (numbers or numpy arrays)."""
    d, kv = head_dim(config), config.num_key_value_heads
    qkv_bias, o_bias, mlp_bias = _biases(config)
    q_out, kv_out = heads * d, kv * d
    attention = hidden * (q_out + 2 * kv_out) + q_out * hidden
    attention += qkv_bias * (q_out + 2 * kv_out) + o_bias * hidden
    attention += 2 * d if config.model_type == "qwen3" else 0  # q_norm, k_norm over head_dim
    return attention + 3 * hidden * mlp + mlp_bias * (2 * mlp + hidden) + 2 * hidden


def param_count(config, plan: PrunePlan | None = None) -> int:
    """Parameters of ``config`` pruned by ``plan`` (the whole model if None): what
    ``sum(p.numel() for p in model.parameters())`` gives, tied embeddings counted once."""
    plan, heads = _shape(config, plan)
    return int(shape_params(config, plan.hidden_size, plan.intermediate_size, heads,
                            len(plan.layers)))


def shape_params(config, hidden, mlp, heads, num_layers):
    """:func:`param_count` of the given widths and layer count (numbers or numpy arrays)."""
    embeddings = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    layer = _layer_params(config, hidden, mlp, heads)
    return embeddings + num_layers * layer + hidden  # + the final norm


def _windows(config) -> list[int | None]:
    """Each source layer's attention span limit (``None``: full attention)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        return [window if t == "sliding_attention" else None for t in types]
    return [window] * config.num_hidden_layers


def attention_spans(config, context: int) -> list[int]:
    """How many earlier tokens each source layer attends to at ``context``."""
    return [context if w is None else min(context, w) for w in _windows(config)]


def _flops(config, hidden, mlp, heads, num_layers, span_sum):
    """Forward FLOPs per token of ``num_layers`` layers of the given widths whose attention
    spans add up to ``span_sum`` (numbers or numpy arrays): 2 x the matmuls' multiply-adds
    per layer, plus scores and weighted values over each layer's span."""
    d, kv = head_dim(config), config.num_key_value_heads
    matmuls = hidden * (heads + 2 * kv) * d + heads * d * hidden + 3 * hidden * mlp
    return num_layers * 2 * matmuls + 2 * 2 * heads * d * span_sum


def flops_per_token(config, plan: PrunePlan | None = None, context: int = 512) -> int:
    """Forward FLOPs per token of the whole model: its kept layers (2 x the multiply-adds of
    their matmuls, plus attention's scores and weighted values over ``context`` earlier
    tokens, or a layer's sliding window if shorter; norms, activations, RoPE and softmax are
    left out: linear in the width and small beside the matmuls) and the LM head (the
    embedding lookup costs none)."""
    plan, heads = _shape(config, plan)
    span_sum = sum(attention_spans(config, context)[i] for i in plan.layers)
    return int(shape_flops(config, plan.hidden_size, plan.intermediate_size, heads,
                           len(plan.layers), span_sum))


def shape_flops(config, hidden, mlp, heads, num_layers, span_sum):
    """:func:`flops_per_token` of the given shape (numbers or numpy arrays)."""
    lm_head = 2 * hidden * config.vocab_size
    return _flops(config, hidden, mlp, heads, num_layers, span_sum) + lm_head
