"""The suffix drafter beside the sibling drafter and EAGLE, on a GRPO-like second step.

Every prompt is rolled out once (``G`` samples at temperature 1: the "earlier step" whose
responses the sibling and suffix drafters remember), then the timed rollout is the next RL
step of the same prompts (another ``rl_step``, so other draws), coupled sampling at
temperature 1: every system emits the same tokens (checked). At batch sizes 1 and 16 the
systems alternate inside each repeat, order rotating: plain decoding, EAGLE (chain of k),
sibling (chain of k), suffix (chain of k) and suffix with DAS's length-aware budget
(``suffix:k_max=<k_max>``). Speedup = median of the per-repeat ratios of wall seconds to
plain's, with min-max and spread; tau = tokens emitted per verify step.

    python benchmarks/bench_suffix.py --prompts 4 --samples 4 --repeats 3
"""
from __future__ import annotations

import argparse

import pandas as pd
import torch

from common import add_common, add_result, disturbed_of, header, print_table, ratio_cells, record
from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule
from workbench.rollout.schedule import Schedule
from workbench.speculative import SiblingDrafter, SuffixDrafter
from workbench.speculative.bandit import parse_strategy
from workbench.speculative.defaults import default_drafters
from workbench.speculative.measure import acceptance_length
from workbench.speedup import interleave, summarize
from workbench.tasks import HELDOUT_SEED, get_problems


class Always(Schedule):
    """Every step one plan (here the budgeted suffix arm's)."""

    def __init__(self, strategy: str):
        self.step = parse_strategy(strategy)
        self.drafter_names = frozenset({self.step.drafter} - {None})

    def plan(self, batch_size: int, worker: int):
        return self.step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4, help="G: samples per prompt")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--k-max", type=int, default=8, help="the budgeted arm's most drafts")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    add_common(ap, repeats=3)
    add_result(ap)
    args = ap.parse_args()

    policy, tok = load_model("default", dtype=torch.float32)
    engine = RolloutEngine(policy, tok)
    eagle = default_drafters(policy, tok, names=("eagle",))["eagle"]
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=HELDOUT_SEED)]
    sibling, suffix, budgeted = SiblingDrafter(), SuffixDrafter(), SuffixDrafter()
    print(header(ap, args, f"default policy, cpu float32, prompts={args.prompts} "
                           f"G={args.samples} k={args.k} k_max={args.k_max} "
                           f"max_new_tokens={args.max_new_tokens}, wall clock"), flush=True)
    rows, figures, summaries = [], {}, []
    for bs in args.batch_sizes:
        cfg = RolloutConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0,
                            samples_per_prompt=args.samples, max_batch_size=bs)
        earlier = engine.rollout(prompts, cfg, progress=False)  # the step before
        for d in (sibling, suffix, budgeted):
            d.memory.clear()
            d.remember_result(earlier)

        def run(drafter=None, schedule=None):
            return engine.rollout(prompts, cfg, progress=False, drafter=drafter,
                                  schedule=schedule, rl_step=1)
        chain = StaticSchedule(args.k)
        systems = {"plain": lambda: run(),
                   f"eagle k={args.k}": lambda: run(eagle, chain),
                   f"sibling k={args.k}": lambda: run(sibling, chain),
                   f"suffix k={args.k}": lambda: run(suffix, chain),
                   f"suffix:k_max={args.k_max}": lambda: run(
                       budgeted, Always(f"suffix:k_max={args.k_max}"))}
        runs = interleave(systems, args.repeats, warmup=args.warmup)
        stats = summarize(runs, wide=args.wide).set_index("system")
        summaries.append(stats)
        reference = runs.outputs["plain"][0].tokens
        for i, name in enumerate(systems):
            outs = runs.outputs[name]
            key = name.replace(" ", "_").replace(":", "_").replace("=", "")
            if i:
                figures[f"speedup_bs{bs}_{key}"] = figure_from_stats(stats.loc[name], "x")
                figures[f"tau_bs{bs}_{key}"] = {"value": float(acceptance_length(outs[0]))}
            rows.append({"batch": bs, "system": name,
                         "tau": "" if not i else f"{acceptance_length(outs[0]):.2f}",
                         "s": f"{stats.loc[name, 'value']:.2f}",
                         **{("speedup" if c == "ratio" else c): v for c, v in
                            ratio_cells(stats.loc[name], baseline=i == 0).items()},
                         "same tokens": all(o.tokens == reference for o in outs),
                         "spread_wide": bool(stats.loc[name, "spread_wide"])})
    table = pd.DataFrame(rows)
    print_table("Speedup over plain decoding, the step after the remembered one (wall clock; "
                "median of per-repeat ratios)", table.drop(columns="spread_wide"),
                table["spread_wide"], args.wide, "systems")
    record(args, f"The suffix drafter (chain of k={args.k}, and DAS's budget up to "
           f"k_max={args.k_max}) beside the sibling drafter and EAGLE: speedup over plain "
           f"decoding at batch sizes {args.batch_sizes} on the RL step after a remembered one "
           f"({args.prompts} held-out prompts x G={args.samples}, temperature 1, coupled)",
           figures, "wall", disturbed_of(*[s.reset_index() for s in summaries]),
           headline=[k for k in figures if k.startswith("speedup_")])


if __name__ == "__main__":
    main()
