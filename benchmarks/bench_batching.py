"""Continuous batching vs waves: the makespan of one worker's long-tailed shard, side by side.

One worker decodes a shard of ``--requests`` prompts of the default task (long-tailed response
lengths) with ``max_batch_size=--max-batch-size``, greedy by default. ``waves``: each wave of
``max_batch_size`` requests runs until its last row finishes. ``continuous``: the slot of a
finished row is refilled at once by the next waiting request, so the batch stays full until
the queue empties. The two alternate inside each of ``--repeats`` repeats (the order
rotating); the figure is the median of the per-repeat makespan ratios waves/continuous (on the
engine's clock), with min-max and spread, flagged WIDE above ``--wide``. Both must produce the
same tokens (checked in every repeat). Also printed: tokens/s of each (tokens over the median
makespan) and the time-weighted mean batch size of their decode steps.

    python benchmarks/bench_batching.py --requests 128 --max-batch-size 32 --repeats 7
"""
from __future__ import annotations

import argparse
import dataclasses

import pandas as pd
import torch

from common import (add_common, add_result, disturbed_of, header, print_table, ratio_cells,
                    record, sim_clock)
from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speedup import interleave, summarize
from workbench.tasks import get_problems

MODES = ("waves", "continuous")  # baseline first


def require_batching() -> None:
    """Exit with a clear message when this engine has no ``RolloutConfig.batching``."""
    if "batching" not in {f.name for f in dataclasses.fields(RolloutConfig)}:
        raise SystemExit(
            "bench_batching: RolloutConfig has no `batching` field, so this engine cannot run "
            "batching='continuous' against batching='waves'. The benchmark needs the "
            "continuous-batching engine (issue 8, item 1: `RolloutConfig(batching=...)`); run "
            "it from a checkout that has it.")


def mean_batch(steps: pd.DataFrame) -> float:
    """Time-weighted mean batch size of the decode steps (plain or verify)."""
    dec = steps[steps["kind"].isin(["decode", "verify"])]
    dur = dec["end_s"] - dec["start_s"]
    return float((dec["batch_size"] * dur).sum() / dur.sum()) if len(dec) else float("nan")


def configs(args) -> dict:
    base = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                seed=args.seed, max_batch_size=args.max_batch_size, workers=1)
    return {mode: RolloutConfig(**base, batching=mode) for mode in MODES}


def check_same_tokens(runs) -> bool:
    """Every repeat of both systems gave the same tokens; exits naming the first mismatch."""
    reference = runs.outputs[MODES[0]][0].tokens
    for mode in MODES:
        for r, res in enumerate(runs.outputs[mode]):
            if res.tokens != reference:
                raise SystemExit(f"{mode}, repeat {r}: tokens differ from waves, repeat 0")
    return True


def table_of(runs, stats: pd.DataFrame, args) -> pd.DataFrame:
    tokens = sum(len(t) for t in runs.outputs[MODES[0]][0].tokens)
    rows = []
    for mode in MODES:
        s = stats.loc[mode]
        batch = pd.Series([mean_batch(r.timeline.steps) for r in runs.outputs[mode]]).median()
        rows.append({"batching": mode, "requests": args.requests, "tokens": tokens,
                     "makespan s": f"{s['value']:.2f}", "tok/s": f"{tokens / s['value']:.1f}",
                     "mean decode batch": f"{batch:.1f}",
                     **{("waves / continuous" if c == "ratio" else c): v
                        for c, v in ratio_cells(s, baseline=mode == MODES[0]).items()},
                     "same tokens": check_same_tokens(runs),
                     "spread_wide": bool(s["spread_wide"])})
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", default="running_sum")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 = greedy; above 0 coupled sampling (still the same tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    add_common(ap, repeats=7)
    add_result(ap)
    args = ap.parse_args()
    require_batching()
    cfgs = configs(args)  # validates before the model loads

    model, tok = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    engine = RolloutEngine(model, tok)
    prompts = [p.prompt for p in get_problems(args.task, args.requests)]
    runs = interleave({mode: (lambda c=cfgs[mode]: engine.rollout(prompts, c, progress=False))
                       for mode in MODES}, args.repeats, warmup=args.warmup,
                      measure=lambda res, seconds: res.timeline.makespan_s)
    stats = summarize(runs, baseline=MODES[0], wide=args.wide).set_index("system")
    table = table_of(runs, stats, args)
    print(header(ap, args, f"model={args.model} task={args.task} one worker, "
                           f"max_batch_size={args.max_batch_size} "
                           f"max_new_tokens={args.max_new_tokens} "
                           f"temperature={args.temperature:g}, makespan on the engine's "
                           f"{runs.outputs[MODES[0]][0].timeline.clock} clock"))
    print_table("Continuous batching vs waves (same tokens, checked every repeat); ratio = "
                "waves makespan over continuous makespan", table.drop(columns="spread_wide"),
                table["spread_wide"].iloc[1:], args.wide, "comparisons")
    tokens = sum(len(t) for t in runs.outputs[MODES[0]][0].tokens)
    record(args, f"Continuous batching vs waves on one worker, same tokens: waves makespan over "
           f"continuous (median of per-repeat ratios, engine clock), {args.requests} requests, "
           f"max_batch_size={args.max_batch_size}, max_new_tokens={args.max_new_tokens}, "
           f"temperature={args.temperature:g}",
           {"waves_over_continuous": figure_from_stats(stats.loc["continuous"], "x"),
            **{f"{mode}_tok_s": {"value": tokens / stats.loc[mode, "value"],
                                 "n": args.repeats, "unit": "tok/s"} for mode in MODES}},
           sim_clock(), disturbed_of(stats), headline=["waves_over_continuous"])


if __name__ == "__main__":
    main()
