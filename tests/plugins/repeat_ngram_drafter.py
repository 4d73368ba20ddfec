"""A drafter plugin in one file: the worked example of docs/extending.md ("A drafter").

Load it with ``plugins=["tests/plugins/repeat_ngram_drafter.py"]`` (a notebook parameter) or
``python -m workbench --plugins tests/plugins/repeat_ngram_drafter.py ...``; then
``"repeat_ngram"`` is a drafter name like ``"ngram"``: ``drafter="repeat_ngram"``,
``other_drafters=["repeat_ngram"]``, ``resolve_drafter("repeat_ngram", policy, tokenizer)``.

It is model-free (no ``module``, so nothing to train or checkpoint) and keeps no per-row state
(each round reads the rows' committed sequences afresh), so it needs only ``draft``: every
other hook keeps the protocol's default (``workbench.speculative.drafters.Drafter``).
"""
import torch

from workbench.speculative.drafters import DRAFTERS, Drafter


@DRAFTERS.register("repeat_ngram")
class RepeatNGram(Drafter):
    """Repeat what followed the row's last ``n`` tokens the last time they occurred earlier in
    its committed sequence (prompt and response so far); with no earlier occurrence, repeat
    the row's last token. A continuation shorter than ``k`` is padded with its last token."""

    def __init__(self, n: int = 2):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        self.n = n

    def continuation(self, seq: list[int], k: int) -> list[int]:
        """The ``k`` tokens proposed after ``seq``."""
        n, tail = self.n, seq[-self.n:]
        for start in range(len(seq) - n - 1, -1, -1):  # the latest earlier occurrence first
            if seq[start:start + n] == tail:
                cont = seq[start + n:start + n + k]
                return cont + [cont[-1]] * (k - len(cont))
        return [seq[-1]] * k

    def draft(self, ctx, k: int):
        """``(tokens [B, k], logq [B, k, V] or None)``: one-hot ``logq`` (a deterministic
        proposal), built only when speculative sampling reads it (``Drafter.proposal``)."""
        tokens = torch.tensor([self.continuation(list(s), k) for s in ctx.sequences],
                              dtype=torch.long, device=ctx.device)
        return self.proposal(ctx, tokens)
