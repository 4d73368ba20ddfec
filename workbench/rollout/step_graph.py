"""The function that the compiled decode step (``rollout.compiled``) hands to
``torch.compile``: one pass of the lean forward over static buffers, for ``q`` fed tokens a
row (1: a plain step; ``1 + n``: a speculative step's verify pass).

Lossless: its arithmetic is the lean forward's (``forward.run_layer``): the same norms, fused
matmuls, Qwen3's q/k norms, RoPE and one SDPA per layer; masked columns get weight 0 exactly. In float64 its
greedy tokens equal the eager step's (tests/test_compiled_decode.py), its states and logprobs
to about 1e-8, not to the last bit: the norms compute in float32 (as HF's RMSNorm does, even
for a float64 model), and inductor's float32 reductions add in another order than eager's. In
float32 a near-tie may round differently, as in speculative decoding.
"""
from __future__ import annotations

import torch.nn.functional as F

from .forward import LeanForward, _rotate, normed_qk, rms_norm

__all__ = ["make_step", "layer_tensors"]


def make_step(forward: LeanForward, plans):
    """The step over static buffers (``q`` fed tokens a row: 1 for a plain step, ``1 + n``
    for a verify pass), its constants (eps, heads, windows, activations) closed over; every
    tensor (weights included) is an argument, so weights loaded or trained in place, or
    replaced by tensors of the same shapes, need no recompile."""
    consts = [(p.eps1, p.eps2, p.n_q, p.n_kv, p.head_dim, p.scale, p.act, p.eps_q, p.eps_k)
              for p in plans]
    windows = list(forward.windows)
    distinct = sorted(set(windows), key=lambda w: -1 if w is None else w)
    norm_eps = forward.decoder.norm.variance_epsilon

    def step(ids, pos, vis, col_pos, col, cos, sin, tree, emb, layers, norm_w, head_w,
             head_b, ks, vs):
        """ids, pos ``[Bb, q]``; vis (bool), col_pos ``[Bb, Tb]``; col ``[q]`` the new
        columns; cos/sin ``[Bb, q, 1, d]``; tree ``[Bb, q, Tb]`` bool (a draft tree's
        ancestors among the new columns, every other column True) or None; ks/vs per layer
        ``[Bb, kv, Tb, d]`` (written)."""
        rows, q = ids.shape
        x = F.embedding(ids, emb)
        masks = {}
        for w in distinct:
            kv, qp = col_pos[:, None, :], pos[:, :, None]
            allowed = vis[:, None, :] & (kv <= qp)
            if w is not None:
                allowed = allowed & (kv > qp - w)
            if tree is not None:
                allowed = allowed & tree
            masks[w] = allowed[:, None]
        for i, (eps1, eps2, n_q, n_kv, d, scale, act, eps_q, eps_k) in enumerate(consts):
            ln1, w_qkv, b_qkv, w_o, b_o, ln2, w_gu, b_gu, w_down, b_down, qn, kn = layers[i]
            h = rms_norm(ln1, eps1, x)
            qkv = F.linear(h, w_qkv, b_qkv).view(rows, q, -1, d)
            n = n_q + n_kv
            qk = _rotate(normed_qk(qkv, n_q, n_kv, qn, kn, eps_q, eps_k), cos, sin)
            ks[i].index_copy_(2, col, qk[:, :, n_q:].transpose(1, 2))
            vs[i].index_copy_(2, col, qkv[:, :, n:].transpose(1, 2))
            out = F.scaled_dot_product_attention(qk[:, :, :n_q].transpose(1, 2), ks[i], vs[i],
                                                 attn_mask=masks[windows[i]], scale=scale,
                                                 enable_gqa=True)
            x = x + F.linear(out.transpose(1, 2).reshape(rows, q, -1), w_o, b_o)
            gate, up = F.linear(rms_norm(ln2, eps2, x), w_gu, b_gu).chunk(2, dim=-1)
            x = x + F.linear(act(gate) * up, w_down, b_down)
        return F.linear(rms_norm(norm_w, norm_eps, x), head_w, head_b), x
    return step


def layer_tensors(p) -> tuple:
    """A layer plan's tensors in the order ``make_step``'s ``layers`` unpacks them."""
    return (p.ln1, p.w_qkv, p.b_qkv, p.w_o, p.b_o, p.ln2, p.w_gate_up, p.b_gate_up, p.w_down,
            p.b_down, p.q_norm, p.k_norm)
