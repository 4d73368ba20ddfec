"""Architecture search, Minitron style: enumerate the pruned architectures whose parameter
count lies near a target, then rank them by what pruning does to them (e.g. LM loss) before
and after a short retraining, because the best pruned candidate is not always the best once
retrained.

Candidates vary width (hidden size, MLP size, query heads per KV group) and depth (how many
layers stay; which ones come from per-layer scores, or else a contiguous block is dropped).
Counts come from :mod:`.plan` alone, so pricing a candidate builds no model.
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import pandas as pd

from .plan import PrunePlan, flops_per_token, param_count

__all__ = ["width_grid", "depth_layers", "plan_kind", "enumerate_plans", "rank_candidates"]

COLUMNS = ["plan", "kind", "num_layers", "hidden_size", "intermediate_size", "heads_per_group",
           "params", "params_ratio", "flops_ratio"]


def width_grid(size: int, multiple: int = 16, steps: int = 16) -> list[int]:
    """About ``steps`` candidate widths up to ``size``, all multiples of ``multiple`` but
    ``size`` itself: CPU (and GPU) matmul kernels run fastest on widths that are multiples of
    8 or 16, so odd widths save parameters without saving time."""
    step = max(multiple, -(-size // (steps * multiple)) * multiple)
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
    if isinstance(target, bool) or not isinstance(target, (int, float)) or target <= 0:
        raise ValueError(f"target {target!r} is not accepted: give a fraction of the source "
                         f"(a float in (0, 1]) or a parameter count (an int)")
    count = round(target * source) if isinstance(target, float) else int(target)
    if count > source:
        raise ValueError(f"target {target!r} ({count} parameters) is larger than the source's "
                         f"{source} parameters; pruning only removes units")
    return count


def plan_kind(config, plan: PrunePlan) -> str | None:
    """``width``, ``depth``, ``both``, or None for the plan that keeps everything."""
    full = PrunePlan.full(config)
    narrower = (plan.hidden_size, plan.intermediate_size, plan.heads_per_group) != \
        (full.hidden_size, full.intermediate_size, full.heads_per_group)
    shallower = len(plan.layers) < len(full.layers)
    return {(True, True): "both", (True, False): "width", (False, True): "depth"}.get(
        (narrower, shallower))


def _candidates(config, layer_scores, multiple: int, steps: int):
    """Every plan on the grid that transformers can load, the full one included."""
    group = config.num_attention_heads // config.num_key_value_heads
    n = config.num_hidden_layers
    layer_sets = [depth_layers(k, n, layer_scores) for k in range(1, n + 1)]
    for hidden, mlp, heads, layers in itertools.product(
            width_grid(config.hidden_size, multiple, steps),
            width_grid(config.intermediate_size, multiple, steps), range(1, group + 1),
            layer_sets):
        plan = PrunePlan(layers, hidden, mlp, heads)
        if plan.format_problem(config) is None:  # only plans that load in transformers
            yield plan


def _check_layer_scores(config, layer_scores) -> None:
    if layer_scores is not None and len(layer_scores) != config.num_hidden_layers:
        raise ValueError(f"layer_scores has {len(layer_scores)} entries; the model has "
                         f"{config.num_hidden_layers} layers, one score each")


def _row(config, plan: PrunePlan, params: int, context: int, source: tuple[int, int]) -> dict:
    """One table row; ``source`` is the unpruned (parameters, FLOPs per token)."""
    return {"plan": plan, "kind": plan_kind(config, plan), "num_layers": len(plan.layers),
            "hidden_size": plan.hidden_size, "intermediate_size": plan.intermediate_size,
            "heads_per_group": plan.heads_per_group, "params": params,
            "params_ratio": params / source[0],
            "flops_ratio": flops_per_token(config, plan, context) / source[1]}


def enumerate_plans(config, target: float | int, tolerance: float = 0.05,
                    layer_scores: Sequence[float] | None = None, multiple: int = 16,
                    steps: int = 16, context: int = 512) -> pd.DataFrame:
    """Pruned architectures of ``config`` whose parameter count is within ``tolerance``
    (relative) of ``target``: a fraction of the source's parameters (float) or a count (int).

    Width values are multiples of ``multiple`` (:func:`width_grid`: CPU matmul kernels prefer
    multiples of 8/16); depth keeps 1..all layers (:func:`depth_layers`). One row per plan
    (columns :data:`COLUMNS`; ``kind`` is width, depth or both; ``flops_ratio`` is forward
    FLOPs per token at ``context`` over the source's), nearest to the target first. Raises
    ``ValueError`` for a target larger than the source or one no plan reaches, naming the
    nearest counts there are."""
    _check_layer_scores(config, layer_scores)
    goal = _target_params(config, target)
    priced = [(plan, param_count(config, plan))
              for plan in _candidates(config, layer_scores, multiple, steps)]
    source = param_count(config), flops_per_token(config, None, context)
    rows = [_row(config, plan, params, context, source) for plan, params in priced
            if abs(params - goal) <= tolerance * goal and plan_kind(config, plan) is not None]
    if not rows:
        below = max((p for _, p in priced if p < goal), default=None)
        above = min((p for _, p in priced if p > goal), default=None)
        raise ValueError(f"no plan on the grid lies within {tolerance:.0%} of target {target!r} "
                         f"({goal} parameters); the nearest counts are {below} below and "
                         f"{above} above; try a finer grid (multiple, steps) or another target")
    table = pd.DataFrame(rows, columns=COLUMNS)
    order = (table["params"] - goal).abs().sort_values(kind="stable").index
    return table.loc[order].reset_index(drop=True)


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
