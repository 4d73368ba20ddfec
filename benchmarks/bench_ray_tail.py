"""On Ray, does the drafter's training in the rollout's tail cost the RL step wall time?

Two TLT trainers share one local Ray of 2 actors (1 torch thread each): ``adaptive_drafter``
(the static chain; the spot trainer on: each actor whose shard has come back trains a copy of
the drafter while the other still decodes, stopped when the last shard comes back) and
``static_sd`` (the same chain and head, no drafter training). Coupled sampling gives both the
same tokens, so their policy updates are the same work: they differ in the drafter's training
in the tail (and in the drafter that serves them, which changes speed, not tokens). One RL step
each in turn, the order alternating; per step the driver's wall seconds of ``step()`` (rollout,
stop, merge and publish, update). The ratio static / adaptive per step, its median and spread:
1 means the training is free in wall time. Also per step: the tail (the first worker's idle
window: from its last rollout step to the step's last), the drafter's training seconds inside it, its steps, and the
driver's wait for the stopped jobs.

    python benchmarks/bench_ray_tail.py --steps 6
"""
from __future__ import annotations

import argparse
import copy
import time

import pandas as pd

from common import add_result, command_line, record
from workbench.provenance import figure_from_stats
from workbench.rl import GRPOConfig
from workbench.rl.setup import rl_setup
from workbench.rl.tlt import TLTTrainer
from workbench.rl.variants import tlt_config
from workbench.rollout import RayBackend
from workbench.speedup import markdown, spread_stats

VARIANTS = ("adaptive_drafter", "static_sd")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="RL steps of each trainer (>= 3)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    add_result(ap)
    args = ap.parse_args()
    print(f"Command:\n\n```bash\n{command_line(ap, args)}\n```\n", flush=True)

    s = rl_setup("default", "running_sum", 4000, 8, variants=["adaptive_drafter"])
    grpo = GRPOConfig.flat(prompts_per_step=args.prompts, samples_per_prompt=args.samples,
                           max_new_tokens=args.max_new_tokens, temperature=1.0, workers=2,
                           spec_mode="coupled", seed=args.seed)
    backend = RayBackend(num_cpus=2, threads_per_worker=1)
    trainers = {v: TLTTrainer(copy.deepcopy(s.policy), s.tokenizer, s.pool, s.reward,
                              tlt_config(v, grpo),
                              drafter_head=s.drafter_head, backend=backend)
                for v in VARIANTS}
    rows = []
    try:
        for step in range(args.steps):
            for v in VARIANTS if step % 2 == 0 else VARIANTS[::-1]:
                trainer = trainers[v]
                started = time.perf_counter()
                row = trainer.step()
                wall = time.perf_counter() - started
                windows = trainer.timelines[step].idle_windows()  # the first to finish first
                rows.append({"step": step, "variant": v, "wall_s": wall,
                             "tail_s": windows[0].seconds,
                             "drafter_train_s": row.get("drafter_train_s", 0.0),
                             "drafter_steps": row.get("drafter_steps", 0),
                             "stop_wait_s": row.get("drafter_stop_wait_s", 0.0),
                             "overrun_s": row.get("drafter_overrun_s", 0.0),
                             "tokens_digest": row["tokens_digest"]})
                print(rows[-1], flush=True)
    finally:
        for trainer in trainers.values():
            trainer.close()
        backend.close()
    table = pd.DataFrame(rows)
    wide = table.pivot(index="step", columns="variant")
    assert (wide["tokens_digest"][VARIANTS[0]] == wide["tokens_digest"][VARIANTS[1]]).all(), \
        "coupled sampling: both trainers must decode the same tokens"
    # step 0 warms the actors up (their first policy, the first jobs' heads): left out
    ratios = (wide["wall_s"]["static_sd"] / wide["wall_s"]["adaptive_drafter"]).iloc[1:]
    stats = spread_stats(ratios)
    spot = table[table["variant"] == "adaptive_drafter"].set_index("step")
    print(markdown(pd.DataFrame({
        "wall s, no training": wide["wall_s"]["static_sd"].round(3),
        "wall s, training in the tail": wide["wall_s"]["adaptive_drafter"].round(3),
        "tail s": spot["tail_s"].round(3), "drafter train s": spot["drafter_train_s"].round(3),
        "drafter steps": spot["drafter_steps"], "stop wait s": spot["stop_wait_s"].round(3),
        "overrun s": spot["overrun_s"].round(3)}).reset_index()))
    print(f"\nwall time, no training / training in the tail (steps 1..{args.steps - 1}): median "
          f"{stats['ratio']:.3f}, min-max {stats['ratio_min']:.3f}-{stats['ratio_max']:.3f}, "
          f"spread {stats['spread']:.0%}; drafter training inside the tail "
          f"{spot['drafter_train_s'].iloc[1:].sum():.2f} s of {spot['tail_s'].iloc[1:].sum():.2f} s")
    record(args, f"On Ray (2 actors x 1 thread), does the drafter's training in the rollout's "
           f"tail cost the RL step wall time? Static-SD step wall s over adaptive-drafter's "
           f"(median of per-step ratios, steps 1..{args.steps - 1}), P={args.prompts} "
           f"G={args.samples}, {args.max_new_tokens} tokens",
           {"static_over_adaptive": figure_from_stats(stats, "x"),
            "train_share_of_tail": {"value": float(spot["drafter_train_s"].iloc[1:].sum()
                                                   / spot["tail_s"].iloc[1:].sum()),
                                    "n": args.steps - 1}},
           "wall", None, headline=["static_over_adaptive"])


if __name__ == "__main__":
    main()
