"""What would a compiled decode step buy the engine? (issue 41; a probe, no package code.)

One plain decode step of the default policy written the way the engine's lean forward runs it
(fused q/k/v and gate/up matmuls, RoPE from a table, one SDPA call per layer, tied LM head),
but on a static preallocated KV cache (``[layers, batch, kv heads, max_len, head_dim]``,
written in place with ``index_copy_`` at the step's position, attention over the whole cache
with a position mask), so that every step has the same shapes. Eager against
``torch.compile`` (inductor, CPU, ``dynamic=False``) of that same function, one torch thread,
at each batch size: the two alternate in blocks of ``--steps`` steps, ``--repeats`` times;
the per-step time is the median block's, and the ratio the median of per-block ratios.
The compiled and eager logits are checked close first.

    python benchmarks/compile_probe.py --batch-sizes 1 8 32
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from workbench.models import load_model


def weights_of(model):
    cfg = model.config
    layers = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        layers.append({
            "ln1": layer.input_layernorm.weight.detach(),
            "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach(),
            "o": a.o_proj.weight.detach(),
            "ln2": layer.post_attention_layernorm.weight.detach(),
            "gu": torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach(),
            "down": m.down_proj.weight.detach()})
    return {"emb": model.model.embed_tokens.weight.detach(), "layers": layers,
            "norm": model.model.norm.weight.detach(),
            "head": model.get_output_embeddings().weight.detach(), "eps": cfg.rms_norm_eps,
            "heads": cfg.num_attention_heads, "kv": cfg.num_key_value_heads,
            "d": cfg.hidden_size // cfg.num_attention_heads}


def rms(w, eps, x):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def make_step(W):
    H, KV, D, eps = W["heads"], W["kv"], W["d"], W["eps"]

    def step(ids, pos, cos, sin, kc, vc, valid):
        """ids [B], pos [1] (the step's cache column), cos/sin [D], kc/vc [L,B,KV,T,D],
        valid [1, T] bool (columns <= pos). Returns logits [B, V]; writes the cache."""
        B = ids.shape[0]
        x = W["emb"][ids]  # B, hidden
        for i, p in enumerate(W["layers"]):
            h = rms(p["ln1"], eps, x)
            q, k, v = (h @ p["qkv"].T).split([H * D, KV * D, KV * D], dim=-1)
            q = rope(q.view(B, H, 1, D), cos, sin)
            k = rope(k.view(B, KV, 1, D), cos, sin)
            kc[i].index_copy_(2, pos, k)
            vc[i].index_copy_(2, pos, v.view(B, KV, 1, D))
            o = F.scaled_dot_product_attention(q, kc[i], vc[i], attn_mask=valid,
                                               enable_gqa=True)
            x = x + o.reshape(B, H * D) @ p["o"].T
            h = rms(p["ln2"], eps, x)
            g, u = (h @ p["gu"].T).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ p["down"].T
        return rms(W["norm"], eps, x) @ W["head"].T
    return step


def blocks(fn, args, steps):
    t = time.perf_counter()
    for _ in range(steps):
        fn(*args)
    return (time.perf_counter() - t) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-len", type=int, default=512, help="the static cache's length")
    ap.add_argument("--position", type=int, default=64, help="the step's cache column")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, _ = load_model("default", device="cpu", dtype=torch.float32)
    W = weights_of(model)
    L, KV, D = len(W["layers"]), W["kv"], W["d"]
    rot = model.model.rotary_emb
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, static cache "
          f"{args.max_len}, position {args.position}, {args.steps} steps a block, "
          f"{args.repeats} blocks each, alternating", flush=True)
    rows = []
    with torch.inference_mode():
        pos_t = torch.tensor([args.position])
        cos, sin = rot(torch.zeros(1, 1, D), pos_t.view(1, 1))
        cos, sin = cos.view(D), sin.view(D)
        valid = (torch.arange(args.max_len) <= args.position).view(1, args.max_len)
        eager = make_step(W)
        compiled = torch.compile(make_step(W), dynamic=False)
        for bs in args.batch_sizes:
            kc = torch.randn(L, bs, KV, args.max_len, D)
            vc = torch.randn(L, bs, KV, args.max_len, D)
            ids = torch.randint(3, W["emb"].shape[0], (bs,))
            a = (ids, pos_t, cos, sin, kc, vc, valid)
            t0 = time.perf_counter()
            out_c = compiled(*a)
            t_compile = time.perf_counter() - t0
            out_e = eager(*a)
            torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-4)
            te, tc = [], []
            for r in range(args.repeats):
                order = [(eager, te), (compiled, tc)]
                for fn, acc in (order if r % 2 == 0 else order[::-1]):
                    acc.append(blocks(fn, a, args.steps))
            ratios = [e / c for e, c in zip(te, tc)]
            med = statistics.median(ratios)
            rows.append((bs, statistics.median(te) * 1e6, statistics.median(tc) * 1e6, med,
                         min(ratios), max(ratios), (max(ratios) - min(ratios)) / med, t_compile))
            print(rows[-1], flush=True)
    print("\n| batch | eager us/step | compiled us/step | eager / compiled | min-max | spread "
          "| first call (compile) s |\n|---|---|---|---|---|---|---|")
    for bs, e, c, m, lo, hi, sp, tcomp in rows:
        print(f"| {bs} | {e:.0f} | {c:.0f} | {m:.2f} | {lo:.2f}-{hi:.2f} | {sp:.0%}"
              f"{' WIDE' if sp > 0.25 else ''} | {tcomp:.0f} |")


if __name__ == "__main__":
    main()
