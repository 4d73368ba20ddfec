"""Chains against trees: acceptance length of the same drafter at the same depth.

A tree of depth ``k`` verifies more candidates per step than a chain of ``k`` drafts, so it
emits more tokens per verify step (tau); what it costs is a wider verify pass and ``k`` wider
drafter steps. :func:`compare_chain_and_tree` measures tau for both on the same prompts, with
the same engine and sampling, so the two rows differ in the draft shape only.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ..rollout import RolloutConfig, RolloutEngine, StaticSchedule
from ..rollout.plan import check_schedule_drafter
from .measure import acceptance_length

__all__ = ["compare_chain_and_tree"]


def draft_shape_row(result, k: int, branch: int, verify_budget: int | None,
                    temperature: float, wall_s: float) -> dict:
    """One row of the comparison: tau (docs/design.md's definition) with what it depends on, and
    the nodes verified per row per verify step."""
    table = result.timeline.requests
    steps = int(table["verify_steps"].sum())
    return {"strategy": "chain" if branch == 1 and verify_budget is None else "tree",
            "k": k, "branch": branch, "verify_budget": verify_budget,
            "temperature": temperature, "acceptance_length": acceptance_length(result),
            "verified_per_step": float(table["drafted"].sum() / steps) if steps else np.nan,
            "verify_steps": steps, "wall_s": wall_s}


def compare_chain_and_tree(policy, tokenizer, drafter, prompts, k: int = 4, branch: int = 4,
                           verify_budget: int | None = 16, temperature: float = 0.0,
                           max_new_tokens: int = 128, max_batch_size: int = 8,
                           seed: int = 0) -> pd.DataFrame:
    """Roll ``prompts`` out with a chain (``StepPlan("speculative", k)``) and with a tree
    (``branch``, ``verify_budget``) of the same depth; one row per strategy (see
    :func:`draft_shape_row`). Both are lossless; ``same_tokens_as_chain`` says whether they
    emitted the same tokens (exact in float64; in float32 a verify pass of another shape
    rounds differently). ``wall_s`` is the wall clock of the whole rollout on this machine.

    Every argument is checked before the chain's rollout (a bad ``branch`` or
    ``verify_budget``, or a drafter without trees, would otherwise surface after it)."""
    shapes = ((1, None), (branch, verify_budget))
    schedules = [StaticSchedule(k, b, budget) for b, budget in shapes]
    for schedule in schedules:
        check_schedule_drafter(schedule, drafter)
    engine = RolloutEngine(policy, tokenizer)
    config = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                           max_batch_size=max_batch_size)
    rows, tokens = [], []
    for (b, budget), schedule in zip(shapes, schedules):
        t = time.perf_counter()
        result = engine.rollout(prompts, config, progress=False, drafter=drafter,
                                schedule=schedule)
        rows.append(draft_shape_row(result, k, b, budget, temperature, time.perf_counter() - t))
        tokens.append(result.tokens)
    # float32 verify passes of other shapes round differently (docs/design.md)
    rows[0]["same_tokens_as_chain"], rows[1]["same_tokens_as_chain"] = True, tokens[0] == tokens[1]
    return pd.DataFrame(rows)
