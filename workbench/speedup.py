"""Side-by-side timing that survives a busy machine (docs/design.md, "Measures": *SD speedup*).

Systems under comparison alternate inside each repeat, and the order rotates between repeats,
so a busy period (another job on the same cores) hits every system rather than one. A
comparison is the **median of the per-repeat ratios** against a baseline, reported with its
spread: the smallest and largest per-repeat ratio and the relative spread
``(max - min) / median``. A relative spread above ``wide`` (default :data:`WIDE_SPREAD`,
0.25) sets ``spread_wide``: the figure is not trustworthy, and tables and printouts say so.

Typical use::

    runs = interleave({"plain": run_plain, "fast": run_fast}, repeats=5)
    table = summarize(runs, baseline="plain")     # one row per system
    print(markdown(table)); print(spread_note(table))

A system is a callable of no arguments. What is compared per repeat is its *measure*: by
default the wall seconds of the call (lower is better); pass ``measure=fn(output, seconds)``
to use something the call returns instead, e.g. a rollout's makespan, or a rate such as
tokens/s with ``higher_is_better=True``. Ratios are always oriented so that above 1 means
"better than the baseline": baseline/system for times, system/baseline for rates.

A busy machine is also *seen*: each call's CPU share (``workbench.clock.cpu_share``: the
process's CPU seconds over the call's wall seconds) is recorded, a repeat in which any call got
less than ``clock.DISTURBED_BELOW`` of a core is run again, up to ``redo`` times, and one still
disturbed then is kept and flagged (``disturbed``); :func:`summarize` gives each system's
``disturbed_share``, the share of its repeats that stayed disturbed.

This module imports nothing else from workbench but the foundation's checks and clock, so
every layer may use it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping

import numpy as np
import pandas as pd

from .checks import check_choice, check_int, check_positive
from .clock import DISTURBED_BELOW, cpu_share, usage_probe

__all__ = ["WIDE_SPREAD", "interleave", "summarize", "disturbed_share", "compare", "spread_note",
           "markdown"]

WIDE_SPREAD = 0.25  # (max - min) / median of the per-repeat ratios above this is "wide"
"""A spread ((max - min) / median of the per-repeat ratios) above this is wide."""
MIN_REPEATS = 3     # a median of fewer ratios says nothing about the spread
ORDERS = ("rotate", "alternate", "fixed")


@dataclass
class Runs:
    """What :func:`interleave` measured.

    ``table``: one row per run, columns ``repeat`` (0-based), ``slot`` (position inside the
    repeat), ``system``, ``seconds`` (wall time of the call), ``value`` (its measure),
    ``cpu_share`` (the share of a core the call got), ``disturbed`` (its repeat stayed
    disturbed after every redo) and ``redone`` (how often its repeat ran again).
    ``outputs[system]``: what each call returned, one entry per repeat in repeat order.
    ``higher_is_better``: how ``value`` reads (False: a time; True: a rate).
    """

    table: pd.DataFrame
    outputs: dict = field(default_factory=dict)
    higher_is_better: bool = False


def check_repeats(repeats) -> int:
    """``repeats`` as an int, or ValueError naming it unless it is an integer >=
    :data:`MIN_REPEATS`: a median of fewer per-repeat ratios says nothing about its spread."""
    return check_int("repeats", repeats, MIN_REPEATS)


def run_order(names: list, repeat: int, order: str = "rotate") -> list:
    """The systems' order inside repeat ``repeat``.

    ``rotate``: repeat r starts at system r mod n (A B C, B C A, C A B, ...); with two systems
    it alternates. ``alternate``: forward, then backward (A B C, C B A, ...). ``fixed``: the
    same order every repeat (still interleaved, but the same neighbour always goes first).
    """
    check_choice("order", order, ORDERS)
    names = list(names)
    if order == "rotate":
        r = repeat % len(names) if names else 0
        return names[r:] + names[:r]
    if order == "alternate" and repeat % 2:
        return names[::-1]
    return names


def interleave(systems: Mapping[Hashable, Callable[[], Any]], repeats: int = MIN_REPEATS, *,
               measure: Callable[[Any, float], float] | None = None,
               higher_is_better: bool = False, order: str = "rotate", warmup: int = 0,
               clock: Callable[[], float] = time.perf_counter,
               on_run: Callable[[Hashable, int], None] | None = None, redo: int = 2,
               usage: Callable[[], tuple[float, float]] | None = None) -> Runs:
    """Run every system once per repeat, in the order :func:`run_order` gives, ``repeats`` times.

    ``measure(output, seconds)`` turns a call into its measure (default: the wall seconds).
    ``warmup`` untimed rounds run first (lazy initialisation, caches), in the same order.
    ``clock`` is the timer (a fake one in tests). ``on_run(system, repeat)`` is called after
    each timed run (a progress bar). A repeat with a disturbed call runs again, at most
    ``redo`` times (module docstring); ``usage`` reads ``(CPU s, wall s)`` (default: this
    process's, ``clock.usage_probe("wall")``; a double in tests). Raises ValueError for fewer
    than 3 repeats, no systems, an unknown order, a negative ``redo`` or a measure that is
    not a positive finite number.
    """
    check_repeats(repeats)
    if not systems:
        raise ValueError("interleave needs at least one system")
    check_int("warmup", warmup, 0)
    check_int("redo", redo, 0)
    names = list(systems)
    run_order(names, 0, order)  # validates order before anything runs
    usage = usage if usage is not None else usage_probe("wall")
    for w in range(warmup):
        for name in run_order(names, w, order):
            systems[name]()
    rows, outputs = [], {name: [] for name in names}
    for r in range(repeats):
        for redone in range(redo + 1):
            runs = [_run_one(systems[name], name, r, slot, clock, usage, measure)
                    for slot, name in enumerate(run_order(names, r, order))]
            disturbed = any(row["cpu_share"] < DISTURBED_BELOW for row, _ in runs)
            if not disturbed or redone == redo:
                break
        for row, out in runs:
            rows.append({**row, "disturbed": disturbed, "redone": redone})
            outputs[row["system"]].append(out)
            if on_run is not None:
                on_run(row["system"], r)
    table = pd.DataFrame(rows, columns=["repeat", "slot", "system", "seconds", "value",
                                        "cpu_share", "disturbed", "redone"])
    return Runs(table, outputs, higher_is_better)


def _run_one(system: Callable[[], Any], name: Hashable, repeat: int, slot: int,
             clock: Callable[[], float], usage: Callable[[], tuple[float, float]],
             measure: Callable[[Any, float], float] | None) -> tuple[dict, Any]:
    """One timed call of ``system``: its row (seconds, measure, CPU share) and its output."""
    used, start = usage(), clock()
    out = system()
    seconds, share = clock() - start, cpu_share(used, usage())
    value = check_positive(f"system {name!r}, repeat {repeat}: the measure", seconds
                           if measure is None else measure(out, seconds))
    return {"repeat": repeat, "slot": slot, "system": name, "seconds": seconds,
            "value": value, "cpu_share": share}, out


def per_repeat_ratios(runs: Runs, baseline: Hashable) -> pd.DataFrame:
    """Per repeat and system, the ratio to the baseline of the same repeat (above 1 = better):
    one row per (repeat, system), columns ``repeat``, ``system``, ``value``, ``ratio``."""
    t = runs.table
    if baseline not in set(t["system"]):
        raise ValueError(f"baseline {baseline!r} is not a system; systems: "
                         f"{list(dict.fromkeys(t['system']))}")
    base = t[t["system"] == baseline].set_index("repeat")["value"]
    out = t[["repeat", "system", "value"]].copy()
    b = out["repeat"].map(base).to_numpy(float)
    v = out["value"].to_numpy(float)
    out["ratio"] = v / b if runs.higher_is_better else b / v
    return out.reset_index(drop=True)


def spread_stats(ratios, wide: float = WIDE_SPREAD) -> dict:
    """``{ratio, ratio_min, ratio_max, spread, spread_wide, repeats}`` of per-repeat ratios:
    their median, extremes, relative spread (max - min) / median, and whether it exceeds
    ``wide``."""
    r = np.asarray(list(ratios), dtype=float)
    if r.size == 0:
        raise ValueError("no ratios to summarise")
    med = float(np.median(r))
    spread = float((r.max() - r.min()) / med) if med else float("inf")
    return {"ratio": med, "ratio_min": float(r.min()), "ratio_max": float(r.max()),
            "spread": spread, "spread_wide": bool(spread > wide), "repeats": int(r.size)}


def disturbed_share(runs: Runs) -> float:
    """The share of ``runs``' repeats that stayed disturbed after every redo (a repeat is
    disturbed as a whole: :func:`interleave`); NaN for runs recorded without the flag."""
    if "disturbed" not in runs.table:
        return float("nan")
    return float(runs.table.groupby("repeat")["disturbed"].any().mean())


def summarize(runs: Runs, baseline: Hashable | None = None,
              wide: float = WIDE_SPREAD) -> pd.DataFrame:
    """One row per system (in the order given to :func:`interleave`): ``system``, ``value``
    (the median measure), ``ratio`` (median of the per-repeat ratios to ``baseline``, the first
    system by default), ``ratio_min``, ``ratio_max``, ``spread`` ((max - min) / median),
    ``spread_wide`` (spread > ``wide``), ``repeats`` and ``disturbed_share`` (the share of
    its repeats that stayed disturbed; NaN for runs recorded without it). The baseline's own
    row has ratio 1."""
    check_positive("wide", wide)
    names = list(runs.outputs) or list(dict.fromkeys(runs.table["system"]))
    baseline = names[0] if baseline is None else baseline
    ratios = per_repeat_ratios(runs, baseline)
    disturbed = runs.table.groupby("system")["disturbed"].mean() \
        if "disturbed" in runs.table else {}
    rows = []
    for name in names:
        mine = ratios[ratios["system"] == name]
        rows.append({"system": name, "value": float(mine["value"].median()),
                     **spread_stats(mine["ratio"], wide),
                     "disturbed_share": float(disturbed.get(name, float("nan")))})
    return pd.DataFrame(rows)


def compare(systems: Mapping[Hashable, Callable[[], Any]], repeats: int = MIN_REPEATS, *,
            baseline: Hashable | None = None, wide: float = WIDE_SPREAD,
            **interleave_kw) -> tuple[pd.DataFrame, Runs]:
    """:func:`interleave` then :func:`summarize`: ``(summary table, runs)``."""
    runs = interleave(systems, repeats, **interleave_kw)
    return summarize(runs, baseline, wide), runs


def spread_note(table: pd.DataFrame, flag: str = "spread_wide", wide: float = WIDE_SPREAD,
                what: str = "rows") -> str:
    """A sentence for the printout: how many ``what`` have a wide spread, or that none has."""
    if flag not in table.columns:
        raise ValueError(f"no {flag!r} column; columns: {list(table.columns)}")
    n = int(table[flag].fillna(False).astype(bool).sum())
    if n == 0:
        return (f"Spread: every per-repeat ratio lies within {wide:.0%} of its median "
                f"((max-min)/median <= {wide:g}).")
    return (f"WIDE SPREAD in {n} of {len(table)} {what}: (max-min)/median of the per-repeat "
            f"ratios exceeds {wide:g}. The machine was probably busy; rerun before quoting "
            "these figures.")


def markdown(table: pd.DataFrame, floatfmt: str = ".2f") -> str:
    """A GitHub markdown table (no extra dependency): floats with ``floatfmt``, booleans as
    yes/no, missing values empty."""
    def cell(v):
        if isinstance(v, (bool, np.bool_)):
            return "yes" if v else "no"
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return ""
        if isinstance(v, (float, np.floating)):
            return format(float(v), floatfmt)
        return str(v)

    head = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "---|" * len(table.columns)
    body = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in table.itertuples(index=False)]
    return "\n".join([head, rule, *body])
