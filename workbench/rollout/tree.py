"""Draft trees: what a tree-drafting step proposes per row, and how it is pruned and masked.

A tree hangs below each row's root, its one emitted-but-unfed token (``batch.last_token``).
Nodes are numbered ``0..n-1`` level by level, so a node's parent always comes before it;
``parents[r, j] = -1`` means the root. Drafters grow trees EAGLE-2 style (:func:`grow_level`):
every node of the frontier proposes its ``branch`` likeliest tokens and the ``branch`` best
candidates of the level by cumulative drafter log-probability become the next frontier. The
policy then verifies the best ``verify_budget`` nodes (:meth:`DraftTree.select`).

Cumulative log-probabilities never increase from parent to child (a logprob is <= 0 and adding
it cannot round upward), so the top nodes by score, ties going to the earlier node, are closed
under ancestors: every kept node's path to the root is kept.

Masks and positions count the root as node 0: :meth:`DraftTree.ancestors` is ``[B, n+1, n+1]``
(ancestor-or-self), :meth:`DraftTree.depths` is 0 for the root, so a node's position is
``next_pos + depth``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import check_int
from .verify import sibling_ranks

__all__ = ["DraftTree", "grow_tree"]


@dataclass
class DraftTree:
    """Each row's draft tree (rows share the node count ``n``; every row is padded to it).

    ``tokens``/``parents`` ``[B, n]`` long, ``scores`` ``[B, n]`` the cumulative drafter
    log-probability of each node's root-to-node path (in coupled mode with each coupled draw
    counted as certain: ``SamplingMode.rank``).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def ancestors(self) -> torch.Tensor:
        """``[B, n+1, n+1]`` bool, root at index 0: ``[r, i, j]`` when node ``j`` is node
        ``i`` or one of its ancestors, i.e. which fed tokens node ``i`` attends to."""
        b, n = self.tokens.shape
        anc = torch.eye(n + 1, dtype=torch.bool, device=self.tokens.device).repeat(b, 1, 1)
        rows = torch.arange(b, device=self.tokens.device)
        for j in range(n):  # parents come first: their rows are complete
            anc[:, j + 1] |= anc[rows, self.parents[:, j] + 1]
        return anc

    def depths(self) -> torch.Tensor:
        """``[B, n+1]`` long: 0 for the root, a node's distance from it otherwise."""
        return self.ancestors().sum(-1) - 1

    def sibling_ranks(self) -> torch.Tensor:
        """``[B, n]`` long: how many siblings come before each node (node order), the order
        in which speculative verification tries a node's children."""
        return sibling_ranks(self.parents)

    def select(self, budget: int | None) -> "DraftTree":
        """The best ``budget`` nodes of each row by score (all when ``None``), in their
        original order, parents renumbered. Ancestor-closed (see the module docstring)."""
        n = self.size
        if budget is None or budget >= n:
            return self
        order = torch.sort(-self.scores, dim=1, stable=True).indices[:, :budget]
        keep = order.sort(dim=1).values                                  # [B, budget]
        new_index = torch.full_like(self.parents, -1)
        new_index.scatter_(1, keep, torch.arange(budget, device=keep.device).expand_as(keep))
        old_parents = self.parents.gather(1, keep)
        parents = torch.where(old_parents < 0, old_parents,
                              new_index.gather(1, old_parents.clamp(min=0)))
        return DraftTree(self.tokens.gather(1, keep), parents, self.scores.gather(1, keep))

    @staticmethod
    def from_levels(levels: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> "DraftTree":
        """One tree from :func:`grow_level`'s outputs, depth 1 first: each level's
        ``(tokens, parent slot in the previous level, scores)``, all ``[B, w]``."""
        tokens, parents, scores = [], [], []
        start, prev_start = 0, None                  # first node index of this / last level
        for tok, slot, score in levels:
            tokens.append(tok)
            scores.append(score)
            parents.append(torch.full_like(slot, -1) if prev_start is None else slot + prev_start)
            prev_start, start = start, start + tok.shape[1]
        return DraftTree(torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(scores, 1))


def grow_level(frontier_scores: torch.Tensor, logprobs: torch.Tensor, branch: int):
    """The next level of a tree: ``(tokens, parent slot, scores)``, each ``[B, branch]``.

    ``frontier_scores`` ``[B, f]`` are the frontier's cumulative scores (zeros ``[B, 1]`` for
    the root), ``logprobs`` ``[B, f, V]`` the drafter's distribution after each frontier node.
    Each node proposes its top ``branch`` tokens; the ``branch`` best candidates overall by
    cumulative score are kept, best first.
    """
    b, f, _ = logprobs.shape
    top_lp, top_tok = logprobs.topk(branch, dim=-1)                    # [B, f, branch]
    cand = (frontier_scores[:, :, None] + top_lp).reshape(b, f * branch)
    score, idx = cand.topk(min(branch, f * branch), dim=-1)
    return top_tok.reshape(b, f * branch).gather(1, idx), idx // branch, score


def grow_tree(logprobs_of, root_logits: torch.Tensor, k: int, branch: int, expand) -> DraftTree:
    """A tree of depth ``k`` grown level by level (:func:`grow_level`).

    ``root_logits`` ``[B, V]`` are the drafter's logits after the root;
    ``logprobs_of(logits, depth)`` ranks the candidates of a level (``DraftInput.tree_logprobs``);
    ``expand(levels)`` feeds the newest level (``levels[-1]``, see
    :meth:`DraftTree.from_levels`) to the drafter and returns its logits ``[B, w, V]`` after
    each of those nodes. The last level is never fed.
    """
    k, branch = check_int("a tree's k", k, 1), check_int("a tree's branch", branch, 1)
    levels = []
    scores = torch.zeros_like(root_logits[:, :1])
    logits = root_logits[:, None]
    for depth in range(k):
        levels.append(grow_level(scores, logprobs_of(logits, depth), branch))
        scores = levels[-1][2]
        if depth < k - 1:
            logits = expand(levels)
    return DraftTree.from_levels(levels)
