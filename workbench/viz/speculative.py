"""Figures of a speculative-decoding sweep: where SD pays, how close it gets to its bound, and why.

Every function takes the table of :func:`workbench.speculative.sweep.sd_sweep` (one row per
temperature, batch size, drafter and k), so a sweep redraws from its saved table without an
engine. Each draws on ``ax`` when given (a figure is created only when it is not) and returns
the figure. Measures follow docs/design.md, "Measures": tau is shown with its k (legend) and
temperature (title); every time axis names its clock.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from .timeline import _axes

__all__ = ["speedup_vs_batch", "acceptance_vs_batch", "sd_time_breakdown"]

CLOCK = "wall"  # sd_sweep times one process on its own wall clock
COLUMNS = ("temperature", "batch_size", "drafter", "k", "speedup", "bound", "tau", "T1", "Td", "Tv")
K_MARKERS = "osD^v<>p"


def _check(table):
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"expected an sd_sweep table; missing columns {missing} "
                         f"(got {list(table.columns)})")


def _temperature_title(temperature) -> str:
    """'temperature 0 (greedy)' or 'temperature 1': greedy is the case SD must reproduce exactly."""
    return f"temperature {temperature:g}" + (" (greedy)" if temperature == 0 else "")


def _pick(table, column, value):
    """Rows with ``column == value``; a clear error naming the values present otherwise."""
    rows = table[table[column] == value]
    if rows.empty:
        raise ValueError(f"no rows with {column}={value!r}; present: "
                         f"{sorted(table[column].unique().tolist())}")
    return rows


def _panels(table, ax, temperature, figsize=(5.2, 4.2)):
    """(figure, [(temperature, axes, rows)]): one panel per temperature unless one is chosen.

    ``ax`` may be one Axes (one temperature) or a sequence with one Axes per temperature.
    """
    _check(table)
    temps = [temperature] if temperature is not None else sorted(table["temperature"].unique())
    if ax is None:
        fig, axes = plt.subplots(1, len(temps), figsize=(figsize[0] * len(temps), figsize[1]),
                                 sharey=True, layout="constrained", squeeze=False)
        axes = list(axes[0])
    else:
        axes = list(np.atleast_1d(ax))
        fig = axes[0].figure
    if len(axes) != len(temps):
        raise ValueError(f"{len(temps)} temperatures {temps} need as many axes, got {len(axes)} "
                         "(pass temperature=... to draw one)")
    return fig, [(t, a, _pick(table, "temperature", t)) for t, a in zip(temps, axes)]


def _styles(table) -> dict:
    """Colour and marker of each (drafter, k), the same in every panel and figure of one table."""
    pairs = sorted(set(zip(table["drafter"], table["k"])))
    ks = sorted(table["k"].unique())
    return {(d, k): {"color": f"C{i % 10}", "marker": K_MARKERS[ks.index(k) % len(K_MARKERS)]}
            for i, (d, k) in enumerate(pairs)}


def _batch_axis(ax, batch_sizes):
    """Batch size on a log2 axis, ticks at the batch sizes measured (no others)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(batch_sizes))
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch size")


def _per_drafter(ax, rows, column, styles, gid):
    """One solid line+markers per (drafter, k) of ``column`` against batch size; its x values."""
    for (drafter, k), r in rows.groupby(["drafter", "k"], sort=True):
        r = r.sort_values("batch_size")
        ax.plot(r["batch_size"], r[column], "-", linewidth=1.8, markersize=6,
                label=f"{drafter} k={k}", gid=f"{gid}-{drafter}-k{k}", **styles[(drafter, k)])
    return sorted(rows["batch_size"].unique())


def _spread(ax, rows, styles) -> list:
    """Error bars from ``speedup_min`` to ``speedup_max`` (the per-repeat ratios of an
    interleaved sweep) and a red ring on each point whose spread is wide; the legend handles
    that explain them (none for a table without spread columns)."""
    if not {"speedup_min", "speedup_max"} <= set(rows.columns):
        return []
    handles = [Line2D([], [], color="gray", marker="|", linestyle="-",
                      label="min-max of the per-repeat ratios")]
    for (drafter, k), r in rows.groupby(["drafter", "k"], sort=True):
        r = r.sort_values("batch_size")
        y = r["speedup"].to_numpy(float)
        err = [y - r["speedup_min"].to_numpy(float), r["speedup_max"].to_numpy(float) - y]
        bars = ax.errorbar(r["batch_size"], y, yerr=err, fmt="none", capsize=3, linewidth=1.0,
                           ecolor=styles[(drafter, k)]["color"], label=f"_spread {drafter}")
        bars.lines[2][0].set_gid(f"spread-{drafter}-k{k}")
        wide = r[r["spread_wide"].astype(bool)] if "spread_wide" in r else r[:0]
        if len(wide):
            ax.plot(wide["batch_size"], wide["speedup"], "o", markersize=13, fillstyle="none",
                    color="red", linestyle="none", gid=f"wide-{drafter}-k{k}",
                    label=f"_wide {drafter} k={k}")
    if "spread_wide" in rows and rows["spread_wide"].astype(bool).any():
        handles.append(Line2D([], [], color="red", marker="o", fillstyle="none",
                              linestyle="none", label="wide spread: rerun on a quiet machine"))
    return handles


def speedup_vs_batch(table, ax=None, temperature=None):
    """SD speedup over plain decoding against batch size, each (drafter, k) with its bound.

    Solid lines are measured speedups (medians of per-repeat ratios), dashed lines of the same
    colour the bound tau*T1/(k*Td+Tv) from the same run; the gap says how lean the engine is.
    When the table has them, error bars span the per-repeat ratios (``speedup_min`` to
    ``speedup_max``) and a red ring marks a wide spread. The line at 1 is plain decoding: below
    it SD costs time. One panel per temperature unless one is chosen.
    """
    fig, panels = _panels(table, ax, temperature)
    styles = _styles(table)
    spread = {}
    for temp, ax, rows in panels:
        for (drafter, k), r in rows.groupby(["drafter", "k"], sort=True):
            r = r.sort_values("batch_size")
            ax.plot(r["batch_size"], r["bound"], "--", linewidth=1.2, alpha=0.8,
                    color=styles[(drafter, k)]["color"], gid=f"bound-{drafter}-k{k}",
                    label=f"_bound {drafter} k={k}")
        _batch_axis(ax, _per_drafter(ax, rows, "speedup", styles, "speedup"))
        spread.update({h.get_label(): h for h in _spread(ax, rows, styles)})
        ax.axhline(1.0, color="black", linewidth=1.0, gid="plain-decoding",
                   label="plain decoding")
        ax.set_title(_temperature_title(temp))
        ax.grid(alpha=0.3)
    first = panels[0][1]
    first.set_ylabel(f"speedup over plain decoding ({CLOCK} clock)")
    bound = Line2D([], [], color="gray", linestyle="--", label="SD bound (same colour)")
    *measured, plain = first.get_legend_handles_labels()[0]
    first.legend(handles=[*measured, bound, *spread.values(), plain], fontsize=8)
    return fig


def acceptance_vs_batch(table, ax=None, temperature=None):
    """Acceptance length tau against batch size, one line per (drafter, k), k+1 dotted above.

    tau is what each verify pass buys (accepted drafts + 1); the dotted line at k+1 is the
    most it can buy, so the gap is the drafter's misses. One panel per temperature.
    """
    fig, panels = _panels(table, ax, temperature)
    styles = _styles(table)
    for i, (temp, ax, rows) in enumerate(panels):
        _batch_axis(ax, _per_drafter(ax, rows, "tau", styles, "tau"))
        for k in sorted(rows["k"].unique()):
            ax.axhline(k + 1, color="gray", linestyle=":", linewidth=1.2, gid=f"tau-max-k{k}")
            ax.annotate(f"max for k={k}", (1.0, k + 1), xycoords=("axes fraction", "data"),
                        xytext=(-3, 3), textcoords="offset points", ha="right", fontsize=8,
                        color="gray")
        ax.set_ylim(0.9, rows["k"].max() + 1.5)
        ax.set_title(_temperature_title(temp))
        ax.grid(alpha=0.3)
        if i == 0:
            ax.set_ylabel("acceptance length τ (tokens per verify)")
            ax.legend(fontsize=8, loc="best")
    return fig


def sd_time_breakdown(table, ax=None, drafter=None, k=None, temperature=None):
    """What one SD step costs against what plain decoding spends on the same tokens, per batch.

    Per batch size: the SD step stacked as k drafter steps (k*Td) under one verify pass (Tv),
    beside tau plain decode steps (T1*tau), all in ms. SD can pay only where its bar is the
    shorter one; the ratio (the bound) is written above each pair. Defaults to the first
    drafter, k and temperature present.
    """
    _check(table)
    drafter = table["drafter"].iloc[0] if drafter is None else drafter
    k = int(table["k"].iloc[0]) if k is None else k
    temperature = table["temperature"].iloc[0] if temperature is None else temperature
    rows = _pick(_pick(_pick(table, "drafter", drafter), "k", k), "temperature", temperature)
    rows = rows.sort_values("batch_size")
    fig, ax = _axes(ax, (7, 4.2))
    x, w = np.arange(len(rows)), 0.38
    draft, verify = 1000 * k * rows["Td"].to_numpy(), 1000 * rows["Tv"].to_numpy()
    plain = 1000 * (rows["T1"] * rows["tau"]).to_numpy()
    bars = {"draft": ax.bar(x - w / 2, draft, w, color="#cab2d6", label=f"draft: k·Td (k={k})"),
            "verify": ax.bar(x - w / 2, verify, w, bottom=draft, color="#b2df8a",
                             label="verify: Tv"),
            "plain": ax.bar(x + w / 2, plain, w, color="#a6cee3",
                            label="plain decoding: τ·T1 (same tokens)")}
    for name, container in bars.items():
        for bar in container:
            bar.set_gid(f"{name}-bar")
    for xi, top, b in zip(x, np.fmax(draft + verify, plain), rows["bound"]):
        ax.annotate(f"bound {b:.2f}×", (xi, top), xytext=(0, 3), textcoords="offset points",
                    ha="center", fontsize=8)
    ax.set_xticks(x, [f"{b:g}" for b in rows["batch_size"]])
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"ms per SD step ({CLOCK} clock)")
    ax.set_ylim(0, np.nanmax(np.fmax(draft + verify, plain)) * 1.15)
    ax.set_title(f"One SD step vs plain decoding of its τ tokens: {drafter} k={k}, "
                 f"{_temperature_title(temperature)}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return fig
