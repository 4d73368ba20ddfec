"""Rollout engine vs HF ``generate``: greedy tokens/s at several batch sizes, side by side.

Same model, same prompts (default task, held-out seed, so lengths are long-tailed), same
greedy settings; both must produce identical tokens (checked in every repeat). At each batch
size the engine and HF alternate inside each of ``--repeats`` repeats (the order rotating), so
a busy period hits both; the ratio is the median of the per-repeat ratios (HF seconds over
engine seconds, i.e. engine tokens/s over HF tokens/s), printed with its min-max and relative
spread, flagged WIDE above ``--wide``. Tokens/s columns are tokens over the median wall
seconds. Also reports the engine's overhead: the share of decode-step wall time spent inside
the model's forward (median over repeats).

    python benchmarks/bench_engine.py --batch-sizes 1 8 32 --prompts 32 --repeats 5
"""
from __future__ import annotations

import argparse
import statistics

import pandas as pd
import torch

from common import add_common, add_result, disturbed_of, header, print_table, ratio_cells, record
from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speedup import interleave, summarize
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


def forward_share(steps) -> float:
    dec = steps[steps["kind"] == "decode"]
    return float(dec["forward_s"].sum() / (dec["end_s"] - dec["start_s"]).sum())


def measure(engine, model, tok, prompts, bs, args) -> tuple[dict, dict, pd.DataFrame]:
    """One batch size: engine and HF interleaved; a row of the printed table, the figures of
    the result file and the summary (its disturbed share)."""
    n = args.max_new_tokens
    runs = interleave({"engine": lambda: engine_generate(engine, prompts, bs, n),
                       "hf_generate": lambda: hf_generate(model, tok, prompts, bs, n)},
                      args.repeats, warmup=args.warmup)
    for r, ((tokens, _), ref) in enumerate(zip(runs.outputs["engine"],
                                               runs.outputs["hf_generate"])):
        if tokens != ref:
            raise SystemExit(f"batch {bs}, repeat {r}: engine and HF generate disagree")
    stats = summarize(runs, baseline="hf_generate", wide=args.wide).set_index("system")
    n_tokens = sum(len(t) for t in runs.outputs["engine"][0][0])
    shares = [forward_share(steps) for _, steps in runs.outputs["engine"]]
    figures = {f"ratio_bs{bs}": figure_from_stats(stats.loc["engine"], "x"),
               f"engine_tok_s_bs{bs}": {"value": n_tokens / stats.loc["engine", "value"],
                                        "n": args.repeats, "unit": "tok/s"},
               f"hf_tok_s_bs{bs}": {"value": n_tokens / stats.loc["hf_generate", "value"],
                                    "n": args.repeats, "unit": "tok/s"}}
    return {"batch size": bs, "tokens": n_tokens,
            "engine tok/s": f"{n_tokens / stats.loc['engine', 'value']:.1f}",
            "HF generate tok/s": f"{n_tokens / stats.loc['hf_generate', 'value']:.1f}",
            **ratio_cells(stats.loc["engine"]), "forward share": f"{statistics.median(shares):.1%}",
            "spread_wide": bool(stats.loc["engine", "spread_wide"])}, figures, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    add_common(ap, repeats=5)
    add_result(ap)
    args = ap.parse_args()

    model, tok = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    engine = RolloutEngine(model, tok)
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=HELDOUT_SEED)]
    rows, figures, summaries = [], {}, []
    for bs in args.batch_sizes:
        row, mine, stats = measure(engine, model, tok, prompts, bs, args)
        rows.append(row)
        figures.update(mine)
        summaries.append(stats)
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    print("\n" + header(ap, args, f"model={args.model} device={args.device} dtype={args.dtype} "
                        f"prompts={args.prompts} max_new_tokens={args.max_new_tokens}, greedy, "
                        "wall clock of this process"))
    print_table("Engine vs HF generate (same tokens, checked every repeat); ratio = engine "
                "tok/s over HF tok/s", table.drop(columns="spread_wide"), table["spread_wide"],
                args.wide, "batch sizes")
    record(args, f"Rollout engine vs HF generate, greedy, same tokens: engine tok/s over HF "
           f"tok/s (median of per-repeat ratios) at batch sizes {args.batch_sizes}, "
           f"{args.prompts} held-out prompts, max_new_tokens={args.max_new_tokens}, "
           f"{args.device} {args.dtype}", figures, "wall", disturbed_of(*summaries),
           headline=[f"ratio_bs{bs}" for bs in args.batch_sizes])


if __name__ == "__main__":
    main()
