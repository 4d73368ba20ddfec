"""Drafters used by the tests only."""
import torch

from workbench.rollout.tree import DraftTree
from workbench.speculative.drafters import Drafter


class ScriptedDrafter(Drafter):
    """For tests: proposes a known continuation of each request with one wrong token.

    ``continuations[uid]`` is the policy's own greedy response; ``wrong_at[uid]`` is the draft
    depth whose token is replaced by another one in every round, so that row accepts exactly
    ``wrong_at[uid]`` drafts per verify step (all ``k`` if ``wrong_at >= k``).
    """

    name = "scripted"

    def __init__(self, continuations: dict[int, list[int]], wrong_at: dict[int, int]):
        self.continuations, self.wrong_at = continuations, wrong_at

    def draft(self, ctx, k):
        out = []
        for uid, n_resp in zip(ctx.uids, ctx.response_lengths):
            prop = (self.continuations[uid][n_resp:n_resp + k] + [0] * k)[:k]
            j = self.wrong_at[uid]
            if j < k:
                prop[j] = (prop[j] + 1) % self.vocab_size
            out.append(prop)
        tokens = torch.tensor(out, dtype=torch.long, device=ctx.device)
        return self.proposal(ctx, tokens)


class ScriptedTreeDrafter(ScriptedDrafter):
    """For tests: a tree whose level ``d`` holds ``branch`` siblings below the previous level's
    right node; the right token (the policy's own, from ``continuations``) sits at sibling
    ``d % branch``, except at depth ``wrong_at[uid]``, where every sibling is wrong. Wrong
    nodes score 10 below their right sibling, so any verify budget >= k (k <= 10) keeps the
    right path."""

    name = "scripted_tree"
    supports_trees = True

    def draft_tree(self, ctx, k, branch):
        levels, right_slot = [], torch.zeros(len(ctx.uids), dtype=torch.long)
        scores = torch.zeros(len(ctx.uids), 1, dtype=torch.float64)
        for d in range(k):
            toks = []
            for uid, n_resp in zip(ctx.uids, ctx.response_lengths):
                right = (self.continuations[uid][n_resp:] + [0] * k)[d]
                wrong = [(right + 1 + j) % self.vocab_size for j in range(branch)]
                if d != self.wrong_at[uid]:
                    wrong[d % branch] = right
                toks.append(wrong)
            parent = scores.gather(1, right_slot[:, None])
            score = parent - 1 - torch.tensor([[10.0 * (j != d % branch) + 0.1 * j
                                                 for j in range(branch)]])
            levels.append((torch.tensor(toks), right_slot[:, None].expand(-1, branch), score))
            scores, right_slot = score, torch.full_like(right_slot, d % branch)
        return DraftTree.from_levels(levels)
