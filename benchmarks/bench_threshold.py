"""Where does SD stop paying on this machine? EAGLE speedup against batch size: what the
adaptive engine learns per bucket by itself (``AdaptiveSchedule.learned``), measured here
side by side.

``sd_sweep`` at each batch size with its own prompt set of ``--prompts-per-row`` x batch
prompts (at least ``--min-prompts``) under continuous batching, so the live batch stays at
its cap for most of the run instead of decaying through a single wave's tail; plain decoding
and EAGLE at k draft tokens alternate inside each repeat. The speedup is the median of the
per-repeat tokens/s ratios (engine clock), with min-max and spread. The threshold is
``speculative.whatif.measured_threshold`` at each temperature: the largest batch size up to
which SD paid at every measured batch size.

    python benchmarks/bench_threshold.py --batch-sizes 1 4 16 32 64 128 256 --repeats 3 --warmup 1
"""
from __future__ import annotations

import argparse

import pandas as pd

from bench_spec import sweep_figures, sweep_table
from common import add_common, add_result, header, print_table, record, sim_clock
from workbench.models import load_model
from workbench.rollout import RolloutEngine
from workbench.speculative.defaults import default_drafters
from workbench.speculative.sweep import sd_sweep
from workbench.speculative.whatif import measured_threshold
from workbench.speedup import markdown
from workbench.tasks import HELDOUT_SEED, get_problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+",
                    default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--prompts-per-row", type=int, default=4)
    ap.add_argument("--min-prompts", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    add_common(ap, repeats=5)
    add_result(ap)
    args = ap.parse_args()

    policy, tok = load_model("default")
    engine = RolloutEngine(policy, tok)
    eagle = default_drafters(policy, tok, names=("eagle",))
    print(header(ap, args, f"default policy + shipped EAGLE head, CPU float32, k={args.k}, "
                           f"max_new_tokens={args.max_new_tokens}"), flush=True)
    for _ in range(args.warmup):  # the first cell of a process runs cold otherwise
        warm = [p.prompt for p in get_problems("running_sum", args.min_prompts, seed=HELDOUT_SEED)]
        engine.rollout(warm, max_new_tokens=args.max_new_tokens, progress=False)
        engine.rollout(warm, max_new_tokens=args.max_new_tokens, drafter=eagle["eagle"],
                       spec_k=args.k, progress=False)
    tables = []
    for bs in args.batch_sizes:
        n = max(args.min_prompts, args.prompts_per_row * bs)
        prompts = [p.prompt for p in get_problems("running_sum", n, seed=HELDOUT_SEED)]
        tables.append(sd_sweep(engine, prompts, eagle, ks=[args.k], batch_sizes=[bs],
                               temperatures=[0.0, 1.0], repeats=args.repeats,
                               max_new_tokens=args.max_new_tokens, progress=False,
                               wide=args.wide).assign(prompts=n))
        print(markdown(sweep_table(tables[-1])), flush=True)  # as it goes: a long run
    curve = pd.concat(tables, ignore_index=True).sort_values(["temperature", "batch_size"])
    print_table("EAGLE vs plain decoding, by batch size (engine clock, median of per-repeat "
                "tokens/s ratios)", sweep_table(curve), curve["spread_wide"], args.wide,
                "configurations")
    thresholds = {}
    for t in sorted(curve["temperature"].unique()):
        threshold = measured_threshold(curve, "eagle", args.k, t)
        thresholds[f"threshold_t{t:g}"] = {"value": threshold, "unit": "batch"}
        print(f"\nT = {t}: SD paid at every measured batch up to {threshold} (0: at none)")
    record(args, f"Where does SD stop paying on this machine? The largest batch size up to which "
           f"EAGLE (k={args.k}) beat plain decoding at every measured batch size "
           f"{args.batch_sizes}, greedy and T=1, and the speedups (median of per-repeat tokens/s "
           f"ratios, engine clock)", {**thresholds, **sweep_figures(curve)}, sim_clock(), None,
           headline=list(thresholds))


if __name__ == "__main__":
    main()
