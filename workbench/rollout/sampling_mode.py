"""How a rollout picks tokens, as one value: greedy, coupled or speculative sampling.

Every place that picks or tests a token asks a :class:`SamplingMode`: the policy's own
token at a plain step, a drafter's drafts (``DraftInput.choose``, ``DraftInput.tree_logprobs``)
and verification (``rollout.verify``). The decoder builds it once per step, keyed to the
step's live rows, and hands the same value to the drafter and to verification, so that the
two agree on every uniform without either reading the decoder.

Glossary:

kind         ``"greedy"`` (temperature 0: argmax everywhere), ``"coupled"`` (every token
             drawn by inverse CDF at the coupled uniform of its ``(seed, uid, position)``:
             output token-identical to plain coupled decoding) or ``"speculative"`` (the
             rejection rule of Leviathan et al.: the policy's distribution, other draws).
key          ``uids`` and ``lengths`` ``[B]``: each live row's uid and response length, so
             that the token a row emits next sits at response position ``lengths[r]`` and a
             fed node of depth ``d`` (0 = the root, the row's unfed token) predicts position
             ``lengths[r] + d``. ``None`` when greedy: no draw reads it.
streams      ``Stream.TOKEN`` at position ``t``: the uniform the policy's token at ``t`` is
             drawn with (plain, coupled and speculative alike; a coupled draft's too).
             ``Stream.ACCEPT``: a speculative accept test. ``Stream.DRAFT``: a speculative
             drafter's own draw, independent of the policy's.

Speculative tree draws: the accept test of the child with sibling rank ``i`` that would emit
position ``t`` uses ``Stream.ACCEPT`` at ``t + i * 2**32`` (rank 0 is the chain's accept
uniform). Responses are far shorter than ``2**32`` tokens, so every (position, rank) pair has
its own independent uniform, and a walk visits one node per depth, so no uniform is used twice.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_choice
from .sampling import (SamplingParams, Stream, adjusted_logprobs, choose_tokens,
                       coupled_uniforms, draw)

__all__ = ["SamplingMode", "MODE_KINDS"]

MODE_KINDS = ("greedy", "coupled", "speculative")
RANK_STRIDE = 2**32  # accept-uniform position offset per sibling rank (module docstring)


@dataclass(frozen=True)
class SamplingMode:
    """One rollout's way of picking tokens (module glossary), keyed to one step's rows.

    ``kind`` and ``params`` (temperature, top_p, seed) are the rollout's; ``uids`` and
    ``lengths`` (``[B]`` int64, ``None`` when greedy) the step's rows (:meth:`at`).
    """

    kind: str
    params: SamplingParams
    uids: np.ndarray | None = None
    lengths: np.ndarray | None = None

    @staticmethod
    def of(params: SamplingParams, spec_mode: str = "coupled") -> "SamplingMode":
        """A rollout's mode, no rows yet: greedy at temperature 0, else ``spec_mode``
        (``RolloutConfig.spec_mode``: ``"coupled"`` or ``"speculative"``)."""
        kind = "greedy" if params.greedy else spec_mode
        check_choice("spec_mode", kind, MODE_KINDS)
        return SamplingMode(kind, params)

    def at(self, admitted, request_ids) -> "SamplingMode":
        """This mode keyed to the rows ``admitted[i] for i in request_ids`` (``RequestOutput``s,
        batch order: their ``uid`` and ``len(tokens)`` now). Greedy reads no uniform: itself,
        at no cost."""
        if self.kind == "greedy":
            return self
        n = len(request_ids)
        return SamplingMode(self.kind, self.params,
                            np.fromiter((admitted[i].uid for i in request_ids), np.int64, n),
                            np.fromiter((len(admitted[i].tokens) for i in request_ids),
                                        np.int64, n))

    @property
    def speculative(self) -> bool:
        """Whether verification is the rejection rule (it then reads the drafter's ``logq``);
        otherwise the policy's token at every fed node is fixed (:meth:`targets`)."""
        return self.kind == "speculative"

    def logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., V]``: the adjusted log-probabilities tokens are drawn from."""
        return adjusted_logprobs(logits, self.params)

    def uniforms(self, stream: Stream, offsets) -> np.ndarray:
        """``[B, W]`` float64: ``stream``'s uniform of each row at response position
        ``lengths[r] + offsets[r, j]`` (``offsets`` ``[B, W]`` or ``[W]`` int, an array or a
        tensor)."""
        assert self.uids is not None, f"a {self.kind} mode keyed to no rows (SamplingMode.at)"
        pos = self.lengths[:, None] + _ints(offsets)
        return coupled_uniforms(self.params.seed, np.broadcast_to(self.uids[:, None], pos.shape),
                                pos, stream)

    def token_uniforms(self, depth) -> np.ndarray:
        """``[B, F]``: ``Stream.TOKEN`` at each fed node's response position
        ``lengths + depth`` (``depth`` ``[B, F]`` or ``[F]``), the uniform plain decoding
        draws that position with."""
        return self.uniforms(Stream.TOKEN, depth)

    def targets(self, logp: torch.Tensor, depth) -> torch.Tensor:
        """``[B, F]``: the token the policy emits at each fed node (greedy and coupled only),
        the one plain decoding emits there: the argmax, or the coupled draw at
        ``Stream.TOKEN``. ``logp`` ``[B, F, V]``; ``depth`` ``[B, F]`` or ``[F]`` each node's
        depth (0 = the root)."""
        assert not self.speculative, "speculative sampling fixes no target (rollout.verify)"
        u = None if self.kind == "greedy" else self.token_uniforms(depth)
        return choose_tokens(logp, self.params, u)

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's next token ``[B]`` and its adjusted logprob ``[B]`` from the policy's
        logits ``[B, V]`` after its last fed token: what a plain step and a prefill emit."""
        logp = self.logprobs(logits)
        u = None if self.kind == "greedy" else self.token_uniforms((0,))[:, 0]
        tok = choose_tokens(logp, self.params, u)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    def choose(self, logits: torch.Tensor, depth: int):
        """A drafter's tokens ``[B]`` at ``depth`` (0 = the first draft) from its logits
        ``[B, V]``, and its adjusted logprobs ``[B, V]`` where verification reads them
        (:meth:`pick` at :meth:`draft_uniforms`)."""
        u = self.draft_uniforms((depth,))
        return self.pick(logits, None if u is None else torch.from_numpy(u[:, 0]))

    def draft_uniforms(self, depths) -> np.ndarray | None:
        """``[B, n]`` float64: the uniform a drafter draws its draft at each of ``depths``
        (``[n]``, 0 = the first draft) with: ``Stream.TOKEN`` when coupled,
        ``Stream.DRAFT`` when speculative; ``None`` when greedy (no draw)."""
        if self.kind == "greedy":
            return None
        return self.uniforms(Stream.DRAFT if self.speculative else Stream.TOKEN, depths)

    def pick(self, logits: torch.Tensor, u: torch.Tensor | None):
        """Draft tokens ``[...]`` from a drafter's logits ``[..., V]`` at uniforms ``u [...]``
        (:meth:`draft_uniforms`' columns; ``None`` when greedy), and their adjusted logprobs
        ``[..., V]`` or ``None``. Torch only and reading no rows, so that a compiled drafting
        graph picks as the eager drafter does (``rollout.step_graph.make_draft_chain``).

        Greedy: argmax. Coupled: the uniform the policy will use at that position, so a
        drafter close to the policy lands on the same token. Speculative: an independent
        draw (``Stream.DRAFT``) from the drafter's adjusted distribution, as Leviathan et al.
        require. The logprobs are ``None`` except in speculative mode, the only one that
        reads them.
        """
        if self.kind == "greedy":
            return logits.argmax(-1), None
        logq = self.logprobs(logits)
        return draw(logq, u), logq if self.speculative else None

    def rank(self, logits: torch.Tensor, depth: int) -> torch.Tensor:
        """``[B, f, V]``: what a tree's candidates at ``depth`` (0 = the first level) are
        ranked by (``rollout.tree``) from the drafter's logits ``[B, f, V]``: its adjusted
        log-probabilities. Coupled mode ranks each node's coupled draw first (logprob set to
        0): the policy emits it wherever the two distributions agree at that uniform, so the
        tree holds the chain."""
        logq = self.logprobs(logits)
        if self.kind != "coupled":
            return logq
        u = self.token_uniforms((depth,))                                # [B, 1]
        draw = choose_tokens(logq, self.params, np.repeat(u, logq.shape[1], axis=1))
        return logq.scatter(-1, draw[..., None], 0.0)

    def accept_uniforms(self, depth, rank=0) -> np.ndarray:
        """``[B, n]``: each draft's accept-test uniform, ``Stream.ACCEPT`` at the position it
        would emit (``lengths + depth - 1``) offset by its sibling rank (module docstring).
        ``depth`` and ``rank`` ``[B, n]`` or ``[n]``; a chain's ranks are all 0."""
        return self.uniforms(Stream.ACCEPT, _ints(depth) - 1 + _ints(rank) * RANK_STRIDE)


def _ints(x) -> np.ndarray:
    """``x`` (a sequence, an array or a tensor on any device) as an int64 array."""
    if isinstance(x, torch.Tensor):
        x = x.cpu().numpy()
    return np.asarray(x, dtype=np.int64)
