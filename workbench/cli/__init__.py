"""``workbench`` command line (also ``python -m workbench``): one module per command group,
each adding its parser and handling its commands; this one builds the parser from them and
loads the plugins a command line names before the command runs."""
from __future__ import annotations

import argparse
import sys

from ..plugins import load_plugins
from . import ablation, diagnose, drafter, pipeline, results, timeline, zoo

__all__ = ["main"]

COMMAND_GROUPS = (zoo, drafter, ablation, pipeline, results, timeline, diagnose)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="``workbench`` command line "
                                "(also ``python -m workbench``).")
    p.add_argument("--plugins", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="a .py file or importable module that registers drafters, decoding "
                        "arms, RL variants or importance scores, loaded before the command "
                        "(repeatable; docs/extending.md). A pipeline's notebooks take theirs "
                        "as the 'plugins' parameter in its YAML")
    sub = p.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line, ``workbench ...`` (``python -m workbench ...``): parses ``argv``
    (by default the process's arguments), loads the plugins and runs the command; returns the
    exit status (2 for bad arguments)."""
    args = build_parser().parse_args(argv)
    try:
        load_plugins(args.plugins)
    except ValueError as exc:
        print(f"workbench: {exc}", file=sys.stderr)
        return 2
    return args.func(args)
