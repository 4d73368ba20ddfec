"""A decode step's plan: what the step does (:class:`StepPlan`), the decoding arm that makes one
(:class:`Arm`), the drafter that serves it (:func:`serving_drafter`) and its drafts
(:func:`propose`).

A schedule (``rollout.schedule``) answers each decode step with a plan; the decoder drafts it
here and verifies the drafts (``rollout.drafts``, which holds their shapes and knows no plan).
An arm turns its parameters into the plan a step runs (``Arm.plan``): plain, a chain or a tree,
drafted by the main drafter or a named member of a drafter set. A plugin arm's plans carry the
arm itself (``StepPlan.arm``), so that the step drafts as the arm's ``propose`` says: a new
shape with its own draft logic needs no edit of the drafting code. Arms are named and looked
up in ``speculative.arms.ARMS`` (the registry sits above this layer; the drafting code below
it only needs the protocol).

Whatever an arm proposes, the policy's verification keeps the step lossless, provided the
arm decides *which* drafts to propose from what precedes each one (the context and the
earlier drafts), never from a draft's own value in speculative sampling mode: the rejection
rule needs each proposed token drawn from the distribution it is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checks import check_choice, check_int
from .drafts import ChainDraft, TreeDraft

__all__ = ["StepPlan", "PLAIN", "Arm", "propose", "propose_shape", "serving_drafter",
           "check_tree_drafter", "check_schedule_drafter"]

PLAN_KINDS = ("plain", "speculative")


@dataclass(frozen=True)
class StepPlan:
    """What one decode step does.

    Args:
        kind: ``"plain"`` (feed each row's last token, sample one) or ``"speculative"``.
        k: draft depth of a speculative step (tokens drafted per row).
        branch: candidates expanded per node and kept per depth; 1 is a chain.
        verify_budget: tree nodes per row the policy verifies in one pass, the best by
            cumulative drafter logprob; ``None``: all (``branch * k``). A speculative plan
            with ``branch > 1`` or a budget drafts a tree (``rollout.drafts``).
        drafter: which drafter drafts a speculative step: the name of a member of the
            rollout's drafter set (``speculative.DrafterSet``; a lone drafter answers to its
            own ``name``); ``None``: the rollout's main drafter (``serving_drafter``).
        arm: the decoding arm that made this plan when it is a plugin's
            (``speculative.arms``): tables name the plan by it, and the step drafts as its
            ``propose`` says (:class:`Arm`). ``None`` for the built-in shapes, which
            the fields above name and draft.
    """

    kind: str = "plain"
    k: int = 0
    branch: int = 1
    verify_budget: int | None = None
    drafter: str | None = None
    arm: Arm | None = None

    def __post_init__(self):
        check_choice("StepPlan.kind", self.kind, PLAN_KINDS)
        if self.kind == "speculative":
            check_int("StepPlan.k (the draft depth of a speculative step)", self.k, 1)
        check_int("StepPlan.branch (1: a chain)", self.branch, 1)
        check_int("StepPlan.verify_budget", self.verify_budget, 1, optional="all nodes")
        if self.drafter is not None and (not isinstance(self.drafter, str) or not self.drafter
                                         or self.kind != "speculative"):
            raise ValueError(f"StepPlan.drafter must be None (the main drafter) or, on a "
                             f"speculative plan, a drafter's name; got {self.drafter!r} on a "
                             f"{self.kind} plan")

    @property
    def speculative(self) -> bool:
        return self.kind == "speculative"

    @property
    def tree(self) -> bool:
        """Whether the step drafts a tree rather than a chain."""
        return self.speculative and (self.branch > 1 or self.verify_budget is not None)


PLAIN = StepPlan()
"""The plan of a plain step: no drafts."""


class Arm:
    """A decoding arm's hooks (subclass it; an arm is a frozen dataclass whose fields are its
    parameters: ``name:field=value,...``).

    Required: ``plan() -> StepPlan``, the plan of a step this arm runs (no default: an arm
    without one is refused when it registers).

    Optional: ``propose(drafter, ctx, plan, k) -> ChainDraft | TreeDraft``, the step's drafts:
    ``drafter`` is the one that serves the plan (:func:`serving_drafter`), ``ctx`` the step's
    frozen ``drafts.DraftInput`` (hand it to the drafter: it holds the policy states the
    decoder took for a drafter that reads them), ``k`` the plan's depth clipped to the
    context. The proposal must hold every live row and between 1 and ``k`` drafts per row (a
    tree: at most ``k`` deep). Default: the plan's own shape, a chain or a tree
    (:func:`propose_shape`).
    """

    if TYPE_CHECKING:
        def plan(self) -> StepPlan: ...

    def propose(self, drafter, ctx, plan: StepPlan, k: int) -> ChainDraft | TreeDraft:
        return propose_shape(drafter, ctx, plan, k)


_TREE_DRAFTERS = ("trees need a drafter with draft_tree(ctx, k, branch) and supports_trees: "
                 "EagleDrafter ('eagle') or LMDrafter ('small_lm'); chains (branch=1, "
                 "verify_budget=None) work with any drafter")


def serving_drafter(drafter, name: str | None, asker="a plan"):
    """``(its name, the drafter)`` that drafts a step whose plan names ``name``
    (``StepPlan.drafter``). A drafter with ``members`` (a dict of named drafters, and ``main``
    one of its keys: ``speculative.DrafterSet``) serves a plan naming a member with that
    member, and a plan naming none with its main one; a lone drafter serves plans naming
    none or its own ``name``. Any other name is refused, naming what the drafter has
    (``asker`` says who asked)."""
    members = drafter.members
    if members is None:
        own = drafter.name
        if name is None or name == own:
            return own, drafter
        have = [own]
    else:
        key = drafter.main if name is None else name
        if key in members:
            return key, members[key]
        have = list(members)
    raise ValueError(f"{asker} names drafter {name!r}, but the rollout's drafter "
                     f"({type(drafter).__name__}) has {have}; name one of those, or draft with "
                     f"a DrafterSet that has a member {name!r} (workbench.speculative)")


def check_tree_drafter(drafter, asker) -> None:
    """Refuse a drafter that drafts chains only when ``asker`` (a tree :class:`StepPlan`, or a
    schedule with ``needs_trees``) asks for trees, before anything is drafted (every
    verification mode verifies trees losslessly, so the drafter is the only thing that can be
    missing)."""
    if drafter.supports_trees:
        return
    what = (f"the plan {asker}" if isinstance(asker, StepPlan)
            else f"the schedule {type(asker).__name__} (needs_trees=True)")
    raise ValueError(f"{what} asks for draft trees, but drafter "
                     f"{drafter.name!r} ({type(drafter).__name__}) drafts "
                     f"chains only; {_TREE_DRAFTERS}")


def check_schedule_drafter(schedule, drafter) -> None:
    """Before a rollout's first forward: refuse a schedule that may plan trees
    (``schedule.needs_trees``) when ``drafter`` drafts chains only, or whose plans name a
    drafter (``schedule.drafter_names``) that ``drafter`` does not have (a schedule that
    declares neither, ``rollout.schedule.Schedule``'s defaults, is checked step by step)."""
    if schedule.needs_trees:
        check_tree_drafter(drafter, schedule)
    for name in sorted(schedule.drafter_names):
        serving_drafter(drafter, name, f"the schedule {type(schedule).__name__}")


def propose(drafter, ctx, plan: StepPlan, k: int) -> ChainDraft | TreeDraft:
    """The proposal of ``drafter`` (the one that serves ``plan``: :func:`serving_drafter`) for
    one step of ``plan``, ``k`` deep (``k <= plan.k``, clipped to the context): what the
    plan's arm proposes when a plugin arm made it (``StepPlan.arm``, :class:`Arm`:
    checked to hold every row and 1 to ``k`` drafts each), else :func:`propose_shape`."""
    if plan.arm is None:
        return propose_shape(drafter, ctx, plan, k)
    draft = plan.arm.propose(drafter, ctx, plan, k)
    rows = len(ctx.request_ids)
    if (not isinstance(draft, (ChainDraft, TreeDraft)) or draft.tokens.shape[0] != rows
            or draft.size < 1 or (draft.k if isinstance(draft, TreeDraft) else draft.size) > k):
        raise ValueError(f"arm {plan.arm!r} proposed {draft!r:.120}; accepted a ChainDraft or "
                         f"TreeDraft of the step's {rows} rows with 1 to {k} drafts each "
                         "(rollout.plan.Arm.propose)")
    return draft


def propose_shape(drafter, ctx, plan: StepPlan, k: int) -> ChainDraft | TreeDraft:
    """The proposal of the plan's own shape: a chain of ``k`` drafts, or a tree ``k`` deep
    pruned to the plan's ``verify_budget``."""
    if not plan.tree:
        return ChainDraft(*drafter.draft(ctx, k))
    check_tree_drafter(drafter, plan)
    return TreeDraft(drafter.draft_tree(ctx, k, plan.branch).select(plan.verify_budget), k)
