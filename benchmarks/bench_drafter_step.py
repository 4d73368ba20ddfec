"""The overhead of one spot-trainer drafter step: a training session per step against steps
taken inside one session.

The spot trainer trains the EAGLE head one optimizer step at a time, checking between steps
whether the next one still fits the idle window. Two ways to take those steps, on the same
head, pairs and optimizer settings:

* ``train(steps=1)``: ``EagleTrainer.train(steps=1)`` per step, the way the spot trainer took
  them: every call is a whole ``Trainer.run`` (batch source check, a progress bar, the
  policy's and head's flags set and restored, the history table rebuilt and sliced);
* ``step()``: ``with trainer.training():`` once, then ``EagleTrainer.step()`` per step
  (exactly one optimizer step; the flags are set once for the session).

Each system trains its own copy of the shipped head (``DEFAULT_EAGLE``) of the default policy
on the pairs of one rollout run with ``harvest=True`` (``--prompts`` prompts, ``--samples``
responses each, temperature 1), with the spot trainer's settings (constant LR, no horizon,
batch ``--batch-size``). A repeat times ``--steps`` steps of each system, the order rotating;
the figure is the median of the per-repeat ratios ``train(steps=1)`` seconds / ``step()``
seconds, with its min-max and spread, flagged WIDE above ``--wide``. Both systems take the
same steps on the same batches, so their heads end equal (checked and printed).

    python benchmarks/bench_drafter_step.py --steps 20 --repeats 5
"""
from __future__ import annotations

import argparse
import copy

import pandas as pd
import torch

from common import add_common, add_result, disturbed_of, header, print_table, ratio_cells, record
from workbench.models import DEFAULT_EAGLE, load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative.eagle import EagleHead
from workbench.speculative.train import EagleTrainConfig, EagleTrainer, harvest_pairs
from workbench.speedup import interleave, summarize
from workbench.tasks import RL_SEED, get_problems

SYSTEMS = ("train(steps=1)", "step()")  # baseline first: the ratio reads old / new seconds


def harvested_pairs(policy, tok, args) -> list:
    """The pairs of one RL-like rollout of the default policy (what the spot trainer reads)."""
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=RL_SEED)]
    cfg = RolloutConfig(max_new_tokens=args.max_new_tokens, temperature=1.0,
                        samples_per_prompt=args.samples, seed=args.seed)
    return harvest_pairs(RolloutEngine(policy, tok).rollout(prompts, cfg, progress=False,
                                                            harvest=True))


def drafter_trainers(policy, pairs, args) -> dict:
    """One EagleTrainer per system, each on its own copy of the shipped head."""
    config = EagleTrainConfig.flat(horizon=None, schedule="constant", lr=args.lr,
                                   batch_size=args.batch_size, checkpoint_every=0,
                                   seed=args.seed)
    shipped = EagleHead.from_pretrained(DEFAULT_EAGLE, policy)
    trainers = {}
    for name in SYSTEMS:
        trainer = EagleTrainer(policy, copy.deepcopy(shipped).requires_grad_(True), config)
        trainer.set_pairs(pairs)
        trainers[name] = trainer
    return trainers


def systems(trainers: dict, steps: int) -> dict:
    """Each system takes ``steps`` drafter steps per call."""
    old, new = trainers[SYSTEMS[0]], trainers[SYSTEMS[1]]

    def one_run_per_step():
        for _ in range(steps):
            old.train(steps=1)

    def steps_in_one_session():
        with new.training():
            for _ in range(steps):
                new.step()

    return {SYSTEMS[0]: one_run_per_step, SYSTEMS[1]: steps_in_one_session}


def table(stats: pd.DataFrame, steps: int) -> pd.DataFrame:
    rows = []
    for i, r in enumerate(stats.itertuples()):
        rows.append({"system": r.system, "ms per drafter step": f"{1e3 * r.value / steps:.2f}",
                     **{("speedup" if k == "ratio" else k): v
                        for k, v in ratio_cells(r._asdict(), baseline=i == 0).items()}})
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="drafter steps per system and repeat")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16, help="sequences per drafter step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    add_common(ap, repeats=5)
    add_result(ap)
    args = ap.parse_args()

    policy, tok = load_model("default", device="cpu")
    pairs = harvested_pairs(policy, tok, args)
    trainers = drafter_trainers(policy, pairs, args)
    print(header(ap, args, f"EAGLE head of the default policy, {len(pairs)} harvested "
                           f"sequences, batch {args.batch_size}, {args.steps} drafter steps "
                           "per system and repeat"), flush=True)
    runs = interleave(systems(trainers, args.steps), args.repeats, warmup=args.warmup)
    stats = summarize(runs, baseline=SYSTEMS[0], wide=args.wide)
    print_table("One drafter step: a session per step vs steps in one session (wall clock; "
                "speedup = median of per-repeat ratios)", table(stats, args.steps),
                stats["spread_wide"], args.wide, "systems")
    heads = [t.head.state_dict() for t in trainers.values()]
    same = all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])
    steps = {name: t.steps_done for name, t in trainers.items()}
    print(f"\nsteps taken {steps}; same head weights after them: {same}")
    by = stats.set_index("system")
    record(args, f"A spot-trainer drafter step: train(steps=1) per step over steps in one "
           f"session, wall seconds (median of per-repeat ratios), {args.steps} steps of batch "
           f"{args.batch_size} per repeat", {
               "speedup": figure_from_stats(by.loc[SYSTEMS[1]], "x"),
               **{f"{key}_ms_per_step": {"value": 1e3 * by.loc[name, "value"] / args.steps,
                                         "n": args.repeats, "unit": "ms"}
                  for key, name in zip(("train1", "step"), SYSTEMS)}},
           "wall", disturbed_of(stats), headline=["speedup"])


if __name__ == "__main__":
    main()
