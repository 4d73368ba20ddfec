"""Which width plans decode fast? Pruned students of the default policy at ~50% parameters
against the teacher, decode tokens/s side by side (``compress.evaluate.decode_throughput``:
every model decodes the same prompts once per repeat, the order rotating, each row to the same
number of tokens; ratio = median of the per-repeat ratios to the teacher, with its spread).

Plans: per number of query heads kept per KV group, the width plans nearest the parameter
target (``enumerate_plans``), plus a depth plan for reference. Weights come from random unit
scores: speed depends on the shapes only.

    python benchmarks/bench_prune_speed.py --batch-sizes 1 32 256 --repeats 3
"""
from __future__ import annotations

import argparse

import pandas as pd
import torch

from common import add_common, add_result, header, print_table, ratio_cells, record, sim_clock
from workbench.compress.evaluate import decode_throughput
from workbench.compress.importance import random_scores
from workbench.compress.plan import head_dim
from workbench.compress.prune import prune
from workbench.compress.search import enumerate_plans
from workbench.models import load_model


def plans(config, target: float, per_group: int) -> dict:
    table = enumerate_plans(config, target)
    chosen = {}
    for hpg in sorted(set(table["heads_per_group"]), reverse=True):
        rows = table[(table["kind"] == "width") & (table["heads_per_group"] == hpg)]
        for r in rows.head(per_group).itertuples():
            chosen[f"h{r.hidden_size} mlp{r.intermediate_size} heads{hpg * config.num_key_value_heads}"] = r
    depth = table[table["kind"] == "depth"]
    if len(depth):
        r = depth.iloc[0]
        chosen[f"depth {r.num_layers} layers"] = r
    return chosen


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=float, default=0.5)
    ap.add_argument("--per-group", type=int, default=2,
                    help="width plans per heads-per-group value, nearest the target")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--decode-tokens", type=int, default=64)
    add_common(ap, repeats=3)
    add_result(ap)
    args = ap.parse_args()
    torch.manual_seed(0)
    teacher, tok = load_model("default")
    chosen = plans(teacher.config, args.target, args.per_group)
    scores = random_scores(teacher, 0)
    models = {"teacher": teacher, **{n: prune(teacher, r.plan, scores) for n, r in chosen.items()}}
    print(header(ap, args, f"Decode tokens/s of ~{args.target:.0%} students against the teacher "
                           f"(head_dim {head_dim(teacher.config)} kept)"))
    speed = decode_throughput(models, tok, args.batch_sizes, args.decode_tokens, args.repeats,
                              progress=False)
    rows = []
    for r in speed.itertuples():
        if r.model == "teacher":
            continue
        plan = chosen[r.model]
        cells = ratio_cells({"ratio": r.ratio, "ratio_min": r.ratio_min, "ratio_max": r.ratio_max,
                             "spread": r.spread, "spread_wide": r.spread_wide})
        rows.append({"plan": r.model, "batch": r.batch,
                     "attention width": plan.heads_per_group * teacher.config.num_key_value_heads
                     * head_dim(teacher.config),
                     "params": f"{plan.params_ratio:.2f}", "FLOPs": f"{plan.flops_ratio:.2f}",
                     "ideal": f"{1 / plan.flops_ratio:.2f}", "tok/s": f"{r.tok_s:,.0f}",
                     "speedup": cells["ratio"], "min-max": cells["min-max"],
                     "spread": cells["spread"]})
    table = pd.DataFrame(rows).sort_values(["batch", "plan"], kind="stable")
    teacher_rows = speed[speed["model"] == "teacher"][["batch", "tok_s"]]
    print_table("Teacher tokens/s", teacher_rows.round(0))
    print_table("Students against the teacher", table,
                speed[speed["model"] != "teacher"]["spread_wide"], wide=args.wide)
    figures = {f"speedup_bs{r.batch}_{r.model.replace(' ', '_')}": {
        "value": r.ratio, "min": r.ratio_min, "max": r.ratio_max, "n": args.repeats, "unit": "x"}
        for r in speed.itertuples() if r.model != "teacher"}
    figures.update({f"teacher_tok_s_bs{r.batch}": {"value": r.tok_s, "n": args.repeats,
                                                    "unit": "tok/s"}
                    for r in teacher_rows.itertuples()})
    record(args, f"Which width plans decode fast? Decode tokens/s of ~{args.target:.0%} pruned "
           f"students over the teacher's (median of per-repeat ratios, engine clock) at batch "
           f"sizes {args.batch_sizes}, {args.decode_tokens} tokens", figures, sim_clock(), None,
           headline=[k for k in figures if k.startswith("speedup_")])


if __name__ == "__main__":
    main()
