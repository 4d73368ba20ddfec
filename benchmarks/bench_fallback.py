"""What TLT's adaptive engine costs where SD cannot pay: fallen back to plain, against plain.

A hostile machine (``SlowedDrafter``: every drafted depth waits ``--delay`` seconds, so no SD
step can beat a plain one). The adaptive engine (``AdaptiveSchedule``, plain an arm of every
bucket) first learns that on ``--learn`` rollouts; then it and plain decoding alternate inside
each repeat on the same shard of one worker (one prompt x G samples, as a worker of notebook
04 holds) with coupled sampling, so both emit the same tokens and their times differ by the
engine alone: the bandit's plan and observe on every decode step, the labels it writes, the
hidden states harvested for the spot trainer, and whatever exploring its budget still allows.
The ratio is plain's makespan over TLT's (engine clock, median of the per-repeat ratios).

    python benchmarks/bench_fallback.py --repeats 40 --warmup 2
"""
from __future__ import annotations

import argparse

import pandas as pd

from common import (add_common, add_result, disturbed_of, header, print_table, ratio_cells,
                    record, sim_clock)
from workbench.models import DEFAULT_EAGLE, load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative.bandit import AdaptiveSchedule
from workbench.speculative.drafters import EagleDrafter, SlowedDrafter
from workbench.speculative.eagle import EagleHead
from workbench.speedup import interleave, markdown, summarize
from workbench.tasks import HELDOUT_SEED, get_problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=8, help="G: requests of the worker's shard")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--delay", type=float, default=0.01, help="seconds per drafted depth")
    ap.add_argument("--learn", type=int, default=10, help="rollouts the engine learns on first")
    add_common(ap, repeats=40)
    add_result(ap)
    args = ap.parse_args()

    policy, tok = load_model("default")
    engine = RolloutEngine(policy, tok)
    drafter = SlowedDrafter(EagleDrafter(EagleHead.from_pretrained(DEFAULT_EAGLE, policy), policy),
                            args.delay)
    schedule = AdaptiveSchedule(seed=0)
    problems = get_problems("running_sum", args.repeats + args.warmup + args.learn,
                            seed=HELDOUT_SEED)
    print(header(ap, args, f"default policy + shipped EAGLE head slowed by {args.delay:g} s per "
                           f"depth, CPU float32, 1 worker x {args.samples} requests, T=1 coupled, "
                           f"max_new_tokens={args.max_new_tokens}"), flush=True)

    def config(i: int) -> RolloutConfig:
        return RolloutConfig(samples_per_prompt=args.samples, max_new_tokens=args.max_new_tokens,
                             temperature=1.0, spec_mode="coupled", seed=i)

    for i in range(args.learn):  # 1) the engine learns this machine: plain in every bucket
        engine.rollout([problems[i].prompt], config(i), progress=False, drafter=drafter,
                       schedule=schedule, rl_step=i, harvest=True)
    calls = {"plain": 0, "tlt": 0}

    def system(name: str):
        def run():  # 2) repeat r: both systems decode problem r (the same tokens)
            i = args.learn + calls[name]
            calls[name] += 1
            kw = dict(drafter=drafter, schedule=schedule) if name == "tlt" else {}
            return engine.rollout([problems[i].prompt], config(i), progress=False,
                                  rl_step=i, harvest=name == "tlt", **kw)
        return run

    runs = interleave({"plain": system("plain"), "tlt": system("tlt")}, args.repeats,
                      warmup=args.warmup, measure=lambda result, s: result.timeline.makespan_s)
    summary = summarize(runs, "plain", args.wide)
    steps = {name: pd.concat([r.timeline.steps for r in runs.outputs[name]]) for name in calls}
    rows = []
    for _, s in summary.iterrows():
        st = steps[s["system"]]
        decode = st[st["kind"] == "decode"]
        step_s = decode["end_s"] - decode["start_s"]
        rows.append({"system": s["system"], "makespan ms": f"{s['value'] * 1e3:.1f}",
                     "decode step us": f"{step_s.median() * 1e6:.0f}",
                     "outside forward us": f"{(step_s - decode['forward_s']).median() * 1e6:.0f}",
                     "SD steps": int((st["kind"] == "verify").sum()),
                     **ratio_cells(s, 3, baseline=s["system"] == "plain")})
    same = all(a.tokens == b.tokens for a, b in zip(runs.outputs["plain"], runs.outputs["tlt"]))
    print_table("Plain decoding vs TLT's engine fallen back to plain (ratio: plain's makespan "
                "over TLT's, above 1 = TLT faster)", pd.DataFrame(rows),
                summary["spread_wide"], args.wide, "systems")
    print(f"\nSame tokens in every repeat: {same}. What the engine learned:\n")
    print(markdown(schedule.learned()))
    by = summary.set_index("system")
    record(args, f"What does TLT's adaptive engine cost where SD cannot pay (drafter slowed "
           f"{args.delay:g} s per depth)? Plain makespan over TLT's fallen back to plain (median "
           f"of per-repeat ratios, engine clock), 1 worker x {args.samples} requests, T=1 "
           f"coupled, after {args.learn} learning rollouts",
           {"plain_over_tlt": figure_from_stats(by.loc["tlt"], "x"),
            **{f"{name}_makespan_ms": {"value": 1e3 * by.loc[name, "value"],
                                       "n": args.repeats, "unit": "ms"} for name in calls}},
           sim_clock(), disturbed_of(summary), headline=["plain_over_tlt"])


if __name__ == "__main__":
    main()
