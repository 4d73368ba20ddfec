"""Architecture search, Minitron style: enumerate the pruned architectures whose parameter
count lies near a target, then rank them by what pruning does to them (e.g. LM loss) before
and after a short retraining, because the best pruned candidate is not always the best once
retrained.

Candidates vary width (hidden size, MLP size, query heads per KV group) and depth (how many
layers stay; which ones come from per-layer scores, or else a contiguous block is dropped).
The grid reaches every shape that loads: every multiple of 8 of each width (and the source's
own), every head count a KV group can keep, every layer count, less only the hidden sizes
transformers' ``LlamaConfig`` refuses. Counts come from :mod:`.plan`'s formulas, applied to
the whole grid at once as arrays, so pricing a candidate builds no model (the default model's
~40,000 candidates are priced and tabled in about half a second). Every entry refuses a model family other than the Llama family by name
(:func:`~.plan.check_model_type`) before reading the config.

A target is a wish, not a promise: a small model has few plans (4 layers give depth plans at 4
sizes only), so :func:`nearest_plan` snaps a target to the feasible plan nearest to it, and
:func:`snap_note` is the line that says what was asked and what was got. Only a target that
no plan can meet (outside (0, 1) of the source, or a kind the model has no plan of) is refused,
with the range the feasible plans span.
"""
from __future__ import annotations

import numbers
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from ..checks import check_int, check_positive
from .plan import (PrunePlan, attention_spans, check_model_type, flops_per_token, llama_refuses,
                   param_count, shape_flops, shape_params)

__all__ = ["feasible_plans", "enumerate_plans", "nearest_plan", "snap_note"]

KINDS = ("width", "depth", "both")

# the most candidates one grid may hold: each row holds a PrunePlan (the default model's
# ~40,000 take about half a second); a larger model passes ``steps`` for a coarser grid
MAX_CANDIDATES = 250_000

COLUMNS = ["plan", "kind", "num_layers", "hidden_size", "intermediate_size", "heads_per_group",
           "params", "params_ratio", "flops_ratio"]


def width_grid(size: int, multiple: int = 8, steps: int | None = None) -> list[int]:
    """Candidate widths up to ``size``: every multiple of ``multiple`` below it and ``size``
    itself (CPU and GPU matmul kernels run fastest on widths that are multiples of 8 or 16, so
    odd widths save parameters without saving time); with ``steps``, about that many of them,
    evenly spaced (a coarser grid for a large model)."""
    check_int("multiple", multiple, 1)
    check_int("steps", steps, 1, optional="every multiple")
    step = multiple if steps is None else max(multiple, -(-size // (steps * multiple)) * multiple)
    return list(range(step, size, step)) + [size]


def depth_layers(num_keep: int, num_layers: int,
                 layer_scores: Sequence[float] | None = None) -> tuple[int, ...]:
    """The ``num_keep`` layers a depth prune keeps: the best by ``layer_scores`` (higher =
    keep; e.g. LM loss increase or Block Importance when the layer is removed), else all but a
    contiguous block that ends just before the last layer: Minitron found dropping one block
    best for Llama-3.1, and the first and last layers matter most."""
    if layer_scores is None:
        return tuple(range(num_keep - 1)) + (num_layers - 1,)
    order = sorted(range(num_layers), key=lambda i: -float(layer_scores[i]))
    return tuple(sorted(order[:num_keep]))


def _target_params(config, target: float | int) -> int:
    """A target as a parameter count: a float is a fraction of the source, an int a count."""
    source = param_count(config)
    try:
        count = (check_int("target", target, 1) if isinstance(target, numbers.Integral)
                 else round(check_positive("target", target) * source))
    except ValueError:  # one message for both forms
        raise ValueError(f"target {target!r} is not accepted: give a fraction of the source "
                         f"(a float in (0, 1]) or a parameter count (an int)") from None
    if count > source:
        raise ValueError(f"target {target!r} ({count} parameters) is larger than the source's "
                         f"{source} parameters; pruning only removes units")
    return count


def plan_kind(config, plan: PrunePlan) -> str | None:
    """``width``, ``depth``, ``both``, or None for the plan that keeps everything."""
    check_model_type(config)
    full = PrunePlan.full(config)
    narrower = (plan.hidden_size, plan.intermediate_size, plan.heads_per_group) != \
        (full.hidden_size, full.intermediate_size, full.heads_per_group)
    shallower = len(plan.layers) < len(full.layers)
    return {(True, True): "both", (True, False): "width", (False, True): "depth"}.get(
        (narrower, shallower))


def _grid(config, multiple: int, steps: int | None) -> dict[str, np.ndarray]:
    """Every (hidden, MLP, query heads per group, layers kept) on the grid that transformers
    loads, the full shape included, as columns in the grid's order (layers fastest)."""
    group = config.num_attention_heads // config.num_key_value_heads
    n = config.num_hidden_layers
    axes = [width_grid(config.hidden_size, multiple, steps),
            width_grid(config.intermediate_size, multiple, steps), range(1, group + 1),
            range(1, n + 1)]
    size = int(np.prod([len(axis) for axis in axes]))
    if size > MAX_CANDIDATES:
        raise ValueError(f"the grid of multiples of {multiple} holds {size:,} candidates "
                         f"(widths {config.hidden_size} x {config.intermediate_size}, {group} "
                         f"head counts, {n} depths); accepted: at most {MAX_CANDIDATES:,}: pass "
                         f"steps (widths per axis) for a coarser grid, or a larger multiple")
    columns = dict(zip(("hidden", "mlp", "per_group", "depth"),
                       (c.ravel() for c in np.meshgrid(*map(np.array, axes), indexing="ij"))))
    loads = ~llama_refuses(config, columns["hidden"],
                           columns["per_group"] * config.num_key_value_heads)
    return {name: column[loads] for name, column in columns.items()}


def _kinds(config, grid: dict[str, np.ndarray]) -> np.ndarray:
    """:func:`plan_kind` of every grid row ("" for the full shape)."""
    narrower = ((grid["hidden"] != config.hidden_size)
                | (grid["mlp"] != config.intermediate_size)
                | (grid["per_group"] != config.num_attention_heads // config.num_key_value_heads))
    shallower = grid["depth"] < config.num_hidden_layers
    return np.select([narrower & shallower, narrower, shallower], ["both", "width", "depth"], "")


def _check_layer_scores(config, layer_scores) -> None:
    if layer_scores is not None and len(layer_scores) != config.num_hidden_layers:
        raise ValueError(f"layer_scores has {len(layer_scores)} entries; the model has "
                         f"{config.num_hidden_layers} layers, one score each")


def _check_kinds(kinds) -> tuple[str, ...]:
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds {kinds!r}: accepted a non-empty selection of {KINDS}")
    return kinds


def feasible_plans(config, kinds=KINDS, layer_scores: Sequence[float] | None = None,
                   max_flops_ratio: float | None = None, multiple: int = 8,
                   steps: int | None = None, context: int = 512) -> pd.DataFrame:
    """Every plan of ``kinds`` on the grid (:func:`width_grid`, :func:`depth_layers`) that
    transformers can load, the plan that keeps everything left out; with ``max_flops_ratio``
    only those whose FLOPs per token at ``context`` are at most that share of the source's.
    One row per plan (columns :data:`COLUMNS`), in the grid's order. A grid of more than
    :data:`MAX_CANDIDATES` candidates is refused, naming its size: pass ``steps``."""
    check_model_type(config)
    _check_layer_scores(config, layer_scores)
    kinds = _check_kinds(kinds)
    grid = _grid(config, multiple, steps)
    kind = _kinds(config, grid)
    n, kv = config.num_hidden_layers, config.num_key_value_heads
    layer_sets = [depth_layers(k, n, layer_scores) for k in range(1, n + 1)]
    spans = attention_spans(config, context)
    span_sums = np.array([sum(spans[i] for i in layers) for layers in layer_sets])
    heads = grid["per_group"] * kv
    params = shape_params(config, grid["hidden"], grid["mlp"], heads, grid["depth"])
    flops = shape_flops(config, grid["hidden"], grid["mlp"], heads, grid["depth"],
                        span_sums[grid["depth"] - 1])
    flops_ratio = flops / flops_per_token(config, None, context)
    keep = np.isin(kind, kinds)
    if max_flops_ratio is not None:
        keep &= flops_ratio <= max_flops_ratio
    rows = np.flatnonzero(keep)
    plans = [PrunePlan(layer_sets[grid["depth"][r] - 1], int(grid["hidden"][r]),
                       int(grid["mlp"][r]), int(grid["per_group"][r])) for r in rows]
    return pd.DataFrame({
        "plan": pd.Series(plans, dtype=object), "kind": kind[rows],
        "num_layers": grid["depth"][rows], "hidden_size": grid["hidden"][rows],
        "intermediate_size": grid["mlp"][rows], "heads_per_group": grid["per_group"][rows],
        "params": params[rows], "params_ratio": params[rows] / param_count(config),
        "flops_ratio": flops_ratio[rows]}, columns=COLUMNS)


def _nearest_first(table: pd.DataFrame, goal: int) -> pd.DataFrame:
    order = (table["params"] - goal).abs().sort_values(kind="stable").index
    return table.loc[order].reset_index(drop=True)


def enumerate_plans(config, target: float | int, tolerance: float = 0.05,
                    layer_scores: Sequence[float] | None = None, multiple: int = 8,
                    steps: int | None = None, context: int = 512) -> pd.DataFrame:
    """Pruned architectures of ``config`` whose parameter count is within ``tolerance``
    (relative) of ``target``: a fraction of the source's parameters (float) or a count (int).

    Width values are every multiple of ``multiple`` (:func:`width_grid`: CPU matmul kernels
    prefer multiples of 8/16; ``steps`` makes the grid coarser); depth keeps 1..all layers (:func:`depth_layers`). One row per plan
    (columns :data:`COLUMNS`; ``kind`` is width, depth or both; ``flops_ratio`` is forward
    FLOPs per token at ``context`` over the source's), nearest to the target first. Raises
    ``ValueError`` for a target larger than the source or one no plan reaches, naming the
    nearest counts there are."""
    check_model_type(config)
    _check_layer_scores(config, layer_scores)
    goal = _target_params(config, target)
    table = _nearest_first(feasible_plans(config, KINDS, layer_scores, None, multiple, steps,
                                          context), goal)
    near = table[(table["params"] - goal).abs() <= tolerance * goal].reset_index(drop=True)
    if near.empty:
        params = table["params"]
        below = int(params[params < goal].max()) if (params < goal).any() else None
        above = int(params[params > goal].min()) if (params > goal).any() else None
        raise ValueError(f"no plan on the grid lies within {tolerance:.0%} of target {target!r} "
                         f"({goal} parameters); the nearest counts are {below} below and "
                         f"{above} above; try a finer grid (multiple, steps) or another target")
    return near


def _feasible_range(config, kinds, table: pd.DataFrame, max_flops_ratio) -> str:
    """Where the feasible plans of each kind lie, for an error message."""
    budget = f" within FLOPs ratio {max_flops_ratio}" if max_flops_ratio is not None else ""
    if table.empty:
        anywhere = feasible_plans(config)
        spans = [f"{k} {p.min():.2f}-{p.max():.2f}"
                 for k, p in anywhere.groupby("kind", sort=False)["params_ratio"]]
        n = config.num_hidden_layers
        return (f"this model ({n} layer{'s' * (n != 1)}, hidden {config.hidden_size}) "
                f"has no {'/'.join(kinds)} plan{budget}; plans it has keep (share of "
                f"parameters): {', '.join(spans) or 'none'}")
    return (f"feasible {'/'.join(kinds)} plans{budget} keep "
            f"{table['params_ratio'].min():.2f}-{table['params_ratio'].max():.2f} of the "
            f"parameters")


def nearest_plan(config, target: float | int, kinds=KINDS,
                 layer_scores: Sequence[float] | None = None,
                 max_flops_ratio: float | None = None, multiple: int = 8,
                 steps: int | None = None) -> pd.Series:
    """The row (:func:`feasible_plans`) of the plan of ``kinds`` whose parameter count is
    nearest ``target`` (a fraction of the source's parameters, or a count), however far:
    :func:`snap_note` says how far. A target outside (0, 1) of the source, or a selection
    with no plan at all, raises ``ValueError`` naming the range the feasible plans span."""
    check_model_type(config)
    kinds = _check_kinds(kinds)
    table = feasible_plans(config, kinds, layer_scores, max_flops_ratio, multiple, steps)
    source = param_count(config)
    fraction = None
    if isinstance(target, numbers.Real) and not isinstance(target, bool):
        fraction = target / source if isinstance(target, numbers.Integral) else float(target)
    in_range = fraction is not None and 0 < fraction < 1
    if in_range and not table.empty:
        return _nearest_first(table, round(fraction * source)).iloc[0]
    why = "" if in_range else (
        f"target {target!r} is not accepted: give a fraction of the source's parameters in "
        f"(0, 1), or a parameter count in (0, {source:,}); ")
    raise ValueError(why + _feasible_range(config, kinds, table, max_flops_ratio))


def snap_note(config, target: float | int, row: pd.Series) -> str:
    """One line: the target asked, the plan got (its share of the parameters, layers kept of
    the source's, widths), e.g. ``depth plan: asked 0.5 of the parameters, got 0.46 (2 of 4
    layers, hidden 64, MLP 128, 2 of 2 query heads per KV group)``."""
    check_model_type(config)
    source = param_count(config)
    asked = (f"{target:,} parameters ({target / source:.2f})"
             if isinstance(target, numbers.Integral) else f"{target:g} of the parameters")
    group = config.num_attention_heads // config.num_key_value_heads
    return (f"{row['kind']} plan: asked {asked}, got "
            f"{row['params_ratio']:.2f} ({row['num_layers']} of {config.num_hidden_layers} "
            f"layers, hidden {row['hidden_size']}, MLP {row['intermediate_size']}, "
            f"{row['heads_per_group']} of {group} query heads per KV group)")


def rank_candidates(table: pd.DataFrame, score_fn: Callable[[PrunePlan], float],
                    column: str = "score", higher_is_better: bool = False) -> pd.DataFrame:
    """``table`` with ``score_fn(plan)`` of every row in ``column`` and its rank (1 = best) in
    ``{column}_rank``, best first. Call it once with the loss right after pruning and once
    after retraining (different columns) to show how the ranking moves."""
    scored = table.copy()
    scored[column] = [float(score_fn(plan)) for plan in scored["plan"]]
    scored[f"{column}_rank"] = scored[column].rank(method="first",
                                                   ascending=not higher_is_better).astype(int)
    return scored.sort_values(f"{column}_rank", kind="stable").reset_index(drop=True)
