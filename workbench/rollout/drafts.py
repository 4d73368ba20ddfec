"""A speculative step's drafts: a chain or a tree per row, how they are fed to the policy,
and what the policy keeps of them.

``BatchDecoder.spec_step`` runs one recipe for both shapes (clip, draft, feed, accept, rewrite
the cache, count); what differs between a chain and a tree lives here.

Glossary:

fed          ``[last_token] + drafts`` per row, ``[B, 1 + n]``: fed index 0 is the *root*
             (each row's emitted, unfed token), fed index ``j + 1`` is draft node ``j``.
depth        a fed node's distance from the root: its position is ``next_pos + depth``. A
             chain's drafts have depths ``1..k``; a tree's nodes share depths across branches.
visible      ``[B, 1 + n, 1 + n]`` ancestor-or-self mask of a tree (``rollout.tree``): each node
             attends to the committed cache, its ancestors and itself. ``None`` for a chain,
             whose drafts see each other causally.
verdict      what the policy keeps (:class:`Verdict`): per row the fed columns that stay in the
             cache (the root and an accepted path), the tokens it emits (the accepted drafts,
             then one token of the policy's own) and their logprobs and policy states.

Lossless in every mode. Greedy and coupled: the policy's token at every fed node is fixed (its
argmax, or its coupled draw at the node's response position, exactly what plain decoding would
emit there) and only drafts equal to it are kept. Speculative, chain: the rejection rule of
Leviathan et al. against the drafter's own distribution (``verify.speculative_accept``).
Speculative, tree: the drafter picks the nodes deterministically (its top candidates), so each
node's children are tried one by one with the one-hot rejection test against the policy's
residual (``verify.speculative_accept_tree``), which samples the policy's distribution exactly
at every node.

Speculative tree draws: the token at response position ``t = len(tokens) + depth`` is drawn at
the fed node of that depth from ``Stream.TOKEN`` at ``t``, as in plain decoding; the test of
the child with sibling rank ``i`` that would emit position ``t`` uses ``Stream.ACCEPT`` at
position ``t + i * 2**32`` (rank 0 is the chain's accept uniform). Responses are far shorter
than ``2**32`` tokens, so every (position, rank) pair has its own independent uniform, and the
walk visits one node per depth, so no uniform is used twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from . import verify
from .sampling import Stream, adjusted_logprobs, choose_tokens
from .schedule import StepPlan
from .tree import DraftTree

__all__ = ["ChainDraft", "TreeDraft", "Verdict", "propose", "propose_shape", "serving_drafter",
           "check_tree_drafter", "check_schedule_drafter"]

_RANK_STRIDE = 2**32  # accept-uniform position offset per sibling rank (module docstring)
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


@dataclass
class Verdict:
    """What the policy keeps of one step's drafts, per row (``B`` rows, ``F = 1 + n`` fed).

    ``keep`` ``[B, F]`` long: 1 on the fed columns that stay in the cache, 0 on the rejected
    ones (they become holes). ``accepted``: drafts kept per row. ``tokens``: per row the kept
    drafts then the policy's own token; ``logprobs`` their adjusted logprobs under the policy;
    ``states`` the policy's pre-norm states at the kept fed columns (``[a + 1, H]``), the
    states that predicted ``tokens``.
    """

    keep: torch.Tensor
    accepted: list[int]
    tokens: list[list[int]]
    logprobs: list[list[float]]
    states: list[torch.Tensor]


def propose(drafter, ctx, plan: StepPlan, k: int) -> "ChainDraft | TreeDraft":
    """The proposal of ``drafter`` (the one that serves ``plan``: :func:`serving_drafter`) for
    one step of ``plan``, ``k`` deep (``k <= plan.k``, clipped to the context): what the
    plan's arm proposes when a plugin arm made it (``StepPlan.arm``, ``rollout.arm.Arm``:
    checked to hold every row and 1 to ``k`` drafts each), else :func:`propose_shape`."""
    if plan.arm is None:
        return propose_shape(drafter, ctx, plan, k)
    draft = plan.arm.propose(drafter, ctx, plan, k)
    rows = len(ctx.request_ids)
    if (not isinstance(draft, (ChainDraft, TreeDraft)) or draft.tokens.shape[0] != rows
            or draft.size < 1 or (draft.k if isinstance(draft, TreeDraft) else draft.size) > k):
        raise ValueError(f"arm {plan.arm!r} proposed {draft!r:.120}; accepted a ChainDraft or "
                         f"TreeDraft of the step's {rows} rows with 1 to {k} drafts each "
                         "(rollout.arm.Arm.propose)")
    return draft


def propose_shape(drafter, ctx, plan: StepPlan, k: int) -> "ChainDraft | TreeDraft":
    """The proposal of the plan's own shape: a chain of ``k`` drafts, or a tree ``k`` deep
    pruned to the plan's ``verify_budget``."""
    if not plan.tree:
        return ChainDraft(*drafter.draft(ctx, k))
    check_tree_drafter(drafter, plan)
    return TreeDraft(drafter.draft_tree(ctx, k, plan.branch).select(plan.verify_budget), k)


@dataclass
class ChainDraft:
    """``tokens`` ``[B, k]``: each row's drafts, each after the previous; ``logq``
    ``[B, k, V]``: the drafter's adjusted distribution at each (speculative mode only)."""

    tokens: torch.Tensor
    logq: torch.Tensor | None
    visible = None  # drafts attend causally: no tree mask

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def positions(self, next_pos: torch.Tensor) -> torch.Tensor:
        """``[B, 1 + k]``: the fed tokens' positions, one depth after another."""
        return next_pos[:, None] + torch.arange(self.size + 1, device=next_pos.device)

    def accept(self, decoder, fed, logits, hidden) -> Verdict:
        """The accepted prefix of each row's chain and the policy's token after it.
        ``logits`` ``[B, k+1, V]`` and ``hidden`` ``[B, k+1, H]`` at the fed tokens."""
        k, b = self.size, decoder.batch
        logp = adjusted_logprobs(logits, decoder.params)                 # [B, k+1, V]
        if decoder.mode == "speculative":
            accepted, last = verify.speculative_accept(
                self.tokens, logp, self.logq, decoder.uniform_grid(b, k, Stream.ACCEPT),
                decoder.uniform_grid(b, k + 1))
        else:
            target = (logp.argmax(-1) if decoder.mode == "greedy"
                      else choose_tokens(logp, decoder.params, decoder.uniform_grid(b, k + 1)))
            accepted = verify.accept_by_target(self.tokens, target)
            last = target.gather(1, accepted[:, None]).squeeze(1)
        emitted = torch.cat([self.tokens, last[:, None]], dim=1)
        emitted.scatter_(1, accepted[:, None], last[:, None])
        emitted_lp = logp.gather(-1, emitted[..., None]).squeeze(-1)
        # the fed last_token and the accepted drafts stay; rejected drafts become holes
        keep = (torch.arange(k + 1, device=fed.device)[None, :] <= accepted[:, None]).long()
        acc = accepted.tolist()
        return Verdict(keep, acc, [e[:a + 1] for e, a in zip(emitted.tolist(), acc)],
                       [e[:a + 1] for e, a in zip(emitted_lp.tolist(), acc)],
                       [hidden[row, :a + 1] for row, a in enumerate(acc)])


@dataclass
class TreeDraft:
    """A draft tree per row (``rollout.tree``), ``k`` the depth it was grown to; ``visible``
    and ``depth`` (``[B, 1 + n]``, root 0) say how it is fed."""

    tree: DraftTree
    k: int
    visible: torch.Tensor = field(init=False)
    depth: torch.Tensor = field(init=False)

    def __post_init__(self):
        self.visible = self.tree.ancestors()
        self.depth = self.visible.sum(-1) - 1

    @property
    def tokens(self) -> torch.Tensor:
        return self.tree.tokens

    @property
    def size(self) -> int:
        return self.tree.size

    def positions(self, next_pos: torch.Tensor) -> torch.Tensor:
        """``[B, 1 + n]``: each fed node at ``next_pos + depth`` (siblings share one)."""
        return next_pos[:, None] + self.depth

    def accept(self, decoder, fed, logits, hidden) -> Verdict:
        """Each row's accepted root-to-leaf path and the policy's token after it."""
        logp = adjusted_logprobs(logits, decoder.params)                 # [B, n+1, V]
        paths, last = self._walk(decoder, logp)
        kept = [[0] + path for path in paths]                            # fed indices
        keep = torch.zeros_like(fed)
        tokens, logprobs, states = [], [], []
        for row, (cols, tok) in enumerate(zip(kept, last)):
            keep[row, cols] = 1
            emitted = fed[row, cols[1:]].tolist() + [tok]
            idx = torch.tensor(cols, device=fed.device)
            tokens.append(emitted)
            logprobs.append(logp[row, idx, torch.tensor(emitted, device=fed.device)].tolist())
            states.append(hidden[row, idx])
        return Verdict(keep, [len(p) for p in paths], tokens, logprobs, states)

    def _walk(self, decoder, logp: torch.Tensor):
        """Each row's accepted path (fed indices) and the token the policy adds after it."""
        tree = self.tree
        if decoder.mode == "greedy":
            return verify.accept_tree(tree.tokens, tree.parents, logp.argmax(-1))
        token_u = self._token_uniforms(decoder)
        if decoder.mode == "coupled":
            return verify.accept_tree(tree.tokens, tree.parents,
                                      choose_tokens(logp, decoder.params, token_u))
        return verify.speculative_accept_tree(tree.tokens, tree.parents, logp,
                                              self._accept_uniforms(decoder), token_u)

    def _token_uniforms(self, decoder) -> np.ndarray:
        """``[B, n+1]``: ``Stream.TOKEN`` at each fed node's response position
        ``len(tokens) + depth``, the uniform plain decoding draws that position with."""
        grid = decoder.uniform_grid(decoder.batch, self.k + 1)           # [B, k+1]
        return np.take_along_axis(grid, self.depth.cpu().numpy(), axis=1)

    def _accept_uniforms(self, decoder) -> np.ndarray:
        """``[B, n]``: each node's accept-test uniform, ``Stream.ACCEPT`` at the position it
        would emit (``len(tokens) + depth - 1``) offset by its sibling rank (module docstring)."""
        ranks = self.tree.sibling_ranks().cpu().numpy()
        grid = np.stack([decoder.uniform_grid(decoder.batch, self.k, Stream.ACCEPT,
                                              i * _RANK_STRIDE)
                         for i in range(int(ranks.max(initial=0)) + 1)], axis=1)  # [B, R, k]
        rows = np.arange(grid.shape[0])[:, None]
        return grid[rows, ranks, self.depth[:, 1:].cpu().numpy() - 1]
