"""A chain that stops where the drafter grows unsure: a decoding arm in one file
(docs/extending.md, "A decoding arm"), the worked example of the ``workbench.arms`` seam.

``confident:k=K,p=P`` drafts a chain of up to ``K`` tokens with the rollout's drafter and
sends the policy only the depths where the drafter was sure: the chain ends before the first
depth at which the drafter's top probability, averaged over the batch's rows, falls below
``P`` (at least one draft is kept). A verify pass then feeds fewer tokens when the drafter is
guessing, and as many as a ``chain:k=K`` when it is confident; the bandit weighs it against the
fixed chains like any arm.

Lossless in every verification mode: whether depth ``j`` is kept depends on the drafter's
distribution there, which the context and the drafts before ``j`` set, never on the token
drawn at ``j`` (speculative sampling's rejection rule needs each proposed token drawn from the
distribution it is tested against; a cut decided by the token itself would bias it).

The drafter's confidence is read where it draws: a drafter that picks its drafts through the
draft input's ``choose`` (EAGLE, a small LM) shows each depth's logits there; one that does
not (n-grams) shows none, and its whole chain is kept.

Run it (notebook 04's ``plugins``; the arm then goes into ``arms``)::

    .venv/bin/python -m papermill notebooks/04_tlt_rl.ipynb out.ipynb \\
        -p plugins '["tests/plugins/confident_chain.py"]' \\
        -p arms '["chain:k=4", "confident:k=6,p=0.5"]'
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench.checks import check_int
from workbench.rollout.drafts import ChainDraft
from workbench.rollout.schedule import StepPlan
from workbench.speculative.arms import ARMS, Arm


@ARMS.register("confident")
@dataclass(frozen=True)
class ConfidentChain(Arm):
    """Up to ``k`` drafts, kept while the drafter's mean top probability is at least ``p``."""

    k: int = 6
    p: float = 0.5

    def __post_init__(self):
        check_int("confident arm's k (the longest chain)", self.k, 1)
        if not isinstance(self.p, (int, float)) or not 0 < self.p <= 1:
            raise ValueError(f"confident arm's p must be a probability in (0, 1], got {self.p!r}")

    def plan(self) -> StepPlan:
        return StepPlan("speculative", self.k)

    def propose(self, drafter, ctx, plan, k):
        probe = ConfidenceProbe(ctx)
        tokens, logq = drafter.draft(probe, k)
        keep = probe.sure_depths(self.p, tokens.shape[1])
        return ChainDraft(tokens[:, :keep], None if logq is None else logq[:, :keep])


class ConfidenceProbe:
    """The step's draft input (``rollout.drafts.DraftInput``) as the drafter sees it, noting
    at each depth it draws at the drafter's top probability, averaged over the rows
    (``choose(logits, depth)``)."""

    def __init__(self, ctx):
        self._ctx, self.confidence = ctx, {}

    def __getattr__(self, name):  # everything else is the context's own
        return getattr(self._ctx, name)

    def choose(self, logits, depth: int):
        self.confidence[depth] = float(logits.float().softmax(-1).amax(-1).mean())
        return self._ctx.choose(logits, depth)

    def sure_depths(self, p: float, drafted: int) -> int:
        """Drafts to keep: those before the first depth whose confidence is below ``p``, at
        least one (all when the drafter showed no confidence)."""
        for depth in range(drafted):
            if self.confidence.get(depth, 1.0) < p:
                return max(1, depth)
        return drafted
