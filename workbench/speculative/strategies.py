"""Strategy strings: how the adaptive schedule's arms, and the steps table's ``arm`` column,
name a decode step's plan.

Forms (integers K, B, N >= 1):

plain                 plain decoding, no drafts.
chain:k=K             a chain of K draft tokens per row by the rollout's main drafter.
tree:k=K,b=B[,n=N]    a tree K deep, B tokens per node, N nodes verified per row (all when
                      omitted), by the main drafter.
sibling:k=K           a chain of K drafts by the drafter set's ``"sibling"`` member
                      (``speculative.sibling.SiblingDrafter``): beside the EAGLE chains and
                      trees, the bandit weighs drafting from a row's siblings.

:func:`strategy_name` writes a plan back in these forms; a chain plan naming another member
``NAME`` is written ``NAME:k=K`` (an arm name; only ``sibling`` parses back).
"""
from __future__ import annotations

import re

from ..rollout.schedule import PLAIN, StepPlan

__all__ = ["parse_strategy", "strategy_name"]

PLAIN_ARM = "plain"
SIBLING = "sibling"  # the member name a "sibling:k=K" plan asks for
STRATEGY_FORMS = ("'plain', 'chain:k=K' or 'tree:k=K,b=B[,n=N]' (integers K, B, N >= 1), or "
                  f"'{SIBLING}:k=K' (a chain by the drafter set's {SIBLING!r} member)")
_CHAIN = re.compile(rf"(chain|{SIBLING}):k=(\d+)")
_TREE = re.compile(r"tree:k=(\d+),b=(\d+)(?:,n=(\d+))?")


def parse_strategy(strategy: str | StepPlan) -> StepPlan:
    """The :class:`StepPlan` a strategy string names (a StepPlan passes through); ValueError
    naming anything else and the accepted forms."""
    if isinstance(strategy, StepPlan):
        return strategy
    text = strategy.replace(" ", "") if isinstance(strategy, str) else ""
    if text == PLAIN_ARM:
        return PLAIN
    chain, tree = _CHAIN.fullmatch(text), _TREE.fullmatch(text)
    k, b, n = (chain.group(2), "1", None) if chain else tree.groups() if tree else ("0", "1", None)
    if int(k) < 1 or int(b) < 1 or (n is not None and int(n) < 1):  # no match reads as k=0
        raise ValueError(f"unknown SD strategy {strategy!r}; accepted: {STRATEGY_FORMS}, "
                         "or a StepPlan")
    drafter = SIBLING if chain and chain.group(1) == SIBLING else None
    return StepPlan("speculative", int(k), int(b), None if n is None else int(n), drafter)


def strategy_name(plan: StepPlan) -> str:
    """The canonical string of a plan (what :func:`parse_strategy` reads back). A tree that
    names a drafter has none: ValueError."""
    if not plan.speculative:
        return PLAIN_ARM
    if plan.branch == 1 and plan.verify_budget is None:
        return f"{plan.drafter or 'chain'}:k={plan.k}"
    if plan.drafter is not None:
        raise ValueError(f"{plan} is a tree drafted by {plan.drafter!r}: strategy strings name "
                         f"trees of the main drafter only; accepted: {STRATEGY_FORMS}")
    budget = "" if plan.verify_budget is None else f",n={plan.verify_budget}"
    return f"tree:k={plan.k},b={plan.branch}{budget}"
