"""Verification of a speculative step: what the policy keeps of the drafts, a pure function of
tensors and one :class:`~workbench.rollout.sampling_mode.SamplingMode`.

:func:`verify_chain` and :func:`verify_tree` are what the decoder calls (``rollout.drafts``
picks one by the draft's shape); each returns a :class:`Verdict`. Below them the acceptance
rules, batched over rows that accept different counts: the chain rules return
``(accepted, last)`` per row, how many leading drafts the policy keeps and the one token the
policy adds after them (the correction at the first rejection, or the bonus token when every
draft was accepted), so the emitted tokens are ``drafts[:accepted] + [last]``; the tree rules
return ``(paths, last)`` per row, the accepted fed indices, root to leaf, and the token the
policy adds after the last of them.

Glossary (``B`` rows, ``F = 1 + n`` fed tokens a row, ``V`` the vocabulary, ``H`` the hidden size):

fed          ``[last_token] + drafts`` per row: fed index 0 is the *root* (each row's emitted,
             unfed token), fed index ``j + 1`` is draft node ``j``.
depth        a fed node's distance from the root (``[B, F]``); it predicts response position
             ``len(tokens) + depth``. A chain's drafts have depths ``1..k``.
logits       ``[B, F, V]`` the policy's, ``hidden`` ``[B, F, H]`` its pre-norm states, both
             at the fed tokens.
mode         greedy, coupled or speculative sampling, keyed to the step's rows (the
             uniforms): :class:`~workbench.rollout.sampling_mode.SamplingMode`.

Lossless in every mode. Greedy and coupled: the policy's token at every fed node is fixed
(``mode.targets``: its argmax, or its coupled draw at the node's response position, exactly
what plain decoding would emit there) and only drafts equal to it are kept
(:func:`accept_by_target`, :func:`accept_tree`). Speculative, chain: the rejection rule of
Leviathan et al. against the drafter's own distribution (:func:`speculative_accept`).
Speculative, tree: the drafter picks the nodes deterministically (its top candidates), so each
node's children are tried one by one with the one-hot rejection test against the policy's
residual (:func:`speculative_accept_tree`), which samples the policy's distribution exactly at
every node.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from .sampling_mode import SamplingMode

__all__ = ["Verdict", "verify_chain", "verify_tree", "speculative_accept", "accept_tree",
           "speculative_accept_tree"]


@dataclass(frozen=True)
class Verdict:
    """What the policy keeps of one step's drafts, per row (``B`` rows, ``F = 1 + n`` fed).

    ``keep`` ``[B, F]`` long: 1 on the fed columns that stay in the cache (the root and an
    accepted path), 0 on the rejected ones (they become holes). ``accepted``: drafts kept per
    row. ``tokens``: per row the kept drafts then the policy's own token; ``logprobs`` their
    adjusted logprobs under the policy; ``states`` the policy's pre-norm states at the kept
    fed columns (``[a + 1, H]``), the states that predicted ``tokens``.
    """

    keep: torch.Tensor
    accepted: list[int]
    tokens: list[list[int]]
    logprobs: list[list[float]]
    states: list[torch.Tensor]


def verify_chain(drafts: torch.Tensor, logq: torch.Tensor | None, logits: torch.Tensor,
                 hidden: torch.Tensor, mode: SamplingMode) -> Verdict:
    """The accepted prefix of each row's chain and the policy's token after it.

    ``drafts`` ``[B, k]`` long; ``logq`` ``[B, k, V]`` the drafter's adjusted distribution at
    each draft (read in speculative mode only, ``None`` otherwise); ``logits`` ``[B, k+1, V]``
    and ``hidden`` ``[B, k+1, H]`` the policy's at the fed tokens (root first).
    """
    b, k = drafts.shape
    assert logits.shape[:2] == (b, k + 1) and hidden.shape[:2] == (b, k + 1), \
        (tuple(drafts.shape), tuple(logits.shape), tuple(hidden.shape))
    assert not mode.speculative or (logq is not None and logq.shape[:2] == (b, k)), \
        "speculative sampling verifies against the drafter's logq [B, k, V]"
    logp = mode.logprobs(logits)                                         # [B, k+1, V]
    if mode.speculative:
        depth = np.arange(1, k + 1)
        accepted, last = speculative_accept(drafts, logp, logq, mode.accept_uniforms(depth),
                                            mode.token_uniforms(np.arange(k + 1)))
    else:
        target = mode.targets(logp, np.arange(k + 1))                    # [B, k+1]
        accepted = accept_by_target(drafts, target)
        last = target.gather(1, accepted[:, None]).squeeze(1)
    emitted = torch.cat([drafts, last[:, None]], dim=1)                  # [B, k+1]
    emitted.scatter_(1, accepted[:, None], last[:, None])
    emitted_lp = logp.gather(-1, emitted[..., None]).squeeze(-1)
    # the fed root and the accepted drafts stay; rejected drafts become holes
    keep = (torch.arange(k + 1, device=drafts.device)[None, :] <= accepted[:, None]).long()
    acc = accepted.tolist()
    return Verdict(keep, acc, [e[:a + 1] for e, a in zip(emitted.tolist(), acc)],
                   [e[:a + 1] for e, a in zip(emitted_lp.tolist(), acc)],
                   [hidden[row, :a + 1] for row, a in enumerate(acc)])


def verify_tree(tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor,
                logits: torch.Tensor, hidden: torch.Tensor, mode: SamplingMode) -> Verdict:
    """Each row's accepted root-to-leaf path through its draft tree and the policy's token
    after it.

    ``tokens``/``parents`` ``[B, n]`` long (``rollout.tree.DraftTree``: node ``j`` is fed
    index ``j + 1``, parent ``-1`` the root); ``depth`` ``[B, n+1]`` each fed node's depth
    (root 0); ``logits`` ``[B, n+1, V]`` and ``hidden`` ``[B, n+1, H]`` at the fed nodes.
    """
    b, n = tokens.shape
    assert parents.shape == (b, n) and depth.shape == (b, n + 1), \
        (tuple(tokens.shape), tuple(parents.shape), tuple(depth.shape))
    assert logits.shape[:2] == (b, n + 1) and hidden.shape[:2] == (b, n + 1), \
        (tuple(logits.shape), tuple(hidden.shape))
    logp = mode.logprobs(logits)                                         # [B, n+1, V]
    if mode.speculative:
        paths, last = speculative_accept_tree(
            tokens, parents, logp, mode.accept_uniforms(depth[:, 1:], sibling_ranks(parents)),
            mode.token_uniforms(depth))
    else:
        paths, last = accept_tree(tokens, parents, mode.targets(logp, depth))
    keep = torch.zeros(b, n + 1, dtype=torch.long, device=tokens.device)
    emitted_tokens, logprobs, states = [], [], []
    for row, (path, tok) in enumerate(zip(paths, last)):
        cols = [0] + path                                                # fed indices
        keep[row, cols] = 1
        emitted = tokens[row, [c - 1 for c in path]].tolist() + [tok]
        idx = torch.tensor(cols, device=tokens.device)
        emitted_tokens.append(emitted)
        logprobs.append(logp[row, idx, torch.tensor(emitted, device=tokens.device)].tolist())
        states.append(hidden[row, idx])
    return Verdict(keep, [len(p) for p in paths], emitted_tokens, logprobs, states)


def sibling_ranks(parents: torch.Tensor) -> torch.Tensor:
    """``[B, n]`` long: how many siblings come before each node (node order) of a tree with
    ``parents`` ``[B, n]``, the order in which speculative verification tries a node's
    children."""
    same = parents[:, :, None] == parents[:, None, :]
    return (same & torch.ones_like(same[0]).tril(-1)).sum(-1)


def accept_by_target(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Accepted counts when the policy's token at each position is already fixed.

    ``target[:, j]`` is the token the policy emits at draft position ``j`` (argmax when greedy,
    the coupled draw when sampling); a draft is kept while it equals the target, so the output
    is the policy's own tokens. ``draft`` is ``[B, k]``, ``target`` ``[B, k+1]``.
    """
    match = (draft == target[:, :draft.shape[1]]).to(torch.long)
    return match.cumprod(dim=1).sum(dim=1)


def speculative_accept(draft: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor,
                       accept_u, resample_u) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection rule of Leviathan et al. / Chen et al.: output ~ the policy exactly.

    Draft ``j`` (drawn from the drafter's ``q_j``) is kept with probability
    ``min(1, p_j(d) / q_j(d))``; at the first rejection the token is drawn from the residual
    ``max(0, p_j - q_j)`` renormalised; if all ``k`` drafts pass, a bonus token is drawn from
    ``p_k``. ``logp`` is ``[B, k+1, V]`` (policy), ``logq`` ``[B, k, V]`` (drafter; one-hot
    for a deterministic drafter), ``accept_u`` ``[B, k]`` and ``resample_u`` ``[B, k+1]``
    uniforms.
    """
    b, k = draft.shape
    dtype = logp.dtype
    accept_u = torch.as_tensor(np.asarray(accept_u), dtype=dtype, device=logp.device)
    resample_u = torch.as_tensor(np.asarray(resample_u), dtype=dtype, device=logp.device)
    p_d = logp[:, :k].gather(-1, draft[..., None]).squeeze(-1).exp()
    q_d = logq.gather(-1, draft[..., None]).squeeze(-1).exp()
    keep = (accept_u * q_d < p_d).to(torch.long)          # u < p/q without dividing by zero
    accepted = keep.cumprod(dim=1).sum(dim=1)
    rows = torch.arange(b, device=logp.device)
    p_next = logp[rows, accepted].exp()                    # [B, V] at the stopping position
    q_pad = torch.cat([logq.exp(), torch.zeros_like(logq[:, :1])], dim=1)
    residual = (p_next - q_pad[rows, accepted]).clamp_(min=0)
    # all-accepted rows draw the bonus from p_k itself (q_pad is zero there)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp(min=torch.finfo(dtype).tiny), p_next)
    cdf = residual.cumsum(-1)
    u = resample_u[rows, accepted][:, None] * cdf[:, -1:]
    last = torch.searchsorted(cdf.contiguous(), u.contiguous(), right=True).squeeze(-1)
    return accepted, last.clamp_(max=logp.shape[-1] - 1)


def accept_tree(tokens: torch.Tensor, parents: torch.Tensor,
                target: torch.Tensor) -> tuple[list[list[int]], list[int]]:
    """The accepted path through each row's draft tree when the policy's token at every fed
    node is already fixed (greedy argmax or the coupled draw at the node's position).

    Fed index 0 is the root, node ``j`` of ``tokens``/``parents`` ``[B, n]`` is fed index
    ``j + 1``; ``target`` ``[B, n+1]``. From the root, the child whose token equals the
    target is accepted (siblings are distinct tokens, so at most one) and the walk goes on
    from it. Returns per row the accepted fed indices, root to leaf, and the target at the
    stopping node: the token the policy adds. The output is the policy's own tokens.
    """
    paths, last = [], []
    for toks, pars, tgt in zip(tokens.tolist(), parents.tolist(), target.tolist()):
        children: dict[int, list[int]] = {}
        for j, p in enumerate(pars):
            children.setdefault(p + 1, []).append(j + 1)
        path, node = [], 0
        while True:
            node = next((c for c in children.get(node, ()) if toks[c - 1] == tgt[node]), None)
            if node is None:
                break
            path.append(node)
        paths.append(path)
        last.append(tgt[path[-1] if path else 0])
    return paths, last


def child_table(parents: torch.Tensor) -> torch.Tensor:
    """``[B, n+1, m]`` long: the fed indices of each fed node's children in node order,
    ``-1`` padded (``m`` the largest child count, at least 1). ``parents`` ``[B, n]`` as in
    :class:`~workbench.rollout.tree.DraftTree`; fed index 0 is the root, node ``j`` is ``j+1``."""
    b, n = parents.shape
    rows = torch.arange(b, device=parents.device)
    fed_parent = parents + 1                                             # [B, n]
    count = torch.zeros(b, n + 1, dtype=torch.long, device=parents.device)
    width = max(1, int(count.scatter_add(1, fed_parent, torch.ones_like(fed_parent)).max()))
    table = torch.full((b, n + 1, width), -1, dtype=torch.long, device=parents.device)
    for j in range(n):                                   # node order = the order of the tests
        par = fed_parent[:, j]
        table[rows, par, count[rows, par]] = j + 1
        count[rows, par] += 1
    return table


def speculative_accept_tree(tokens: torch.Tensor, parents: torch.Tensor, logp: torch.Tensor,
                            accept_u, resample_u) -> tuple[list[list[int]], list[int]]:
    """Speculative sampling through a draft tree whose nodes the drafter chose
    deterministically: the output has exactly the policy's distribution.

    At a node with policy distribution ``p`` (``logp[:, node]``) the children ``c_1..c_m``
    are tried in node order. Child ``c_i`` is accepted with probability ``r_{i-1}(c_i)``,
    where ``r_0 = p`` and ``r_i`` is ``r_{i-1}`` with ``c_i`` zeroed and renormalised (the
    rejection test ``min(1, r/q)`` against a one-hot proposal ``q``). An accepted child
    becomes the node and the walk goes on; when every child is rejected (or there is none)
    the policy's token is drawn from the last residual and the walk stops. This is sampling
    from ``p`` by trying the candidates one by one without replacement, so the token chosen
    at every node is distributed as ``p`` whatever the candidate set (a duplicate candidate
    finds its token zeroed and is never accepted), and the whole output as the policy.

    ``tokens``/``parents`` ``[B, n]`` (:class:`~workbench.rollout.tree.DraftTree`), ``logp``
    ``[B, n+1, V]`` at the fed nodes (root first); ``accept_u`` ``[B, n]`` the uniform of
    each node's own test, ``resample_u`` ``[B, n+1]`` the uniform of the draw at each fed
    node. Returns per row the accepted fed indices, root to leaf, and the drawn token.
    """
    b, dev = tokens.shape[0], logp.device
    # the walk runs in float64: a float32 uniform can round up to 1 and reject a sure child
    accept_u = torch.as_tensor(np.asarray(accept_u), dtype=torch.float64, device=dev)
    resample_u = torch.as_tensor(np.asarray(resample_u), dtype=torch.float64, device=dev)
    children = child_table(parents)
    fed_tok = torch.cat([tokens.new_zeros(b, 1), tokens], dim=1)        # by fed index
    fed_u = torch.cat([accept_u.new_zeros(b, 1), accept_u.reshape(b, -1)], dim=1)
    rows = torch.arange(b, device=dev)
    node = torch.zeros(b, dtype=torch.long, device=dev)
    walking = torch.ones(b, dtype=torch.bool, device=dev)
    last = torch.zeros(b, dtype=torch.long, device=dev)
    paths = []
    while bool(walking.any()):
        residual = logp[rows, node].double().exp()                       # [B, V]
        moved = torch.zeros_like(walking)
        for i in range(children.shape[-1]):
            child = children[rows, node, i]
            testing = walking & ~moved & (child >= 0)
            tok = fed_tok[rows, child.clamp(min=0)]
            mass, p_c = residual.sum(-1), residual[rows, tok]
            u = fed_u[rows, child.clamp(min=0)]
            take = testing & (u * mass < p_c)    # u < r(c) without dividing by the mass
            residual[rows, tok] = torch.where(testing & ~take, 0.0, p_c)
            moved |= take
            node = torch.where(take, child, node)
        stop = walking & ~moved
        last = torch.where(stop, _draw(residual, logp[rows, node].double().exp(),
                                       resample_u[rows, node]), last)
        walking &= moved
        paths.append(torch.where(moved, node, -1))
    return _path_lists(paths, b), last.tolist()


def _draw(residual: torch.Tensor, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws from each row's residual ``[B, V]`` (unnormalised), or from ``p``
    where no mass is left (only by rounding: a child holding all of it is always accepted)."""
    total = residual.sum(-1, keepdim=True)
    dist = torch.where(total > 0, residual, p)
    cdf = dist.cumsum(-1)
    idx = torch.searchsorted(cdf.contiguous(), (u[:, None] * cdf[:, -1:]).contiguous(),
                             right=True).squeeze(-1)
    return idx.clamp_(max=p.shape[-1] - 1)


def _path_lists(paths: list[torch.Tensor], rows: int) -> list[list[int]]:
    """Per-depth accepted nodes (``-1`` once a row stopped) as one list of fed indices a row."""
    if not paths:
        return [[] for _ in range(rows)]
    return [[c for c in row if c >= 0] for row in torch.stack(paths, 1).tolist()]
