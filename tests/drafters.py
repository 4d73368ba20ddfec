"""Drafters used by the tests only."""
import torch

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
