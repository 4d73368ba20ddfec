"""Acceptance rules of speculative decoding, batched over rows that accept different counts.

The chain rules return ``(accepted, last)`` per row: how many leading drafts the policy keeps, and the one
token the policy adds after them (the correction at the first rejection, or the bonus token
when every draft was accepted). The emitted tokens are ``drafts[:accepted] + [last]``.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["accept_by_target", "speculative_accept", "accept_tree"]


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
