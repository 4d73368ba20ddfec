"""Held-out greedy accuracy over a long baseline GRPO run (issue #9's accuracy target).

Runs GRPO on the default policy and task (the RL pool of notebook 04) and measures held-out
greedy accuracy on ``--eval`` problems every ``--every`` steps; prints one JSON line per step
(reward, KL to the start) and per evaluation. Resumable: the run checkpoints into ``--ckpt``
at every evaluation and continues from there when started again.

    python benchmarks/grpo_heldout.py --steps 100 --every 20 --lr 5e-4 --samples 16 --kl 0.05
"""
from __future__ import annotations

import argparse
import json
import time

from common import add_result, record
from workbench.evaluate import evaluate_policy
from workbench.rl import GRPO, GRPOConfig
from workbench.rl.setup import rl_setup
from workbench.rl.loop import RLLoop


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--kl", type=float, default=0.05)
    ap.add_argument("--minibatches", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--reward", default="exact")
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt", default="runs/grpo_heldout/state")
    add_result(ap)
    args = ap.parse_args()
    s = rl_setup(eval_problems=args.eval, reward=args.reward)
    cfg = GRPOConfig.flat(prompts_per_step=args.prompts, samples_per_prompt=args.samples,
                          max_new_tokens=args.max_new_tokens, lr=args.lr, kl_coef=args.kl,
                          minibatches=args.minibatches, epochs=args.epochs,
                          temperature=args.temperature, workers=16, seed=args.seed)
    grpo = RLLoop(GRPO(s.policy, s.tokenizer, s.pool, s.reward, cfg), checkpoint_dir=args.ckpt)

    accuracies = {}  # this run's evaluations (a resumed run's earlier ones are in its log)

    def accuracy():
        acc = evaluate_policy(grpo.model, s.tokenizer, s.held_out, progress=False,
                              max_new_tokens=args.max_new_tokens).summary()["accuracy"]
        accuracies[f"accuracy_step{grpo.rl_step}"] = {"value": float(acc)}
        return acc

    if grpo.rl_step == 0:
        print(json.dumps({"step": 0, "accuracy": accuracy()}), flush=True)
    t0 = time.perf_counter()
    while grpo.rl_step < args.steps:
        row = grpo.step()
        print(json.dumps({"step": grpo.rl_step, "reward": row["reward"],
                          "kl_start": row["kl_start"], "wall_s": time.perf_counter() - t0}),
              flush=True)
        if grpo.rl_step % args.every == 0:
            grpo.save_checkpoint(args.ckpt)
            print(json.dumps({"step": grpo.rl_step, "accuracy": accuracy()}), flush=True)
    if accuracies:
        record(args, f"Held-out greedy accuracy ({args.eval} problems) every {args.every} steps "
               f"of baseline GRPO, P={args.prompts} G={args.samples} lr={args.lr:g} "
               f"kl={args.kl:g}", accuracies, "none", None, headline=[list(accuracies)[-1]])


if __name__ == "__main__":
    main()
