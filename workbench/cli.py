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


def _pipeline_run(args) -> int:
    from .pipeline import run_pipeline
    table = run_pipeline(args.yaml, redo=args.redo, runs_root=args.runs_root)
    return 0 if (table["status"] == "ok").all() else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    zoo = sub.add_parser("zoo", help="build the embedded models from their seeded recipes")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    zt = zsub.add_parser("train", help="train a zoo model")
    zt.add_argument("name", help="recipe name, e.g. 'default'")
    zt.add_argument("--out", default=None, help="output folder (default: the recipe's data/ path)")
    zt.add_argument("--seed", type=int, default=0)
    zt.add_argument("--minutes", type=float, default=None,
                    help="wall-clock budget; the recipe's own default when omitted")
    zt.set_defaults(func=_zoo_train)

    pipe = sub.add_parser("pipeline", help="run notebook pipelines with papermill")
    psub = pipe.add_subparsers(dest="pipeline_command", required=True)
    pr = psub.add_parser("run", help="run every notebook x parameter set of a pipeline YAML")
    pr.add_argument("yaml", help="pipeline file, e.g. pipelines/quickstart.yaml")
    pr.add_argument("--redo", action="store_true", help="rerun runs that already finished")
    pr.add_argument("--runs-root", default="runs", help="where runs/<pipeline>/<run>/ go")
    pr.set_defaults(func=_pipeline_run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
