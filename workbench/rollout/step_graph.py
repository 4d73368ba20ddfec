"""The function that the compiled decode step (``rollout.compiled``) hands to
``torch.compile``: one pass of the lean forward over static buffers, for ``q`` fed tokens a
row (1: a plain step; ``1 + n``: a speculative step's verify pass), and an EAGLE head's
draft step (:func:`make_draft_step`: ``fc`` and its one layer, the same layer pass).

Lossless: its arithmetic is the lean forward's (``forward.run_layer``): the same norms
(Qwen3's q/k norms included), fused matmuls, RoPE and attention; masked columns get weight 0
exactly. Two pieces are written out so that inductor compiles them into its own loops
instead of calling a library kernel: a projection of a few rows (:func:`project`: at batch 1
and 2, the fixed cost and small-row blocking of a BLAS call exceed the arithmetic; a plain
step at batch 1 then runs about twice as fast as eager on this project's CPU, issue 41) and
the attention (:func:`attend`, fused instead of SDPA's kernel). In float32 on the CPU the
projections go instead to the few-rows kernel (:func:`project_packed`, ``rollout.few_rows``),
whatever their rows, on weights packed for it. In float64 its greedy
tokens equal the eager step's (tests/test_compiled_decode.py,
tests/test_compiled_lossless.py, tests/test_step_graph.py), its states and logprobs
to about 1e-8, not to the last bit: the norms compute in float32 (as HF's RMSNorm does, even
for a float64 model), and inductor's float32 reductions add in another order than eager's. In
float32 a near-tie may round differently, as in speculative decoding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .forward import LeanForward, _rotate, normed_qk, rms_norm

__all__ = ["make_step", "make_draft_step", "make_draft_chain", "layer_tensors", "project",
           "project_packed", "projector", "attend"]


def make_step(forward: LeanForward, plans, packed: bool = False):
    """The step over static buffers (``q`` fed tokens a row: 1 for a plain step, ``1 + n``
    for a verify pass), its constants (eps, heads, windows, activations) closed over; every
    tensor (weights included) is an argument, so weights loaded or trained in place, or
    replaced by tensors of the same shapes, need no recompile. ``packed``: the weights come
    packed and every projection runs through the few-rows kernel (:func:`projector`)."""
    consts = [layer_consts(p) for p in plans]
    proj, vocab = projector(packed), forward.lm_head.weight.shape[0]
    windows = list(forward.windows)
    distinct = sorted(set(windows), key=lambda w: -1 if w is None else w)
    norm_eps = forward.decoder.norm.variance_epsilon

    def step(ids, pos, vis, col_pos, col, cos, sin, tree, emb, layers, norm_w, head_w,
             head_b, ks, vs):
        """ids, pos ``[Bb, q]``; vis (bool), col_pos ``[Bb, Tb]``; col ``[q]`` the new
        columns; cos/sin ``[Bb, q, 1, d]``; tree ``[Bb, q, Tb]`` bool (a draft tree's
        ancestors among the new columns, every other column True) or None; ks/vs per layer
        ``[Bb, kv, Tb, d]`` (written)."""
        x = F.embedding(ids, emb)
        masks = {w: visible(vis, col_pos, pos, w, tree) for w in distinct}
        for i, const in enumerate(consts):
            x = layer_pass(x, const, layers[i], masks[windows[i]], cos, sin, col, ks[i], vs[i],
                           proj)
        return proj(rms_norm(norm_w, norm_eps, x), head_w, head_b, vocab), x
    return step


def make_draft_step(plan, fc_out: int, packed: bool = False):
    """An EAGLE head's draft step over static buffers (``speculative.eagle``): ``fc`` on
    (token embedding, parent state), then its one decoder layer (no window: the head's
    attention is full, as its eager step's); returns the predicted states ``[Bb, q, H]``.
    ``fc_out``: ``fc``'s output features; ``packed`` as :func:`make_step`'s."""
    head = head_pass(plan, fc_out, projector(packed))

    def step(ids, pos, vis, col_pos, col, cos, sin, tree, hidden, emb, fc_w, fc_b, layer,
             ks, vs):
        """As :func:`make_step`'s, plus hidden ``[Bb, q, H]`` (each token's parent state);
        ks/vs the head's one layer's."""
        return (head(ids, hidden, pos, vis, col_pos, col, cos, sin, tree, emb, fc_w, fc_b,
                     layer, ks[0], vs[0]),)
    return step


def head_pass(plan, fc_out: int, proj):
    """An EAGLE head's pass over fed tokens, as the draft step and the chain run it:
    ``head(ids, hidden, pos, vis, col_pos, col, cos, sin, tree, emb, fc_w, fc_b, layer, k_buf,
    v_buf)``, ``fc`` on (token embedding, parent state ``hidden``), then its one decoder layer
    (no window: the head's attention is full, as its eager step's), writing its keys and
    values at ``col``; the predicted states ``[Bb, q, H]``."""
    const = layer_consts(plan)

    def head(ids, hidden, pos, vis, col_pos, col, cos, sin, tree, emb, fc_w, fc_b, layer, k_buf,
             v_buf):
        x = proj(torch.cat([F.embedding(ids, emb), hidden], dim=-1), fc_w, fc_b, fc_out)
        mask = visible(vis, col_pos, pos, None, tree)
        return layer_pass(x, const, layer, mask, cos, sin, col, k_buf, v_buf, proj)
    return head


def make_draft_chain(plan, fc_out: int, packed: bool, norm_eps: float, vocab: int, pick):
    """An EAGLE head's whole chain of drafts in one graph (``speculative.eagle.CompiledChain``):
    the catch-up's pairs, then ``k`` times the policy's final norm and head on the last
    predicted state, ``pick`` (``SamplingMode.pick``, rowless: greedy, coupled or
    speculative) of the draft, and the head on (draft, state) for the next, the last draft
    not fed. One call instead of ``k`` draft steps and ``k`` eager head passes: at batch 1
    their fixed costs were most of a round's drafting (issue 41)."""
    proj = projector(packed)
    head = head_pass(plan, fc_out, proj)

    def chain(ids, pos, vis, col_pos, col, cos, sin, tree, hidden, u, emb, fc_w, fc_b, layer,
              norm_w, head_w, head_b, ks, vs):
        """ids, pos ``[Bb, w + k - 1]``: the catch-up's ``w`` tokens (right-aligned, holes
        before them), then the chain's ``k - 1`` columns (their ids unread: the graph picks
        them); hidden ``[Bb, w, H]``: the catch-up tokens' parent states; u ``[Bb, k]``:
        each depth's uniform (unread when greedy); the rest as :func:`make_draft_step`'s,
        plus the policy's final norm and head. Returns the drafts ``[Bb, k]`` and, where
        ``pick`` gives them, their adjusted logprobs ``[Bb, k, V]``."""
        w, k = hidden.shape[1], u.shape[1]

        def head_at(tokens, parent, at: slice):  # the head on fed columns `at`
            return head(tokens, parent, pos[:, at], vis, col_pos, col[at], cos[:, at],
                        sin[:, at], tree, emb, fc_w, fc_b, layer, ks[0], vs[0])

        carry = head_at(ids[:, :w], hidden, slice(0, w))[:, -1:]  # [Bb, 1, H]
        drafts, logqs = [], []
        for depth in range(k):
            logits = proj(rms_norm(norm_w, norm_eps, carry), head_w, head_b, vocab)[:, 0]
            token, logq = pick(logits, u[:, depth])  # [Bb], [Bb, V] or None
            drafts.append(token)
            logqs.append(logq)
            if depth < k - 1:
                carry = head_at(token[:, None], carry, slice(w + depth, w + depth + 1))
        tokens = torch.stack(drafts, 1)  # [Bb, k]
        return (tokens,) if logqs[0] is None else (tokens, torch.stack(logqs, 1))
    return chain


def visible(vis, col_pos, pos, window, tree):
    """``[Bb, 1, q, Tb]`` bool: query ``i`` of row ``b`` sees column ``j`` (visible, at or
    before its position, inside ``window``, and a tree ancestor among the new columns), as
    ``forward.attention_mask`` decides."""
    kv, qp = col_pos[:, None, :], pos[:, :, None]
    allowed = vis[:, None, :] & (kv <= qp)
    if window is not None:
        allowed = allowed & (kv > qp - window)
    if tree is not None:
        allowed = allowed & tree
    return allowed[:, None]


def layer_pass(x, const, tensors, mask, cos, sin, col, k_buf, v_buf, proj):
    """One decoder layer on ``x [Bb, q, H]`` (``forward.run_layer``'s arithmetic), its new
    keys and values written into ``k_buf``/``v_buf`` ``[Bb, kv, Tb, d]`` at columns ``col``;
    its projections by ``proj`` (:func:`projector`'s)."""
    eps1, eps2, n_q, n_kv, d, scale, act, eps_q, eps_k, (n_qkv, n_o, n_gu, n_down) = const
    ln1, w_qkv, b_qkv, w_o, b_o, ln2, w_gu, b_gu, w_down, b_down, qn, kn = tensors
    rows, q = x.shape[:2]
    qkv = proj(rms_norm(ln1, eps1, x), w_qkv, b_qkv, n_qkv).view(rows, q, -1, d)
    n = n_q + n_kv
    qk = _rotate(normed_qk(qkv, n_q, n_kv, qn, kn, eps_q, eps_k), cos, sin)
    k_buf.index_copy_(2, col, qk[:, :, n_q:].transpose(1, 2))
    v_buf.index_copy_(2, col, qkv[:, :, n:].transpose(1, 2))
    out = attend(qk[:, :, :n_q], k_buf, v_buf, mask, scale)
    x = x + proj(out.reshape(rows, q, -1), w_o, b_o, n_o)
    gate, up = proj(rms_norm(ln2, eps2, x), w_gu, b_gu, n_gu).chunk(2, dim=-1)
    return x + proj(act(gate) * up, w_down, b_down, n_down)


GEMV_ROWS = 6  # the most rows a projection takes as row-by-row sums (:func:`project`)


def _few(rows) -> bool:
    """Whether ``rows`` (a row or query count of the graph being traced) are few enough to
    write the arithmetic out (:func:`project`, :func:`attend`): a static size of at most
    ``GEMV_ROWS``. A symbolic size may grow past it, so the library kernel takes it."""
    return not isinstance(rows, torch.SymInt) and rows <= GEMV_ROWS


def project(x, w, b, n=None):
    """``F.linear(x, w, b)`` for ``x [..., K]``, ``w [N, K]`` (``n``, the output features,
    unused: :func:`project_packed` takes it). A few rows (a plain step at
    batch 1 or 2, a verify pass or a draft step of a row or two) are each multiplied by the
    weight and summed over ``K``: inductor compiles those sums into loops of its own, fused
    with the norm before them, which stream each weight row and skip the library call, whose
    fixed cost and small-row blocking cost more than the arithmetic here. Past ``GEMV_ROWS``
    rows, and where the rows are a symbolic size of the graph, the BLAS GEMM, whose blocking
    then pays. The choice is made when the graph is traced (:func:`_few`)."""
    rows = x.numel() // x.shape[-1]
    if not _few(rows):
        return F.linear(x, w, b)
    flat = x.reshape(rows, -1)
    out = torch.stack([(flat[i] * w).sum(-1) for i in range(rows)])  # [rows, N]
    out = out.view(*x.shape[:-1], -1)
    return out if b is None else out + b


def projector(packed: bool):
    """The graph's projection ``proj(x, w, b, n)``: :func:`project_packed` (``w`` packed by
    ``few_rows.pack``) where ``packed``, else :func:`project` (``w [N, K]``)."""
    return project_packed if packed else project


def project_packed(x, w, b, n: int):
    """``x [..., K] @ W.T + b`` for ``w = few_rows.pack(W)``, ``W [n, K]``, through the
    few-rows operator (``rollout.few_rows``: each weight vector loaded once for up to 8
    rows, their sums kept in registers), whatever the count of rows, static or symbolic.
    The caller has loaded the operator (``few_rows.kernel_applies``)."""
    k = w.shape[1]
    out = torch.ops.workbench.few_rows_linear(x.reshape(-1, k), w, b, n)  # [rows, n]
    return out.view(*x.shape[:-1], n)


def attend(q, k_buf, v_buf, mask, scale):
    """Attention of ``q [Bb, q, n_q, d]`` over the cache ``k_buf``/``v_buf`` ``[Bb, kv, Tb,
    d]`` where ``mask [Bb, 1, q, Tb]`` (bool) allows: ``[Bb, q, n_q, d]``. One query a row
    (a plain step, a chain's draft step) or a few queries in all (a verify pass at batch 1)
    are written out (scores, softmax, the weighted sum) so that inductor fuses them into the
    layer's loops instead of calling SDPA's kernel, as SDPA computes them: grouped-query heads
    as ``enable_gqa`` (query head ``h`` reads kv head ``h // (n_q / kv)``), a masked column
    weighs exactly 0. Many rows of several queries (a verify pass at batch 8), or a symbolic
    count of them, call SDPA, whose kernel is then the faster (:func:`_few`)."""
    rows, n_new, n_q, d = q.shape
    if n_new > 1 and not _few(rows * n_new):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k_buf, v_buf, attn_mask=mask,
                                              scale=scale, enable_gqa=True).transpose(1, 2)
    n_kv = k_buf.shape[1]
    qg = q.transpose(1, 2).reshape(rows, n_kv, n_q // n_kv, n_new, 1, d)
    scores = (qg * k_buf[:, :, None, None]).sum(-1) * scale  # [Bb, kv, g, q, Tb]
    scores = scores.masked_fill(~mask[:, :, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1)[..., None]  # [Bb, kv, g, q, Tb, 1]
    out = (weights * v_buf[:, :, None, None]).sum(-2)  # [Bb, kv, g, q, d]
    return out.reshape(rows, n_q, n_new, d).transpose(1, 2)


def layer_consts(p) -> tuple:
    """A layer plan's constants in the order :func:`layer_pass` unpacks them (its weights'
    output features last)."""
    outs = tuple(w.shape[0] for w in (p.w_qkv, p.w_o, p.w_gate_up, p.w_down))
    return (p.eps1, p.eps2, p.n_q, p.n_kv, p.head_dim, p.scale, p.act, p.eps_q, p.eps_k, outs)


def layer_tensors(p, packed: bool = False) -> tuple:
    """A layer plan's tensors in the order :func:`layer_pass` unpacks them; with ``packed``,
    its weights in the few-rows kernel's layout (``LayerPlan.packed``, for
    :func:`project_packed`)."""
    w_qkv, w_o, w_gu, w_down = (p.packed if packed else
                                (p.w_qkv, p.w_o, p.w_gate_up, p.w_down))
    return (p.ln1, w_qkv, p.b_qkv, w_o, p.b_o, p.ln2, w_gu, p.b_gate_up, w_down, p.b_down,
            p.q_norm, p.k_norm)
