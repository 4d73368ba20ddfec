"""Does a drafter go stale during RL? The staleness run at the lead GRPO setting (issue #22).

One GRPO trajectory of the default policy on running sums (P 16 x G 16, 256 tokens, T 1,
lr 5e-4, k3 KL 0.05 to the start, 16 workers, exact-match reward: RESULTS.md,
``grpo_heldout_400``), with every drafter of ``workbench.rl.staleness`` measured on each step's own
rollout (``--measure-groups`` groups decoded again, coupled, k ``--spec-k``). Prints one JSON
line per step. Resumable: the run checkpoints into ``--out``/checkpoint every
``--checkpoint-every`` steps and goes on from there when started again with the same
options. At the end ``--out`` holds history.csv, positions.csv, evals.csv, byproduct.csv
(adaptive against frozen, final policy, ``--probe`` held-out prompts), sibling_speedups.csv
(batch 1 and 32, interleaved with plain decoding) and metrics.json.

``--split`` runs it on two cores (``workbench.rl.staleness.split``): the trajectory (GRPO) in
one process and the drafters' measuring and training in another, each on one thread, side by
side, the trajectory at most ``--max-ahead`` steps ahead (its observations spooled in
``--out``/spool); each checkpoints into ``--out``/trajectory and ``--out``/observer and
resumes from there. Its outputs are the one-process run's (the same rows, wall seconds aside);
a failure of either process stops both.

``--drafters`` measures a subset (the by-product needs frozen and adaptive, the speedups the
sibling drafter; what a run lacks is left out of its outputs): a rerun of the adaptive drafter
against the frozen one skips the ceiling's and the sibling's hours.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/staleness_run.py --steps 400 --out runs/staleness
    .venv/bin/python benchmarks/staleness_run.py --split --steps 400 --out runs/staleness
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from workbench.adapt import SpotConfig
from workbench.provenance import figures_from_metrics
from workbench.results import prepare_out_dir, write_metrics, write_table
from workbench.rl import GRPOConfig
from workbench.rl.staleness.run import DRAFTERS, StalenessConfig, staleness_setup
from workbench.rl.staleness.drafters import CeilingConfig
from workbench.rl.staleness.split import (clear_for_resume, run_side_by_side, split_setup,
                                          split_state)
from workbench.rl.staleness.spool import Spool
from workbench.rl.staleness.report import (FinalConfig, byproduct, sibling_speedups,
                                           staleness_metrics)

from common import add_result, command_line, record, sim_clock


def parse() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", default="runs/staleness")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--kl", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spec-k", type=int, default=4)
    ap.add_argument("--measure-groups", type=int, default=4)
    ap.add_argument("--history-steps", type=int, default=4,
                    help="the adaptive drafter's buffer: the last steps' whole harvests")
    ap.add_argument("--ceiling-max-steps", type=int, default=400)
    ap.add_argument("--eval", type=int, default=400, help="held-out problems")
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--probe", type=int, default=64,
                    help="held-out prompts of the by-product measure")
    ap.add_argument("--speedup-groups", type=int, default=2,
                    help="the sibling drafter's speedup: prompt groups of the next step")
    ap.add_argument("--repeats", type=int, default=3, help="the speedup's repeats (>= 3)")
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS,
                    help="the drafters measured (default: all)")
    ap.add_argument("--split", action="store_true",
                    help="two processes on two cores: the trajectory and the drafters")
    ap.add_argument("--max-ahead", type=int, default=2,
                    help="--split: steps the trajectory may run ahead of the drafters")
    add_result(ap)
    return ap, ap.parse_args()


def logger(t0: float, process: str | None = None):
    """One JSON line per step's row (of ``process``, under --split)."""
    def log(row):
        keys = ["step", "reward", "kl_start", *[k for k in row if k.startswith("tau_")],
                "adaptive_steps", "ceiling_steps", "measure_s", "learn_s"]
        tag = {} if process is None else {"process": process}
        print(json.dumps({**tag, **{k: row[k] for k in keys if k in row},
                          "wall_s": time.perf_counter() - t0}), flush=True)
    return log


def split_process(role: str, args: argparse.Namespace, config: StalenessConfig) -> None:
    """The ``role`` process of --split, on one thread (spawned: ``run_side_by_side``)."""
    torch.set_num_threads(1)
    out = Path(args.out)
    process = split_setup(role, config, Spool(out / "spool", args.max_ahead), out / role,
                          eval_problems=args.eval)
    process.run_to(args.steps, on_step=logger(time.perf_counter(), role))


def run_split(args: argparse.Namespace, config: StalenessConfig):
    """--split: both processes side by side, then the one-process run they make."""
    # --max-ahead checked before they start; a stopped run's observations after the
    # trajectory's checkpoint go (they are written anew)
    out = Path(args.out)
    clear_for_resume(Spool(out / "spool", args.max_ahead), out / "trajectory")
    run_side_by_side({role: (split_process, (role, args, config))
                      for role in ("trajectory", "observer")})
    run = staleness_setup(config, eval_problems=args.eval)
    run.load_state_dict(split_state(out / "trajectory", out / "observer"), str(out))
    return run


def main():
    ap, args = parse()
    final = FinalConfig(probe_prompts=args.probe, speedup_groups=args.speedup_groups,
                        speedup_repeats=args.repeats)  # checked before the model loads
    out = prepare_out_dir(args.out)
    print(command_line(ap, args), flush=True)
    grpo = GRPOConfig.flat(prompts_per_step=args.prompts, samples_per_prompt=args.samples,
                           max_new_tokens=args.max_new_tokens, temperature=1.0, lr=args.lr,
                           kl_coef=args.kl, workers=args.workers, seed=args.seed)
    config = StalenessConfig(grpo=grpo, spot=SpotConfig(history_steps=args.history_steps),
                             ceiling=CeilingConfig(max_steps=args.ceiling_max_steps),
                             spec_k=args.spec_k, measure_groups=args.measure_groups,
                             drafters=tuple(args.drafters),
                             eval_every=args.eval_every,
                             checkpoint_every=args.checkpoint_every)
    t0 = time.perf_counter()
    if args.split:
        run = run_split(args, config)
        history, start = run.history, None
    else:
        run = staleness_setup(config, eval_problems=args.eval,
                              checkpoint_dir=Path(args.out) / "checkpoint")
        start = run.rl_step
        history = run.run_to(args.steps, progress=False, on_step=logger(t0))
    print(json.dumps({"steps_run": None if start is None else run.rl_step - start,
                      "wall_s": time.perf_counter() - t0}), flush=True)
    table = byproduct(run, final) if {"frozen", "adaptive"} <= set(args.drafters) else None
    speedups = sibling_speedups(run, final) if "sibling" in args.drafters else None
    for name, frame in (("history", history), ("positions", run.positions),
                        ("evals", run.evals), ("byproduct", table),
                        ("sibling_speedups", speedups)):
        if frame is not None:
            write_table(frame, out / f"{name}.csv")
    metrics = staleness_metrics(history, run.evals, table, speedups, grpo.rollout.temperature)
    write_metrics(out, {**metrics, "threads": torch.get_num_threads(),
                        "processes": 2 if args.split else 1})
    print(json.dumps(metrics), flush=True)
    drift = [k for d in args.drafters for k in (f"tau_{d}_first", f"tau_{d}_final",
                                                 f"tau_{d}_change") if k in metrics]
    record(args, f"Does a drafter go stale during RL? tau (means of the first and last "
           f"{metrics['tau_window']} of {metrics['rl_steps']} steps, and their change) of the "
           f"drafters {args.drafters} on each step's own rollout, k={args.spec_k}",
           figures_from_metrics(metrics, [k for k in (*drift, "byproduct_gain", "accuracy_start",
                                                      "accuracy_final") if k in metrics]),
           "none", None, headline=[k for k in drift if k.endswith("_change")])
    if speedups is not None:  # times on the engine clock: a result of their own
        record(args, "The sibling drafter's SD speedup over plain decoding after the run (median "
               "of per-repeat ratios, engine clock), and its tau", figures_from_metrics(
                   metrics, [f"sibling_{m}_bs{r.batch_size}" for r in speedups.itertuples()
                             for m in ("speedup", "tau")]),
               sim_clock(), None, name=f"{args.result}_sibling")


if __name__ == "__main__":
    main()
