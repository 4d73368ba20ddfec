"""Which peak learning rate should distillation's warm-up + cosine schedule default to? A
short sweep: width-pruned students of the default policy near the teacher (70%) and further
from it (50%), each the width plan near its target with the lowest held-out loss right after
pruning (``architecture_search``'s first ranking, as notebook 05 picks), each distilled by
logit KD at every peak lr over several seeds (the seed orders the batches,
``data.seeded_order``, as the notebooks' studies do), on the same data as notebooks 05-07
(``compress_setup``).

Per (target, lr): the held-out LM loss before KD, of the last weights (what the schedule alone
gives: ``keep_best=False``'s result) and of the weights a run keeps (the best evaluation,
restored at the horizon), each as mean and sd over the seeds, and how often the last weights
ended worse than the start. The default lr (RESULTS.md, ``distill_peak_lr``) is the one with the lowest
mean kept loss at both targets; a near-teacher student must never end worse than it started.

    python benchmarks/bench_distill_lr.py --lrs 1e-4 3e-4 1e-3 3e-3 --targets 0.7 0.5 --seeds 0 1 2

Each run's row goes to ``--out`` (a csv, rewritten atomically after every run) as it ends, and
a sweep started again with the same ``--out`` skips the (target, lr, seed) rows it holds: the
24 runs take longer than a session on a shared machine.
"""
from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pandas as pd
import torch

from common import add_result, command_line, print_table, record
from workbench.compress.data import seeded_order
from workbench.compress.distill import DistillConfig, Distiller
from workbench.compress.importance import importance_from_batches
from workbench.compress.prune import prune
from workbench.compress.studies import architecture_search
from workbench.compress.setup import compress_setup
from workbench.results import write_table


def one_run(setup, student, lr: float, seed: int, args) -> dict:
    """Distil a copy of ``student`` once; the losses the sweep reports."""
    config = DistillConfig.flat(horizon=args.steps, batch_size=args.batch_size, lr=lr,
                                seed=seed, eval_every=args.eval_every, progress=False)
    distiller = Distiller(copy.deepcopy(student), setup.teacher,
                          seeded_order(setup.train, seed), config, setup.held_out)
    distiller.run()
    evals = distiller.evals
    return {"start": evals["eval_loss"].iloc[0], "last": evals["eval_loss"].iloc[-1],
            "kept": evals.loc[evals["best"], "eval_loss"].iloc[0],
            "kept_step": distiller.restored}


def best_pruned_plan(setup, target: float, scores):
    """The width plan near ``target`` with the lowest held-out LM loss right after pruning."""
    search = architecture_search(setup.teacher, target, setup.calibration, setup.train,
                                 setup.held_out, top=1, kinds=("width",), scores=scores,
                                 config=DistillConfig.flat(horizon=1, progress=False),
                                 progress=False)
    best = search.sort_values("loss_pruned").iloc[0]
    print(f"target {target:g}: {best['plan']}, {best['params_ratio']:.2f} of the parameters, "
          f"held-out LM loss after pruning {best['loss_pruned']:.4f}", flush=True)
    return best["plan"]


def summary(runs: pd.DataFrame, teacher_loss: float) -> pd.DataFrame:
    """One row per (target, lr): mean and sd of the losses over the seeds."""
    rows = []
    for (target, lr), part in runs.groupby(["target", "lr"], sort=True):
        rows.append({"target": target, "lr": f"{lr:g}", "seeds": len(part),
                     "start - teacher": f"{part['start'].mean() - teacher_loss:+.4f}",
                     "last": f"{part['last'].mean():.4f} ± {part['last'].std(ddof=1):.4f}",
                     "kept": f"{part['kept'].mean():.4f} ± {part['kept'].std(ddof=1):.4f}",
                     "last worse than start": f"{int((part['last'] > part['start']).sum())}"
                                              f"/{len(part)}",
                     "kept steps": ",".join(map(str, part["kept_step"]))})
    return pd.DataFrame(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3, 3e-3])
    ap.add_argument("--targets", type=float, nargs="+", default=[0.7, 0.5])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default="runs/distill_lr2.csv",
                    help="the runs' rows, kept as they end; rows already there are not rerun")
    add_result(ap)
    args = ap.parse_args()
    torch.manual_seed(0)
    setup = compress_setup("default", batch_size=args.batch_size)
    scores = importance_from_batches(setup.teacher, setup.calibration, progress=False).scores
    print(f"Distillation peak-lr sweep: logit KD, warm-up then cosine, {args.steps} steps x "
          f"{args.batch_size} texts; teacher held-out LM loss {setup.teacher_loss:.4f}; "
          f"threads={torch.get_num_threads()}, torch {torch.__version__}\n\nCommand:\n\n"
          f"```bash\n{command_line(ap, args)}\n```")
    out = Path(args.out)
    rows = pd.read_csv(out).to_dict("records") if out.is_file() else []
    done = {(r["target"], r["lr"], r["seed"]) for r in rows}
    for target in args.targets:
        student = prune(setup.teacher, best_pruned_plan(setup, target, scores), scores)
        for lr in args.lrs:
            for seed in args.seeds:
                if (target, lr, seed) in done:
                    continue
                rows.append({"target": target, "lr": lr, "seed": seed,
                             **one_run(setup, student, lr, seed, args)})
                write_table(pd.DataFrame(rows), out)
    print_table("Held-out LM loss (nats) by target and peak lr, mean ± sd over seeds",
                summary(pd.DataFrame(rows), setup.teacher_loss))
    figures = {f"{which}_t{target:g}_lr{lr:g}": {
        "value": float(part[which].mean()), "min": float(part[which].min()),
        "max": float(part[which].max()), "n": len(part), "unit": "nats"}
        for (target, lr), part in pd.DataFrame(rows).groupby(["target", "lr"])
        for which in ("kept", "last")}
    record(args, f"Which peak lr should distillation default to? Held-out LM loss (mean over "
           f"seeds {args.seeds}, with their range) of the kept and the last weights of "
           f"{args.steps}-step logit KD of width-pruned students at targets {args.targets}, by "
           f"peak lr; teacher {setup.teacher_loss:.4f}", figures, "none", None,
           headline=[k for k in figures if k.startswith("kept_")])


if __name__ == "__main__":
    main()
