"""Rollout engine vs HF ``generate``: greedy tokens/s at several batch sizes, side by side.

Same model, same prompts (default task, held-out seed, so lengths are long-tailed), same
greedy settings; both must produce identical tokens. Each configuration runs ``--repeats``
times, alternating engine and HF, and the median is reported with the ratio. Also reports the
engine's overhead: the share of decode-step wall time spent inside the model's forward.

    python benchmarks/bench_engine.py --batch-sizes 1 8 32 --prompts 32 --repeats 3
"""
from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch

from workbench.models import load_model
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.tasks import HELDOUT_SEED, get_problems


def hf_generate(model, tok, prompts, batch_size, max_new_tokens):
    """All prompts through ``model.generate`` in chunks of ``batch_size``; responses to EOS."""
    out = []
    for s in range(0, len(prompts), batch_size):
        enc = tok(prompts[s:s + batch_size], return_tensors="pt", padding=True)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        for row in gen[:, enc["input_ids"].shape[1]:].tolist():
            out.append(row[:row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row)
    return out


def engine_generate(engine, prompts, batch_size, max_new_tokens):
    res = engine.rollout(prompts, RolloutConfig(max_new_tokens=max_new_tokens,
                                                max_batch_size=batch_size), progress=False)
    return res.tokens, res.timeline.steps


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args()

    model, tok = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    engine = RolloutEngine(model, tok)
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=HELDOUT_SEED)]
    rows = []
    for bs in args.batch_sizes:
        t_engine, t_hf, shares = [], [], []
        for _ in range(args.repeats):
            (tokens, steps), dt = timed(engine_generate, engine, prompts, bs, args.max_new_tokens)
            t_engine.append(dt)
            dec = steps[steps["kind"] == "decode"]
            shares.append(dec["forward_s"].sum() / (dec["end_s"] - dec["start_s"]).sum())
            ref, dt = timed(hf_generate, model, tok, prompts, bs, args.max_new_tokens)
            t_hf.append(dt)
            if tokens != ref:
                raise SystemExit(f"batch {bs}: engine and HF generate disagree")
        n_tokens = sum(len(t) for t in tokens)
        eng, hf = n_tokens / statistics.median(t_engine), n_tokens / statistics.median(t_hf)
        rows.append({"batch_size": bs, "tokens": n_tokens, "engine_tok_s": round(eng, 1),
                     "hf_generate_tok_s": round(hf, 1), "ratio": round(eng / hf, 2),
                     "forward_share": round(statistics.median(shares), 3)})
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    print(f"\nmodel={args.model} device={args.device} dtype={args.dtype} prompts={args.prompts} "
          f"repeats={args.repeats} (median) threads={torch.get_num_threads()}")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
