"""One table that prices candidate prune plans side by side: size, FLOPs, a predicted
throughput, and how much of the importance each keeps.

Why: choosing a plan trades parameters against speed and against what is thrown away. The
counts come from :mod:`.plan` alone (no model is built), and the importance kept comes from
:func:`.prune.kept_units`, the very ranking :func:`.prune.prune` uses, so a row describes
exactly the units that pruning to that plan keeps.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..checks import check_positive
from .plan import LABEL_KEY, PrunePlan, check_model_type, flops_per_token, param_count, plan_label
from .prune import kept_units
from .scores import UnitScores
from .search import plan_kind

# plan_label and LABEL_KEY live with PrunePlan (figures read them without this module's torch)
__all__ = ["plan_label", "plan_table", "LABEL_KEY"]

AXES = ("heads", "neurons", "channels", "layers")
PLAN_TABLE_COLUMNS = (["label", "kind", "layers", "num_layers", "source_layers", "hidden_size",
                       "intermediate_size", "heads_per_group", "params", "params_ratio",
                       "flops_per_token", "flops_ratio", "predicted_speedup", "predicted_tok_s"]
                      + [f"kept_{a}" for a in AXES] + ["importance_kept"])


def _share(kept: float, total: float) -> float:
    return kept / total if total > 0 else float("nan")


def _clipped(scores) -> torch.Tensor:
    """Scores as float64, negatives as 0: a unit whose removal helps holds no importance."""
    return torch.as_tensor(scores, dtype=torch.float64).detach().cpu().clamp(min=0)


def importance_kept(config, plan: PrunePlan, scores: UnitScores,
                    layer_scores: Sequence[float] | None = None) -> dict[str, float]:
    """Share of each axis's importance that pruning ``config`` to ``plan`` keeps: the kept
    units' scores over all units' scores, per axis (``heads``, ``neurons``, ``channels``,
    ``layers``), with the units :func:`.prune.kept_units` picks from ``scores``.

    Heads and neurons of a dropped layer are lost with it. ``layer_scores`` (one per source
    layer, higher = keep; e.g. the LM-loss increase when a layer is removed) weigh the kept
    layers; without them every layer weighs the same. Negative scores count as 0; an axis
    whose scores are all 0 gives NaN."""
    kept = kept_units(config, plan, scores)
    heads, neurons = _clipped(scores.heads), _clipped(scores.neurons)
    channels = _clipped(scores.channels)
    n = config.num_hidden_layers
    if layer_scores is not None and len(layer_scores) != n:
        raise ValueError(f"layer_scores has {len(layer_scores)} entries; the model has {n} "
                         "layers, one score each")
    layer = _clipped(np.ones(n) if layer_scores is None else np.array(layer_scores, float))
    rows = list(plan.layers)
    return {
        "heads": _share(sum(float(heads[i, h].sum()) for i, h in zip(rows, kept.heads)),
                        float(heads.sum())),
        "neurons": _share(sum(float(neurons[i, u].sum()) for i, u in zip(rows, kept.neurons)),
                          float(neurons.sum())),
        "channels": _share(float(channels[kept.channels].sum()), float(channels.sum())),
        "layers": _share(float(layer[rows].sum()), float(layer.sum()))}


def _labelled(plans, num_layers: int) -> dict[str, PrunePlan]:
    """``{label: plan}`` from a mapping or a sequence (labels from :func:`plan_label`)."""
    items = (list(plans.items()) if isinstance(plans, Mapping)
             else [(plan_label(p, num_layers) if isinstance(p, PrunePlan) else None, p)
                   for p in plans])
    if not items:
        raise ValueError("no plans given; pass a list of PrunePlan or a {label: PrunePlan} dict")
    bad = [p for _, p in items if not isinstance(p, PrunePlan)]
    if bad:
        raise TypeError(f"plans must be PrunePlan objects; got {type(bad[0]).__name__} "
                        f"({bad[0]!r})")
    labels = [str(label) for label, _ in items]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f"plan labels {twice} occur more than once; each plan once, please")
    return dict(zip(labels, (p for _, p in items)))


def _check_tok_s(teacher_tok_s) -> float:
    """The teacher's measured tokens/s, NaN when not measured (predictions stay relative)."""
    tok_s = check_positive("teacher_tok_s (measured tokens/s)", teacher_tok_s,
                           optional="relative predictions only")
    return float("nan") if tok_s is None else tok_s


def plan_table(model, scores: UnitScores, plans, layer_scores: Sequence[float] | None = None,
               teacher_tok_s: float | None = None, context: int = 512) -> pd.DataFrame:
    """One row per plan of ``model`` (an HF model or its config): label, kind (width, depth,
    both, or full for the plan that keeps everything), shape (with ``source_layers``, the
    model's own layer count, so that a depth plan reads "3 of 6 layers"),
    parameters and forward FLOPs per token (at ``context``), each also as a ratio of the
    unpruned teacher's, the predicted throughput, and the share of importance kept per axis
    (:func:`importance_kept`; ``importance_kept`` is their plain mean, a one-number summary
    for plotting).

    ``predicted_speedup`` is the teacher's FLOPs per token over the plan's, and
    ``predicted_tok_s`` is ``teacher_tok_s`` (a measured tokens/s of the teacher, timed long
    enough to repeat: ``compress.evaluate.steady_decode_tok_s``) times it, NaN without one. Both are a FLOPs model, not a measurement: on small models per-call
    overhead, not FLOPs, decides much of the speed (RESULTS.md, ``prune_plan_speed``), so
    measure the plans you pick (``compress.evaluate.decode_throughput``).

    ``plans``: a sequence of :class:`PrunePlan` (labels from :func:`plan_label`) or a
    ``{label: plan}`` dict."""
    check_model_type(model)
    config = getattr(model, "config", model)
    tok_s = _check_tok_s(teacher_tok_s)
    if not isinstance(scores, UnitScores):
        raise TypeError(f"scores must be UnitScores (e.g. importance_from_batches(...).scores), "
                        f"got {type(scores).__name__}")
    source = param_count(config), flops_per_token(config, None, context)
    rows = []
    for label, plan in _labelled(plans, config.num_hidden_layers).items():
        flops = flops_per_token(config, plan, context)
        params = param_count(config, plan)
        kept = importance_kept(config, plan, scores, layer_scores)
        rows.append({"label": label, "kind": plan_kind(config, plan) or "full",
                     "layers": ",".join(map(str, plan.layers)), "num_layers": len(plan.layers),
                     "source_layers": config.num_hidden_layers,
                     "hidden_size": plan.hidden_size, "intermediate_size": plan.intermediate_size,
                     "heads_per_group": plan.heads_per_group, "params": params,
                     "params_ratio": params / source[0], "flops_per_token": flops,
                     "flops_ratio": flops / source[1], "predicted_speedup": source[1] / flops,
                     "predicted_tok_s": tok_s * source[1] / flops,
                     **{f"kept_{a}": kept[a] for a in AXES},
                     "importance_kept": float(np.mean([kept[a] for a in AXES]))})
    return pd.DataFrame(rows, columns=PLAN_TABLE_COLUMNS)
