"""A drafter plugin that learns as it drafts, with a setting: its state is a torch module, so
an RL run's checkpoints hold it (docs/extending.md, "A drafter with state").

Load it with ``plugins=["tests/plugins/bigram_counts_drafter.py"]``; an RL run then takes
``drafter="bigram_counts"`` or ``drafter="bigram_counts:min_count=2"`` (``TLTConfig.drafter``)
in a variant without the adaptive drafter (``static_sd``).

At every draft it counts, for each row, the pair of its last two committed tokens, and
proposes the chain of most counted successors from the row's last token; a successor
counted fewer than ``min_count`` times gives way to repeating the token. The counts live in
``module`` (a buffer of an ``nn.Module``), never reset: what the drafter proposes at a step
depends on every step before it, which a resumed run must restore to draft as a straight
one does.
"""
import torch
from torch import nn

from workbench.speculative.drafters import DRAFTERS, Drafter


class BigramCounts(nn.Module):
    """``counts[a, b]``: how often ``b`` was seen right after ``a``."""

    def __init__(self, vocab: int):
        super().__init__()
        self.register_buffer("counts", torch.zeros(vocab, vocab))


@DRAFTERS.register("bigram_counts")
class BigramCounter(Drafter):
    """Chains of the most counted successors (module docstring)."""

    def __init__(self, vocab: int, min_count: int = 1):
        if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
        self.min_count = min_count
        self.module = BigramCounts(vocab)

    @classmethod
    def build(cls, policy, tokenizer, **settings):
        """On the policy's vocabulary; ``settings`` (``min_count``) from the drafter spec."""
        return cls(int(policy.get_input_embeddings().weight.shape[0]), **settings)

    def continuation(self, last: int, k: int) -> list[int]:
        counts, out = self.module.counts, []
        for _ in range(k):
            following = int(counts[last].argmax())
            last = following if counts[last, following] >= self.min_count else last
            out.append(last)
        return out

    def draft(self, ctx, k: int):
        rows = [list(s) for s in ctx.sequences]
        with torch.no_grad():
            for seq in rows:
                if len(seq) >= 2:
                    self.module.counts[seq[-2], seq[-1]] += 1
        tokens = torch.tensor([self.continuation(seq[-1], k) for seq in rows],
                              dtype=torch.long, device=ctx.device)
        return self.proposal(ctx, tokens)
