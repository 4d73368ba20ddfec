"""The decoding-arm protocol: a named step strategy, and, when it wants one, its own drafting.

An arm turns its parameters into the :class:`~workbench.rollout.schedule.StepPlan` a decode
step runs (``plan``): plain, a chain or a tree, drafted by the main drafter or a named member
of a drafter set. A plugin arm's plans carry the arm itself (``StepPlan.arm``), so that the
step drafts as the arm's ``propose`` says: a new shape with its own draft logic needs no edit
of ``rollout.drafts``. Arms are named and looked up in ``speculative.arms.ARMS`` (the registry
sits above this layer; the drafting code below it only needs the protocol).

Whatever an arm proposes, the policy's verification keeps the step lossless, provided the
arm decides *which* drafts to propose from what precedes each one (the context and the
earlier drafts), never from a draft's own value in speculative sampling mode: the rejection
rule needs each proposed token drawn from the distribution it is tested against.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .drafts import propose_shape

if TYPE_CHECKING:
    from .drafts import ChainDraft, TreeDraft
    from .schedule import StepPlan

__all__ = ["Arm"]


class Arm:
    """A decoding arm's hooks (subclass it; an arm is a frozen dataclass whose fields are its
    parameters: ``name:field=value,...``).

    Required: ``plan() -> StepPlan``, the plan of a step this arm runs (no default: an arm
    without one is refused when it registers).

    Optional: ``propose(drafter, ctx, plan, k) -> ChainDraft | TreeDraft``, the step's drafts:
    ``drafter`` is the one that serves the plan (``drafts.serving_drafter``), ``ctx`` the
    step's frozen ``drafts.DraftInput`` (hand it to the drafter: it holds the policy states
    the decoder took for a drafter that reads them), ``k`` the plan's depth clipped to the
    context. The proposal
    must hold every live row and between 1 and ``k`` drafts per row (a tree: at most ``k``
    deep). Default: the plan's own shape, a chain or a tree (``drafts.propose_shape``).
    """

    if TYPE_CHECKING:
        def plan(self) -> StepPlan: ...

    def propose(self, drafter, ctx, plan: StepPlan, k: int) -> ChainDraft | TreeDraft:
        return propose_shape(drafter, ctx, plan, k)
