"""Speculative decoding vs plain decoding of the same engine, and vs HF's own SD at batch 1.

Part 1 (``sd_sweep``): EAGLE at k draft tokens, batch sizes 1..32, greedy and temperature 1,
plus every drafter at batch 1: speedup, acceptance length tau, and the bound
tau*T1/(k*Td+Tv) from step times measured in the same runs.
Part 2 (batch 1, greedy, same prompts, tokens must agree): HF ``generate`` plain, HF
``generate(assistant_model=<small LM>)`` (assisted generation), HF
``generate(prompt_lookup_num_tokens=k)``, and this engine plain / with the same small LM /
with n-gram / with EAGLE. Medians of ``--repeats`` runs, wall clock of this process.

    python benchmarks/bench_spec.py --prompts 16 --repeats 3
"""
from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch

from workbench.models import load_model
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative.defaults import default_drafters
from workbench.speculative.sweep import sd_sweep
from workbench.tasks import HELDOUT_SEED, get_problems


def hf_batch1(model, tok, prompts, max_new_tokens, **kw):
    out = []
    for p in prompts:
        enc = tok(p, return_tensors="pt")
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **kw)
        out.append(gen[0, enc["input_ids"].shape[1]:].tolist())
    return out


def median_time(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--skip-hf", action="store_true", help="part 1 only")
    args = ap.parse_args()
    pd.set_option("display.width", 200)

    policy, tok = load_model("default", device=args.device, dtype=getattr(torch, args.dtype))
    engine = RolloutEngine(policy, tok)
    drafters = default_drafters(policy, tok)
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=HELDOUT_SEED)]
    common = dict(repeats=args.repeats, max_new_tokens=args.max_new_tokens, progress=False)

    curve = sd_sweep(engine, prompts, {"eagle": drafters["eagle"]}, ks=[args.k],
                     batch_sizes=args.batch_sizes, temperatures=[0.0, 1.0], **common)
    at1 = sd_sweep(engine, prompts, drafters, ks=[args.k], batch_sizes=[1],
                   temperatures=[0.0, 1.0], **common)
    cols = ["temperature", "batch_size", "drafter", "k", "tau", "plain_tok_s", "sd_tok_s",
            "speedup", "bound", "identical"]
    print(f"device={args.device} dtype={args.dtype} prompts={args.prompts} "
          f"repeats={args.repeats} threads={torch.get_num_threads()} (wall clock, median)")
    print("\nEAGLE vs plain, by batch size\n" + curve[cols].round(3).to_string(index=False))
    print("\nevery drafter at batch 1\n" + at1[cols].round(3).to_string(index=False))
    if args.skip_hf:
        return

    k, n = args.k, args.max_new_tokens
    small_lm = drafters["small_lm"].model
    runs = {
        "hf generate": lambda: hf_batch1(policy, tok, prompts, n),
        "hf assisted (small LM)": lambda: hf_batch1(policy, tok, prompts, n,
                                                    assistant_model=small_lm),
        f"hf prompt lookup (k={k})": lambda: hf_batch1(policy, tok, prompts, n,
                                                       prompt_lookup_num_tokens=k),
    }
    for name in ("plain", "small_lm", "ngram", "eagle"):
        drafter = None if name == "plain" else drafters[name]
        runs[f"engine {name}"] = (lambda d=drafter: engine.rollout(
            prompts, RolloutConfig(max_new_tokens=n, max_batch_size=1, spec_k=k), drafter=d,
            progress=False).tokens)
    rows, reference = [], None
    for name, fn in runs.items():
        tokens, seconds = median_time(fn, args.repeats)
        tokens = [t[:t.index(tok.eos_token_id) + 1] if tok.eos_token_id in t else t
                  for t in tokens]
        reference = reference or tokens
        count = sum(len(t) for t in tokens)
        rows.append({"system": name, "tok_s": round(count / seconds, 1),
                     "same_tokens": tokens == reference})
    table = pd.DataFrame(rows)
    table["vs_hf_generate"] = (table["tok_s"] / table["tok_s"].iloc[0]).round(2)
    print("\nbatch 1, greedy\n" + table.to_string(index=False))


if __name__ == "__main__":
    main()
