"""Drafter steps per RL step: every idle worker training (local SGD) against the first finisher.

Two TLT trainers of the ``adaptive_drafter`` variant (the static chain, the spot trainer on) run
notebook 04's settings (N workers on the sim clock, P x G requests, the default policy and its
shipped head) in lockstep, one RL step each in turn, the order alternating. Coupled sampling
makes their tokens, and so their policy updates, identical: the two differ only in the spot
trainer's rule, ``SpotConfig.idle_workers="all"`` against ``"first"``, and so in the drafter
that serves them. Per RL step: drafter steps (the ratio all / first is the issue's measure),
the workers that trained, and tau (acceptance length) of the drafter that served the step.

    python benchmarks/bench_spot_idle.py --steps 4
"""
from __future__ import annotations

import argparse

import pandas as pd

from common import add_result, command_line, record
from workbench.rl import GRPOConfig
from workbench.rl.setup import rl_setup
from workbench.rl.scaling import compare_idle_rules
from workbench.speedup import markdown


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="RL steps of each trainer")
    ap.add_argument("--workers", type=int, default=16, help="N (notebook 04: 16)")
    ap.add_argument("--prompts", type=int, default=16, help="P (notebook 04: 16)")
    ap.add_argument("--samples", type=int, default=8, help="G (notebook 04: 8)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    add_result(ap)
    args = ap.parse_args()
    print(f"Command:\n\n```bash\n{command_line(ap, args)}\n```\n", flush=True)

    s = rl_setup("default", "running_sum", 4000, 8, variants=["adaptive_drafter"])
    grpo = GRPOConfig.flat(prompts_per_step=args.prompts, samples_per_prompt=args.samples,
                           max_new_tokens=args.max_new_tokens, temperature=1.0,
                           workers=args.workers, spec_mode="coupled", seed=args.seed)
    table = compare_idle_rules(s.policy, s.tokenizer, s.pool, s.reward, s.drafter_head, grpo,
                               args.steps)
    wide = table.pivot(index="step", columns="rule")
    assert (wide["tokens_digest"]["first"] == wide["tokens_digest"]["all"]).all(), \
        "coupled sampling: both rules must decode the same tokens"
    out = pd.DataFrame({
        "drafter steps first": wide["drafter_steps"]["first"],
        "drafter steps all": wide["drafter_steps"]["all"],
        "all / first": wide["drafter_steps"]["all"] / wide["drafter_steps"]["first"].clip(lower=1),
        "workers training (all)": wide["drafter_workers"]["all"],
        "tau first": wide["accept_len"]["first"].round(3),
        "tau all": wide["accept_len"]["all"].round(3)})
    print(markdown(out.reset_index()))
    total = wide["drafter_steps"].sum()
    print(f"\ndrafter steps per RL step: first {total['first'] / args.steps:.1f}, "
          f"all {total['all'] / args.steps:.1f} ({total['all'] / max(1, total['first']):.1f}x); "
          f"tau over steps 1..{args.steps - 1} (served by a drafter the rule trained): first "
          f"{wide['accept_len']['first'].iloc[1:].mean():.3f}, all "
          f"{wide['accept_len']['all'].iloc[1:].mean():.3f}")
    figures = {"all_over_first": {"value": float(total["all"] / max(1, total["first"])),
                                  "n": args.steps, "unit": "x"}}
    for rule in ("first", "all"):
        steps, tau = wide["drafter_steps"][rule], wide["accept_len"][rule].iloc[1:]
        for name, v in ((f"drafter_steps_{rule}", steps), (f"tau_{rule}", tau)):
            figures[name] = {"value": float(v.mean()), "min": float(v.min()),
                             "max": float(v.max()), "n": len(v)}
    record(args, f"Drafter steps per RL step (mean) when every idle worker trains against the "
           f"first finisher only, and tau (mean over steps 1..{args.steps - 1}) of the drafter "
           f"each rule trained; {args.workers} workers, P={args.prompts} G={args.samples}, "
           f"sim clock, coupled", figures, "none", None,
           headline=["all_over_first", "tau_first", "tau_all"])


if __name__ == "__main__":
    main()
