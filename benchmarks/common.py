"""What every benchmark script prints: the exact command line and markdown tables whose ratio
columns carry their spread (see ``workbench.speedup``); and what it records: its result with
its provenance in ``benchmarks/results/<name>.json`` (``workbench.provenance``; ``add_result``
and ``record``), from which ``workbench results table`` regenerates ``RESULTS.md``."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch

from workbench.clock import DISTURBED_BELOW, sim_seconds_kind
from workbench.provenance import clock_of, disturbed, write_result
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


def tokens_agree(runs, a: str, b: str) -> float:
    """The share of requests whose tokens are equal in the first timed run of systems ``a``
    and ``b`` of ``runs`` (``speedup.interleave``'s, whose outputs are each rollout's tokens):
    two float32 paths may round a near-tie differently."""
    first, other = runs.outputs[a][0], runs.outputs[b][0]
    return sum(x == y for x, y in zip(first, other)) / len(first)


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


def add_result(ap: argparse.ArgumentParser) -> None:
    """``--result NAME`` (default: the script's stem) and ``--result-folder DIR`` (default:
    ``benchmarks/results``): where :func:`record` writes this run's result."""
    ap.add_argument("--result", default=Path(sys.argv[0]).stem,
                    help="the result's name: <result-folder>/<NAME>.json (default: the "
                    "script's stem)")
    ap.add_argument("--result-folder", default=None,
                    help="where the result file goes (default: benchmarks/results; a "
                    "temporary folder for a trial run)")
    ap.set_defaults(_parser=ap)


def record(args: argparse.Namespace, question: str, figures: dict, clock: str,
           disturbed_share: float | None, headline: list | None = None,
           name: str | None = None) -> Path:
    """Write this run's result (``workbench.provenance.write_result``) with the exact command
    line (every option spelled out, as the printed header gives it), this machine, the commit
    and the date; print where it went. ``figures``: ``{name: {"value", "min", "max", "n",
    ...}}`` (``workbench.provenance.figure_from_stats`` maps a ``spread_stats`` ratio);
    ``headline``: the figures RESULTS.md shows (default: all); ``name``: the result's name
    when a script answers a second question (default: ``--result``)."""
    path = write_result(name or args.result, question, figures, clock=clock,
                        disturbed_share=disturbed_share, command=command_line(args._parser, args),
                        folder=args.result_folder, headline=headline)
    print(f"\nResult: {path} (regenerate RESULTS.md with: .venv/bin/workbench results table)",
          flush=True)
    return path


def sim_clock() -> str:
    """The clock name (``workbench.provenance.CLOCKS``) of the sim-clock figures measured now:
    thread CPU time or wall time, as ``workbench.clock`` reads sim seconds in this scope."""
    return clock_of({"clock": "sim", "sim_seconds": sim_seconds_kind()})


def disturbed_of(*summaries: pd.DataFrame) -> float | None:
    """The disturbed share of runs timed by ``workbench.speedup.interleave``: the share of
    their repeats that stayed disturbed (``summarize``'s ``disturbed_share``, the same for
    every system of one run), averaged over ``summaries``; None where none measured it."""
    shares = [float(s["disturbed_share"].iloc[0]) for s in summaries
              if "disturbed_share" in s and len(s) and pd.notna(s["disturbed_share"].iloc[0])]
    return sum(shares) / len(shares) if shares else None


class CpuShares:
    """The CPU share of each call timed outside ``interleave`` (which measures its own): the
    share of a core it got, as ``workbench.clock.usage_probe("wall")`` and ``cpu_share`` read
    it (the process's CPU seconds over wall seconds). ``wrap(fn)`` times
    every call of ``fn``; ``disturbed()`` is the share of calls under ``bound``."""

    def __init__(self):
        self.shares: list[float] = []

    def wrap(self, fn):
        from workbench.clock import cpu_share, usage_probe
        probe = usage_probe("wall")

        def timed(*a, **kw):
            before = probe()
            out = fn(*a, **kw)
            self.shares.append(cpu_share(before, probe()))
            return out
        return timed

    def disturbed(self, bound: float = DISTURBED_BELOW) -> float | None:
        return disturbed(self.shares, bound)
