"""A speculative step's drafts: what the drafter reads, a chain or a tree per row, how they are
fed to the policy, and which verification rule they go to.

``BatchDecoder.spec_step`` runs one recipe for both shapes (clip, draft, feed, verify, rewrite
the cache, count); what differs between a chain and a tree lives here. Data flows one way:
the decoder hands the drafter a frozen :class:`DraftInput`, the drafter (or a plugin arm)
returns a :class:`ChainDraft` or :class:`TreeDraft`, and ``draft.verify`` hands tensors and
the step's :class:`~workbench.rollout.sampling_mode.SamplingMode` to ``rollout.verify``, which
returns the policy's :class:`~workbench.rollout.verify.Verdict`. Nothing here reads the decoder.

Glossary:

fed          ``[last_token] + drafts`` per row, ``[B, 1 + n]``: fed index 0 is the *root*
             (each row's emitted, unfed token), fed index ``j + 1`` is draft node ``j``.
depth        a fed node's distance from the root: its position is ``next_pos + depth``. A
             chain's drafts have depths ``1..k``; a tree's nodes share depths across branches.
visible      ``[B, 1 + n, 1 + n]`` ancestor-or-self mask of a tree (``rollout.tree``): each node
             attends to the committed cache, its ancestors and itself. ``None`` for a chain,
             whose drafts see each other causally.
verdict      what the policy keeps (``rollout.verify``, lossless in every mode): per row the
             fed columns that stay in the cache (the root and an accepted path), the tokens it
             emits (the accepted drafts, then one token of the policy's own) and their
             logprobs and policy states.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import torch

from .sampling_mode import SamplingMode
from .tree import DraftTree
from .verify import Verdict, verify_chain, verify_tree

__all__ = ["DraftInput", "DraftCompile", "ChainDraft", "TreeDraft"]


@dataclass(frozen=True)
class DraftCompile:
    """A drafter's compiled step at this speculative step (``RolloutConfig.compile=True``: an
    EAGLE head's, ``speculative.eagle.CompiledDraft``). ``length``: the columns its KV cache
    is preallocated to (the policy's, so that its buffers, and so its graphs, keep their
    shapes); ``compile_row(work, rows)``: the decoder's, which runs ``work`` (a graph's
    compile, ``rollout.compiled.prepared``'s) as a ``compile`` row of its own."""

    length: int
    compile_row: Callable


@dataclass(frozen=True)
class DraftInput:
    """What a drafter reads at one speculative step (``ctx`` in ``draft(ctx, k)``), built by
    the decoder once per step, before the call; the drafter reads it and returns its drafts.

    Fields:
        admitted: every request admitted to the worker's rollout so far (``RequestOutput``),
            live or finished, in admission order: what a drafter that drafts from other rows
            reads (``speculative.sibling``); ``request_ids``: each live row's index in it. Both
            are the decoder's own, shared, not copied: read, never write; valid during the call.
        hidden: per row ``[n_r, H]`` the policy's pre-norm states the drafter has not
            consumed, one per committed token, the state that predicted it (``h_t`` for
            token ``x_{t+1}``); ``None`` for a row with none. The decoder hands them over (and
            forgets them) only to a drafter with ``needs_hidden``; ``None`` for any other,
            whose states stay kept for the set member that needs them.
        mode: the step's :class:`~workbench.rollout.sampling_mode.SamplingMode`, keyed to
            the rows: what :meth:`choose`, :meth:`tree_logprobs` and :attr:`needs_logq` ask.
        device: where to draft.
        wait: ``wait(seconds)`` lets time pass on the worker's clock without work
            (``StepRecorder.wait``).
        compile: how a drafter runs its compiled step (:class:`DraftCompile`); ``None``: it
            drafts eagerly (``RolloutConfig.compile`` not ``True``).

    Read on first use (then kept): ``rows``, the live rows' requests in batch order;
    ``sequences[r]``, prompt + response of row ``r`` so far; ``response_lengths``; ``uids``.
    """

    admitted: list
    request_ids: list[int]
    hidden: list[torch.Tensor | None] | None
    mode: SamplingMode
    device: torch.device
    wait: Callable[[float], None]
    compile: DraftCompile | None = None

    @cached_property
    def rows(self) -> list:
        return [self.admitted[i] for i in self.request_ids]

    @cached_property
    def sequences(self) -> list[list[int]]:
        return [r.prompt_ids + r.tokens for r in self.rows]

    @cached_property
    def response_lengths(self) -> list[int]:
        return [len(r.tokens) for r in self.rows]

    @cached_property
    def uids(self) -> list[int]:
        return [r.uid for r in self.rows]

    @property
    def needs_logq(self) -> bool:
        """Whether verification reads the drafter's distribution (speculative sampling)."""
        return self.mode.speculative

    def choose(self, logits: torch.Tensor, depth: int):
        """Draft tokens ``[B]`` at ``depth`` (0 = the first draft) from the drafter's logits
        ``[B, V]`` the way verification needs, and their adjusted logprobs ``[B, V]`` or
        ``None`` (``SamplingMode.choose``)."""
        return self.mode.choose(logits, depth)

    def tree_logprobs(self, logits: torch.Tensor, depth: int) -> torch.Tensor:
        """``[B, f, V]``: what a tree's candidates at ``depth`` are ranked by
        (``SamplingMode.rank``)."""
        return self.mode.rank(logits, depth)


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

    def verify(self, logits: torch.Tensor, hidden: torch.Tensor,
               mode: SamplingMode) -> Verdict:
        """The policy's verdict (``rollout.verify.verify_chain``) from its ``logits``
        ``[B, k+1, V]`` and ``hidden`` ``[B, k+1, H]`` at the fed tokens."""
        return verify_chain(self.tokens, self.logq, logits, hidden, mode)


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

    def verify(self, logits: torch.Tensor, hidden: torch.Tensor,
               mode: SamplingMode) -> Verdict:
        """The policy's verdict (``rollout.verify.verify_tree``) from its ``logits``
        ``[B, n+1, V]`` and ``hidden`` ``[B, n+1, H]`` at the fed nodes."""
        return verify_tree(self.tree.tokens, self.tree.parents, self.depth, logits, hidden,
                           mode)
