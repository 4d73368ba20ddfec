"""A speculative step with a draft tree: draft, verify every kept node in one policy forward,
accept one root-to-leaf path per row.

The policy sees ``[last_token] + nodes`` per row at positions ``next_pos + depth`` under a tree
mask (each node attends to the committed cache, its ancestors and itself), so every node's
logits equal a plain forward of its own path. The accepted path's columns stay visible (their
positions increase left to right, as a row's columns must); every other fed column becomes a
hole, so each row's visible cache is again a fresh recompute of its accepted prefix.

Lossless in every mode. Greedy and coupled: a node's target is the policy's argmax, or its
coupled draw at the node's response position, exactly what plain decoding would emit there,
and only drafts equal to it are kept. Speculative: the drafter picks the nodes
deterministically (its top candidates), so each node's children are tried one by one with the
one-hot rejection test against the policy's residual (``verify.speculative_accept_tree``),
which samples the policy's distribution exactly at every node.

Speculative draws: the token at response position ``t = len(tokens) + depth`` is drawn at the
fed node of that depth from ``Stream.TOKEN`` at ``t``, as in plain decoding; the test of the
child with sibling rank ``i`` that would emit position ``t`` uses ``Stream.ACCEPT`` at
position ``t + i * 2**32`` (rank 0 is the chain's accept uniform). Responses are far shorter
than ``2**32`` tokens, so every (position, rank) pair has its own independent uniform, and the
walk visits one node per depth, so no uniform is used twice.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from . import verify
from .sampling import Stream, adjusted_logprobs, choose_tokens
from .schedule import StepPlan
from .tree import DraftTree

__all__ = ["tree_step", "check_tree_plan"]

_RANK_STRIDE = 2**32  # accept-uniform position offset per sibling rank (module docstring)


def check_tree_plan(decoder, plan: StepPlan) -> None:
    """Refuse a tree plan this decoder's drafter cannot draft, before anything is drafted
    (every verification mode verifies trees losslessly)."""
    drafter = decoder.drafter
    if not getattr(drafter, "supports_trees", False):
        raise ValueError(f"drafter {getattr(drafter, 'name', '?')!r} "
                         f"({type(drafter).__name__}) drafts chains only, but the plan asks for "
                         f"a tree (branch={plan.branch}, verify_budget={plan.verify_budget}); "
                         "trees need a drafter with draft_tree(ctx, k, branch): EagleDrafter "
                         "('eagle') or LMDrafter ('small_lm')")


def tree_step(decoder, plan: StepPlan, ctx):
    """Draft a tree per row (depth ``plan.k``, ``plan.branch`` per node), keep the best
    ``plan.verify_budget`` nodes, verify and accept. ``ctx`` is the decoder's DraftContext.
    Returns ``(tokens emitted, nodes verified, accepted, draft s, forward s)``."""
    check_tree_plan(decoder, plan)
    b = decoder.batch
    k = min(plan.k, int((decoder.forward.context - 2 - b.next_pos).min()))
    if k < 1:
        n, fwd_s = decoder.plain_step()
        return n, 0, 0, 0.0, fwd_s
    tree, draft_s = _timed_draft(decoder, ctx, k, plan.branch)
    tree = tree.select(plan.verify_budget)
    visible = tree.ancestors()
    depth = visible.sum(-1) - 1                                          # [B, n+1], root 0
    width = b.width
    pos = b.append_columns(tree.size + 1, positions=b.next_pos[:, None] + depth)
    fed = torch.cat([b.last_token[:, None], tree.tokens], dim=1)
    (logits, hidden), fwd_s = _timed(decoder.forward, fed, pos, b.mask, b.col_pos, b.cache,
                                     logits_from=0, tree=visible)
    logp = adjusted_logprobs(logits, decoder.params)                     # [B, n+1, V]
    paths, last = _accept(decoder, tree, logp, depth, k)
    kept = [[0] + path for path in paths]                                # fed indices
    keep = torch.zeros_like(fed)
    for row, cols in enumerate(kept):
        keep[row, cols] = 1
    b.mask[:, width:] = keep.to(b.mask.dtype)
    b.trim_right()
    b.next_pos += torch.tensor([len(c) for c in kept], device=b.next_pos.device)
    return _commit(decoder, tree, fed, logp, hidden, kept, last, fwd_s, draft_s)


def _timed_draft(decoder, ctx, k: int, branch: int) -> tuple[DraftTree, float]:
    tree, draft_s = _timed(decoder.drafter.draft_tree, ctx, k, branch)
    decoder.rec.end("draft", decoder.batch.size, 0, draft_s)
    return tree, draft_s


def _accept(decoder, tree: DraftTree, logp: torch.Tensor, depth: torch.Tensor, k: int):
    """Each row's accepted path (fed indices) and the token the policy adds after it."""
    if decoder.mode == "greedy":
        return verify.accept_tree(tree.tokens, tree.parents, logp.argmax(-1))
    token_u = _token_uniforms(decoder, depth, k)
    if decoder.mode == "coupled":
        return verify.accept_tree(tree.tokens, tree.parents,
                                  choose_tokens(logp, decoder.params, token_u))
    return verify.speculative_accept_tree(tree.tokens, tree.parents, logp,
                                          _accept_uniforms(decoder, tree, depth, k), token_u)


def _token_uniforms(decoder, depth: torch.Tensor, k: int) -> np.ndarray:
    """``[B, n+1]``: ``Stream.TOKEN`` at each fed node's response position
    ``len(tokens) + depth``, the uniform plain decoding draws that position with."""
    grid = decoder._uniform_grid(decoder.batch, k + 1)                   # [B, k+1]
    return np.take_along_axis(grid, depth.cpu().numpy(), axis=1)


def _accept_uniforms(decoder, tree: DraftTree, depth: torch.Tensor, k: int) -> np.ndarray:
    """``[B, n]``: each node's accept-test uniform, ``Stream.ACCEPT`` at the position it
    would emit (``len(tokens) + depth - 1``) offset by its sibling rank (module docstring)."""
    ranks = tree.sibling_ranks().cpu().numpy()
    grid = np.stack([decoder._uniform_grid(decoder.batch, k, Stream.ACCEPT, i * _RANK_STRIDE)
                     for i in range(int(ranks.max(initial=0)) + 1)], axis=1)  # [B, R, k]
    rows = np.arange(grid.shape[0])[:, None]
    return grid[rows, ranks, depth[:, 1:].cpu().numpy() - 1]


def _commit(decoder, tree, fed, logp, hidden, kept, last, fwd_s, draft_s):
    """Per-request acceptance counts, then emit each row's path tokens plus the policy's."""
    b = decoder.batch
    rows = b.size
    accepted = [len(c) - 1 for c in kept]
    for row, i in enumerate(b.request_ids):
        decoder.reqs[i].accepted_per_step.append(accepted[row])
        decoder.reqs[i].drafted += tree.size
    tokens, logprobs, states = [], [], []
    for row, (cols, tok) in enumerate(zip(kept, last)):
        emitted = fed[row, cols[1:]].tolist() + [tok]
        idx = torch.tensor(cols, device=fed.device)
        tokens.append(emitted)
        logprobs.append(logp[row, idx, torch.tensor(emitted, device=fed.device)].tolist())
        states.append(hidden[row, idx])
    n = decoder._finish_step(b, "verify", tokens, logprobs, states, fwd_s)
    return n, tree.size * rows, sum(accepted), draft_s, fwd_s


def _timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t
