"""Strategy strings: how the adaptive schedule's arms, and the steps table's ``arm`` column,
name a decode step's plan. Every form is a decoding arm registered in
``speculative.arms.ARMS``, so a plugin's arm is named, parsed and tabled like a built-in.

Built-in forms (integers K, B, N >= 1):

plain                 plain decoding, no drafts.
chain:k=K             a chain of K draft tokens per row by the rollout's main drafter.
tree:k=K,b=B[,n=N]    a tree K deep, B tokens per node, N nodes verified per row (all when
                      omitted), by the main drafter.
sibling:k=K           a chain of K drafts by the drafter set's ``"sibling"`` member
                      (``speculative.sibling.SiblingDrafter``): beside the EAGLE chains and
                      trees, the bandit weighs drafting from a row's siblings.

A plugin kind ``NAME`` is written ``NAME:field=value,...`` (its dataclass fields, the ones
that are not None). :func:`strategy_name` writes a plan back in these forms; a chain plan
naming another member ``NAME`` is written ``NAME:k=K`` (an arm name; only ``sibling`` parses
back).
"""
from __future__ import annotations

from ..rollout.plan import Arm, StepPlan
from .arms import BUILTIN_FORMS, arm_forms, arm_name, arm_of, plan_of

__all__ = ["parse_strategy", "strategy_name"]

PLAIN_ARM = "plain"
SIBLING = "sibling"  # the member name a "sibling:k=K" plan asks for
STRATEGY_FORMS = BUILTIN_FORMS  # the built-in forms; arm_forms() adds the plugins'


def parse_strategy(strategy: str | StepPlan | Arm) -> StepPlan:
    """The :class:`StepPlan` a strategy string names (a StepPlan passes through; an arm
    gives its plan); ValueError naming anything else, what is wrong with it, and the
    accepted forms with the registered arm kinds."""
    if isinstance(strategy, StepPlan):
        return strategy
    try:
        if isinstance(strategy, Arm):
            return plan_of(strategy)
        if not isinstance(strategy, str):
            raise ValueError("not a string")
        return plan_of(arm_of(strategy))
    except ValueError as e:
        raise ValueError(f"unknown SD strategy {strategy!r} ({e}); accepted: {arm_forms()}, "
                         "or a StepPlan") from None


def strategy_name(plan: StepPlan) -> str:
    """The canonical string of a plan (what :func:`parse_strategy` reads back): a plugin
    arm's own (``StepPlan.arm``), else the built-in shape's. A tree that names a drafter has
    none: ValueError."""
    if plan.arm is not None:
        return arm_name(plan.arm)
    if not plan.speculative:
        return PLAIN_ARM
    if plan.branch == 1 and plan.verify_budget is None:
        return f"{plan.drafter or 'chain'}:k={plan.k}"
    if plan.drafter is not None:
        raise ValueError(f"{plan} is a tree drafted by {plan.drafter!r}: strategy strings name "
                         f"trees of the main drafter only; accepted: {STRATEGY_FORMS}")
    budget = "" if plan.verify_budget is None else f",n={plan.verify_budget}"
    return f"tree:k={plan.k},b={plan.branch}{budget}"
