"""``workbench`` command line (also ``python -m workbench``)."""
from __future__ import annotations

import argparse
import sys


def _zoo_train(args) -> int:
    from .zoo import RECIPES
    if args.name not in RECIPES:
        print(f"unknown zoo recipe {args.name!r}; accepted: {sorted(RECIPES)}", file=sys.stderr)
        return 2
    RECIPES[args.name](out_dir=args.out, seed=args.seed, minutes=args.minutes)
    return 0


def _pipeline_report(args) -> int:
    """Exit 0 with the report written, 2 when the folder holds no pipeline results."""
    from .report import write_report
    try:
        path = write_report(args.folder, args.out)
    except FileNotFoundError as exc:
        print(f"workbench pipeline report: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def _pipeline_run(args) -> int:
    """Exit 0 when every run is ok, 1 when a run failed (recorded in its run.json), 2 for a
    pipeline that cannot run as written (one message, nothing run or written)."""
    from .pipeline import PipelineError, run_pipeline
    try:
        table = run_pipeline(args.yaml, redo=args.redo, runs_root=args.runs_root)
    except PipelineError as exc:
        print(f"workbench pipeline run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench pipeline run: interrupted; finished runs are kept and rerunning "
              "resumes from them", file=sys.stderr)
        return 130
    return 0 if (table["status"] == "ok").all() else 1


def _positive_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"minutes must be a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    zoo = sub.add_parser("zoo", help="build the embedded models from their seeded recipes")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    zt = zsub.add_parser("train", help="train a zoo model")
    zt.add_argument("name", help="recipe name, e.g. 'default'")
    zt.add_argument("--out", default=None, help="output folder (default: the recipe's data/ path)")
    zt.add_argument("--seed", type=int, default=0)
    zt.add_argument("--minutes", type=_positive_minutes, default=None,
                    help="wall-clock budget; the recipe's own default when omitted")
    zt.set_defaults(func=_zoo_train)

    pipe = sub.add_parser("pipeline", help="run notebook pipelines with papermill")
    psub = pipe.add_subparsers(dest="pipeline_command", required=True)
    pr = psub.add_parser("run", help="run every notebook x parameter set of a pipeline YAML")
    pr.add_argument("yaml", help="pipeline file, e.g. pipelines/quickstart.yaml")
    pr.add_argument("--redo", action="store_true", help="rerun runs that already finished")
    pr.add_argument("--runs-root", default="runs", help="where runs/<pipeline>/<run>/ go")
    pr.set_defaults(func=_pipeline_run)
    rp = psub.add_parser("report", help="write one static HTML page of a pipeline's runs")
    rp.add_argument("folder", help="the pipeline's run folder, e.g. runs/quickstart")
    rp.add_argument("--out", default=None, help="HTML file (default: <folder>/report.html)")
    rp.set_defaults(func=_pipeline_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
