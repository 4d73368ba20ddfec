"""Held-out greedy accuracy over continued supervised training of the default policy.

The yardstick for ``grpo_heldout.py``: the same policy, the same held-out problems, trained on
the worked references of RL-pool problems (``RL_SEED``) with the recipe's loss, batches and
AdamW (``workbench.zoo.policy``, ``workbench.lm_train``). Supervised training sees every correct token of every
problem; GRPO sees one exact-match bit per sampled response. How many steps it takes the
supervised signal to move held-out accuracy bounds what a short RL run can be expected to do.
Prints one JSON line per evaluation (every ``--every`` optimizer steps).

    python benchmarks/sft_heldout.py --steps 400 --every 100 --lr 5e-4
"""
from __future__ import annotations

import argparse
import json
import time

from common import add_result, record
from workbench.evaluate import evaluate_policy
from workbench.lm_train import final_loss, length_batches, lm_train_config, train_lm
from workbench.rl.setup import rl_setup
from workbench.zoo.policy import PolicyRecipe, encode_examples


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--problems", type=int, default=40_000, help="RL-pool problems to train on")
    ap.add_argument("--eval", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    add_result(ap)
    args = ap.parse_args()
    s = rl_setup(rl_problems=args.problems, eval_problems=args.eval)
    recipe = PolicyRecipe(seed=args.seed)
    examples = encode_examples(s.pool, s.tokenizer)
    batches = length_batches(examples, recipe.tokens_per_batch, seed=args.seed)

    accuracies = {}

    def accuracy(step: int):
        acc = evaluate_policy(s.policy, s.tokenizer, s.held_out, progress=False,
                              max_new_tokens=256).summary()["accuracy"]
        accuracies[f"accuracy_step{step}"] = {"value": float(acc)}
        return acc

    print(json.dumps({"step": 0, "accuracy": accuracy(0)}), flush=True)
    t0 = time.perf_counter()

    def on_step(trainer):
        if trainer.steps_done % args.every == 0:
            print(json.dumps({"step": trainer.steps_done, "accuracy": accuracy(trainer.steps_done),
                              "loss": final_loss(trainer, last=20),
                              "wall_s": round(time.perf_counter() - t0)}), flush=True)

    config = lm_train_config(recipe, recipe.weight_decay, horizon=args.steps, lr=args.lr,
                             warmup=args.warmup, progress=False, max_minutes=24 * 60)
    train_lm(s.policy, examples, batches, s.tokenizer.pad_token_id, config, on_step=on_step)
    record(args, f"Held-out greedy accuracy ({args.eval} problems) every {args.every} steps of "
           f"continued supervised training of the default policy on RL-pool references, "
           f"lr={args.lr:g}: the yardstick for grpo_heldout", accuracies, "none", None,
           headline=[list(accuracies)[-1]])


if __name__ == "__main__":
    main()
