"""Minitron's headline at our scale (issue #25, item 6): the default policy's 50% student,
distilled at 1%, 3% and 10% of the teacher's pretraining tokens, against the same
architecture from scratch at the same budgets, over seeds, greedy accuracy on held-out problems
with bootstrap intervals (``workbench.compress.budget``).

The student: the width plan notebook 05's architecture search ranked best at 50% of the
parameters (hidden 176, MLP 320, all 8 heads, every layer: RESULTS.md, ``minitron_issue10``), built
with ``PrunePlan.for_model`` and filled by activation importance (L2/mean, 256 calibration
texts). Every run: peak lr 1e-3, warm-up then cosine to a tenth, the best held-out evaluation
kept. Resumable: rerun the same command and the rows already in ``<out>/budget.csv`` are kept.

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/minitron_budget.py \
        --out runs/minitron_budget --seeds 0 1 2 --budgets 0.01 0.03 0.1 --eval-problems 400
"""
from __future__ import annotations

import argparse
import json

from common import add_result, command_line, print_table, record
from workbench import viz
from workbench.compress.budget import budget_study
from workbench.compress.budget_summary import budget_summary
from workbench.compress.distill import DistillConfig
from workbench.compress.importance import calibration_batches, importance_from_batches
from workbench.compress.plan import PrunePlan, param_count
from workbench.compress.prune import prune
from workbench.models import load_model, resolve_model_path
from workbench.results import prepare_out_dir, write_metrics, write_table
from workbench.tasks import HELDOUT_SEED, get_problems
from workbench.viz import compress as cviz


def parse() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/minitron_budget", help="output folder")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.01, 0.03, 0.1],
                    help="fractions of the teacher's pretraining tokens")
    ap.add_argument("--eval-problems", type=int, default=400, help="held-out problems")
    ap.add_argument("--model", default="default", help="the teacher")
    ap.add_argument("--hidden", type=int, default=176, help="the student's hidden size")
    ap.add_argument("--mlp", type=int, default=320, help="the student's MLP size")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak lr of every run")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    add_result(ap)
    return ap, ap.parse_args()


def main():
    ap, args = parse()
    out = prepare_out_dir(args.out)
    teacher, tokenizer = load_model(args.model, device="cpu")
    plan = PrunePlan.for_model(teacher, hidden_size=args.hidden, intermediate_size=args.mlp)
    calibration = calibration_batches(tokenizer, num=256, max_len=256)
    student = prune(teacher, plan, importance_from_batches(teacher, calibration,
                                                           progress=False).scores)
    problems = get_problems("running_sum", args.eval_problems, seed=HELDOUT_SEED)
    config = DistillConfig.flat(lr=args.lr, progress=False)
    table = budget_study(teacher, student, tokenizer, problems, out / "budget.csv",
                         args.budgets, args.seeds, teacher_dir=resolve_model_path(args.model),
                         config=config, max_new_tokens=args.max_new_tokens, progress=False)
    summary, headline = budget_summary(table)
    write_table(summary, out / "summary.csv")
    label = (f"student {plan} ({param_count(student.config):,} of "
             f"{param_count(teacher.config):,} params); seeds {args.seeds}; "
             f"{len(problems)} held-out problems")
    viz.save_figure(cviz.budget_curves(summary, headline["teacher_accuracy"], label=label),
                    out / "accuracy_vs_budget.png")
    write_metrics(out, headline)
    print(command_line(ap, args))
    print(label)
    print_table("accuracy per method and budget (mean over seeds, two-level bootstrap 95%)",
                summary)
    print(json.dumps(headline, indent=2))
    figures = {"teacher_accuracy": {"value": headline["teacher_accuracy"]},
               **{f"accuracy_{r.method}_b{r.budget_fraction:g}": {"value": r.accuracy,
                                                                  "n": int(r.seeds)}
                  for r in summary.itertuples()}}
    record(args, f"Minitron at our scale: held-out greedy accuracy ({len(problems)} problems, "
           f"mean over seeds {args.seeds}) of the {plan} student distilled (kd) and from "
           f"scratch at {args.budgets} of the teacher's pretraining tokens", figures, "none",
           None)


if __name__ == "__main__":
    main()
