"""What every benchmark script prints: the exact command line and markdown tables whose ratio
columns carry their spread (see ``workbench.speedup``)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch

from workbench.speedup import WIDE_SPREAD, markdown, spread_note


def command_line(ap: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command that reproduces this run, every option spelled out (defaults included)."""
    parts = [".venv/bin/python", f"benchmarks/{Path(sys.argv[0]).name}"]
    for action in ap._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest)
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            parts += [flag] if value else []
        elif isinstance(action, argparse.BooleanOptionalAction):  # --x / --no-x
            parts += [action.option_strings[0] if value else action.option_strings[1]]
        elif value is not None:
            values = value if isinstance(value, (list, tuple)) else [value]
            parts += [flag, *map(str, values)]
    return " ".join(shlex.quote(p) for p in parts)


def add_common(ap: argparse.ArgumentParser, repeats: int) -> None:
    """Options shared by the benchmarks: repeats, untimed warm-up rounds, spread threshold."""
    ap.add_argument("--repeats", type=int, default=repeats,
                    help="repeats (>= 3); the systems alternate inside each, order rotating")
    ap.add_argument("--warmup", type=int, default=0, help="untimed rounds before the repeats")
    ap.add_argument("--wide", type=float, default=WIDE_SPREAD,
                    help="(max-min)/median of the per-repeat ratios above this is flagged")


def ratio_cells(stats: dict, digits: int = 2, baseline: bool = False) -> dict:
    """The columns a ratio takes in a printed table: median, min-max, spread (with the flag);
    the baseline's own row reads "1 (baseline)" with empty spread cells."""
    if baseline:
        return {"ratio": "1 (baseline)", "min-max": "", "spread": ""}
    spread = f"{stats['spread']:.0%}" + (" WIDE" if stats["spread_wide"] else "")
    return {"ratio": f"{stats['ratio']:.{digits}f}",
            "min-max": f"{stats['ratio_min']:.{digits}f}-{stats['ratio_max']:.{digits}f}",
            "spread": spread}


def header(ap, args, what: str) -> str:
    """Machine and method line printed above the tables."""
    return (f"{what}; threads={torch.get_num_threads()}, torch {torch.__version__}; "
            f"systems alternate inside each of {args.repeats} repeats (order rotating), "
            f"ratio = median of the per-repeat ratios, min-max and spread = (max-min)/median, "
            f"WIDE above {args.wide:g}\n\nCommand:\n\n```bash\n{command_line(ap, args)}\n```")


def print_table(title: str, table: pd.DataFrame, flag: pd.Series | None = None,
                wide: float = WIDE_SPREAD, what: str = "rows") -> None:
    """A titled markdown table, then (when ``flag`` is given) the spread sentence."""
    print(f"\n{title}\n\n{markdown(table)}")
    if flag is not None:
        print("\n" + spread_note(pd.DataFrame({"spread_wide": flag}), wide=wide, what=what))
    sys.stdout.flush()
