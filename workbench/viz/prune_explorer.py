"""Pruning explorer: choose a plan, see its size, cost and the importance it keeps.

Why: a prune plan trades parameters and FLOPs against the units it throws away, and the
importance scores say how much of each axis (heads, MLP neurons, embedding channels, layers)
survives. The explorer reads the table of :func:`workbench.compress.plan_table.plan_table`
(or its saved ``plans.csv``), so it needs no model: every plan is a point of parameters
against importance kept, and the selected one is broken down per axis.
"""
from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

from ..compress.plan import LABEL_KEY, PrunePlan
from .explorer import Explorer, legend_beside
from ..results import read_table

__all__ = ["PruneExplorer"]

AXES = ("heads", "neurons", "channels", "layers")
AXIS_NAMES = {"heads": "heads", "neurons": "MLP neurons", "channels": "channels",
              "layers": "layers"}
TICKS = {"heads": "heads", "neurons": "MLP\nneurons", "channels": "channels"}
COLUMNS = ("label", "kind", "layers", "hidden_size", "intermediate_size", "heads_per_group",
           "params", "params_ratio", "flops_per_token", "flops_ratio", "predicted_speedup",
           "predicted_tok_s", "importance_kept", *(f"kept_{a}" for a in AXES))
SAME_RATIO = 5e-3  # parameter and FLOPs shares closer than this are drawn as one, and said so
KIND_COLORS = {"width": "#1f78b4", "depth": "#e31a1c", "both": "#6a3d9a", "full": "#000000"}
AXIS_COLORS = ("#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6")


def _check_labels(table) -> None:
    if table.empty:
        raise ValueError("the plan table has no rows; build it with compress.plan_table."
                         "plan_table(model, scores, plans)")
    twice = sorted(set(table["label"][table["label"].duplicated()]))
    if twice:
        raise ValueError(f"plan labels {twice} occur more than once; each label names one plan")


class PruneExplorer(Explorer):
    """A dropdown of prune plans over their table.

    Left: every plan as a point, parameters (share of the teacher's) against importance kept
    (the mean of the per-axis shares), coloured by kind; the selected plan ringed; above the
    diagonal a plan keeps more importance than its share of parameters. Right: the
    share of importance the selected plan keeps per axis, beside its parameter and FLOPs
    shares (dashed and dotted, in two colours; their label says when they coincide), the
    layers bar naming how many layers the plan keeps. The title reads the selected plan in
    words, and the figure states the key to its labels (:data:`~workbench.compress.plan_table.
    LABEL_KEY`); legends sit beside the axes, never over the data. The panel states the
    plan, parameters, FLOPs per token, the predicted throughput (a FLOPs model, not a
    measurement) and the importance kept per axis, with the layers kept counted: a depth plan
    whose dropped layers scored nothing keeps "100%" of layer importance yet fewer layers.

    Args:
        plans_table: ``plan_table(...)``'s DataFrame, or the CSV/parquet path it was saved to.
        plan: the label selected first (default: the first row's).
    """

    figsize = (12.5, 5.0)

    def __init__(self, plans_table, plan: str | None = None):
        import ipywidgets as widgets
        table = read_table(plans_table, COLUMNS, "a plan table (compress.plan_table.plan_table)")
        _check_labels(table)
        self.table = table.reset_index(drop=True).astype({"label": str})
        labels = self.table["label"].tolist()
        if plan is not None and plan not in labels:
            raise ValueError(f"plan {plan!r} is not in the table; its labels: {labels}")
        super().__init__({"plan": widgets.Dropdown(
            options=labels, value=labels[0] if plan is None else plan, description="plan",
            layout=widgets.Layout(width="420px"),
            tooltip="the plan table holds this one plan only" if len(labels) == 1
            else f"the {len(labels)} plans of the table; {LABEL_KEY}")})

    def draw(self, fig, plan) -> str:
        left, right = fig.subplots(1, 2, width_ratios=[1.4, 1.0])
        row = self.table[self.table["label"] == plan].iloc[0]
        self._points(left, row)
        self._axes_kept(right, row)
        fig.suptitle(f"Plan {row['label']}: {_plan(row).describe(_source_layers(row))}",
                     fontsize=10)
        fig.supxlabel(LABEL_KEY, fontsize=8, color="#555555")
        return _panel(row)

    def _points(self, ax, row) -> None:
        """All plans at (parameters share, importance kept); the selected one ringed."""
        for kind, part in self.table.groupby("kind", sort=True):
            ax.scatter(part["params_ratio"], part["importance_kept"], s=28, alpha=0.8,
                       color=KIND_COLORS.get(kind, "#636363"), label=kind, gid=f"plans-{kind}")
        ax.scatter([row["params_ratio"]], [row["importance_kept"]], s=220, facecolors="none",
                   edgecolors="#ff7f00", linewidths=2.5, gid="selected", label="selected",
                   zorder=4)
        ax.annotate(row["label"], (row["params_ratio"], row["importance_kept"]),
                    xytext=(8, -12), textcoords="offset points", fontsize=8, gid="selected-label")
        (x0, x1), (y0, y1) = (_span(self.table[c]) for c in ("params_ratio", "importance_kept"))
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        ends = [max(x0, y0), min(x1, y1)]
        if ends[0] < ends[1]:  # the diagonal crosses the view
            ax.plot(ends, ends, color="#bdbdbd", linewidth=1.0, gid="diagonal",
                    label="importance share = parameter share")
        ax.set_xlabel("parameters (share of the teacher's)")
        ax.set_ylabel("importance kept (mean of the axes' shares)")
        ax.set_title("Every plan: parameters against importance kept", fontsize=10)
        ax.grid(alpha=0.3)
        legend_beside(ax)

    def _axes_kept(self, ax, row) -> None:
        """Share of importance kept per axis, and the parameter and FLOPs shares for scale."""
        kept = [float(row[f"kept_{a}"]) for a in AXES]
        bars = ax.bar(np.arange(len(AXES)), np.nan_to_num(kept), color=AXIS_COLORS)
        for bar, value in zip(bars, kept):
            bar.set_gid("kept-bar")
            ax.annotate(_percent(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
        params, flops = float(row["params_ratio"]), float(row["flops_ratio"])
        same = math.isclose(params, flops, abs_tol=SAME_RATIO)
        ax.axhline(params, color="#424242", linestyle="--", linewidth=1.3, zorder=3,
                   gid="params-ratio", label=f"parameters {params:.0%}")
        ax.axhline(flops, color="#6a3d9a", linestyle=":", linewidth=2.2, zorder=3.5,
                   gid="flops-ratio", label=f"FLOPs per token {flops:.0%}"
                   + (" (= parameters)" if same else ""))
        ticks = [*TICKS.values(), f"layers\n({_layers_kept(row)})"]
        ax.set_xticks(np.arange(len(AXES)), ticks)
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("share of importance kept")
        ax.set_title("Importance kept per axis", fontsize=10)
        legend_beside(ax)


def _span(values, pad: float = 0.15, least: float = 0.02) -> tuple[float, float]:
    """Axis limits around ``values`` (NaN left out), padded so no point sits on the frame."""
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    margin = max((hi - lo) * pad, least)
    return lo - margin, hi + margin


def _throughput(row) -> str:
    """The predicted throughput, in tokens/s when the teacher's was measured."""
    speedup = f"{row['predicted_speedup']:.2f}× the teacher's"
    if math.isnan(float(row["predicted_tok_s"])):
        return speedup
    return f"{row['predicted_tok_s']:,.0f} tokens/s ({speedup})"


def _plan(row) -> PrunePlan:
    """The plan a table row describes (its shape columns)."""
    return PrunePlan(tuple(int(i) for i in str(row["layers"]).split(",")),
                     int(row["hidden_size"]), int(row["intermediate_size"]),
                     int(row["heads_per_group"]))


def _source_layers(row) -> int | None:
    """The teacher's layer count (tables written before ``source_layers`` existed: None)."""
    value = row.get("source_layers")
    return None if value is None or pd.isna(value) else int(value)


def _layers_kept(row) -> str:
    """``3 of 6 kept``: how many layers the plan keeps, whatever their importance."""
    kept, source = len(_plan(row).layers), _source_layers(row)
    return f"{kept} of {source} kept" if source is not None else f"{kept} kept"


def _percent(value: float, digits: int = 0) -> str:
    """A share as a percentage; never "100%" unless all is kept (0.9996 reads 99.96%)."""
    if math.isnan(value):
        return "n/a"
    for shown in range(digits, digits + 4):
        text = f"{value:.{shown}%}"
        if value >= 1 or text != f"{1:.{shown}%}":
            return text
    return "<100%"


def _panel(row) -> str:
    kept = ", ".join(f"{AXIS_NAMES[a]} {_percent(float(row[f'kept_{a}']), 1)}" for a in AXES)
    words = _plan(row).describe(_source_layers(row))
    return (f"<b>{html.escape(str(row['label']))}</b> ({html.escape(str(row['kind']))}): "
            f"{html.escape(words)}<br>"
            f"<b>parameters</b> {int(row['params']):,} ({row['params_ratio']:.1%} of the "
            f"teacher's)<br>"
            f"<b>FLOPs per token</b> {int(row['flops_per_token']):,} "
            f"({row['flops_ratio']:.1%})<br>"
            f"<b>predicted throughput</b> {_throughput(row)}<br>"
            f"<b>importance kept</b> {kept} (layers: {_layers_kept(row)})<br>"
            "<i>throughput from the FLOPs ratio, not measured</i><br>"
            f"<i>{html.escape(LABEL_KEY)}</i>")
