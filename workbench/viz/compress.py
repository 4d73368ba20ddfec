"""Figures of compression runs, drawn from their tables: importance, pruning ablations,
distillation curves, methods with error bars, accuracy against a token budget, and the
accuracy-against-throughput Pareto front.

Every function takes the tidy tables that ``workbench.compress`` returns, draws on ``ax`` when
given, and returns the figure; ``label`` states the calibration set or token budget that the
figure's numbers depend on. A comparison run over several seeds draws its spread: a table
with ``<value>_lo`` and ``<value>_hi`` columns (a 95% interval) gets error bars, curves with a
``seed`` column their mean with the band between the seeds' lowest and highest.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .timeline import _axes, _caption

__all__ = ["importance_heatmaps", "depth_scores", "ranking_ablation", "width_vs_depth",
           "loss_curves", "error_bars", "pareto", "budget_curves"]


def _heatmap(ax, table: pd.DataFrame, column: str, title: str) -> None:
    grid = table.pivot(index="layer", columns=column, values="score").to_numpy()
    # each layer's row over its own maximum: what matters is the order inside a layer
    grid = grid / np.maximum(grid.max(axis=1, keepdims=True), 1e-30)
    im = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel(column)
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    plt.colorbar(im, ax=ax, fraction=0.046, pad=0.02)


def importance_heatmaps(tables: dict, label: str = ""):
    """Heads (layer x head), MLP neurons (layer x neuron), each row over its own maximum, and
    embedding channels sorted by score: how unevenly importance is spread."""
    fig, axes = plt.subplots(1, 3, figsize=(13.0, 3.6),
                             gridspec_kw={"width_ratios": [1, 2.2, 1.4]})
    _heatmap(axes[0], tables["heads"], "head", "attention heads")
    _heatmap(axes[1], tables["neurons"], "neuron", "MLP neurons")
    ch = np.sort(tables["channels"]["score"].to_numpy())[::-1]
    axes[2].plot(np.arange(len(ch)), ch / ch.max(), color="#1f78b4")
    axes[2].set_xlabel("embedding channel (sorted)")
    axes[2].set_ylabel("score / max")
    axes[2].set_title("embedding channels", fontsize=9)
    fig.suptitle(label, fontsize=8, x=0.01, ha="left", color="#555555")
    fig.tight_layout()
    return fig


def depth_scores(table: pd.DataFrame, ax=None, label: str = ""):
    """Per layer: the LM-loss increase when it is removed (bars) and its Block Importance
    1 - cos(input, output) (line, right axis)."""
    fig, ax = _axes(ax, (6.0, 3.4))
    ax.bar(table["layer"], table["increase"], color="#a6cee3", label="LM-loss increase")
    ax.set_xlabel("layer removed")
    ax.set_ylabel("LM-loss increase (nats)")
    right = ax.twinx()
    right.plot(table["layer"], table["block_importance"], "o-", color="#e31a1c",
               label="Block Importance")
    right.set_ylabel("Block Importance")
    ax.legend(loc="upper left", fontsize=7)
    right.legend(loc="upper right", fontsize=7)
    _caption(ax, label)
    return fig


def ranking_ablation(table: pd.DataFrame, teacher_loss: float | None = None, ax=None,
                     label: str = ""):
    """LM loss right after pruning to one plan, per ranking (``ranking``, ``lm_loss``);
    lower is better; with ``lm_loss_sd`` (a ranking drawn once per seed) ± sd whiskers where
    it is above 0. The unpruned teacher's loss is the dashed line."""
    fig, ax = _axes(ax, (6.0, 3.4))
    t = table.sort_values("lm_loss")
    colors = ["#33a02c" if i == 0 else "#bdbdbd" for i in range(len(t))]
    sd = t["lm_loss_sd"] if "lm_loss_sd" in t else None
    ax.barh(t["ranking"], t["lm_loss"], color=colors, xerr=sd, capsize=3)
    for y, v in enumerate(t["lm_loss"]):
        ax.text(v, y, f" {v:.3f}", va="center", fontsize=7)
    if teacher_loss is not None:
        ax.axvline(teacher_loss, ls="--", color="#4d4d4d", label=f"teacher {teacher_loss:.3f}")
        ax.legend(fontsize=7, loc="lower right")
    ax.invert_yaxis()
    ax.set_xlabel("LM loss right after pruning (nats, lower is better)")
    _caption(ax, label)
    return fig


def _yerr(table: pd.DataFrame, value: str):
    """``[2, rows]`` distances from ``value`` down to ``<value>_lo`` and up to ``<value>_hi``;
    None when the table has no interval."""
    if f"{value}_lo" not in table or f"{value}_hi" not in table:
        return None
    return np.stack([table[value] - table[f"{value}_lo"], table[f"{value}_hi"] - table[value]])


def width_vs_depth(table: pd.DataFrame, ax=None, label: str = ""):
    """LM loss of the width- and depth-pruned students (``kind``) right after pruning and
    after distillation (``stage``), bars side by side; with ``lm_loss_lo``/``lm_loss_hi``
    (over seeds) error bars."""
    fig, ax = _axes(ax, (6.0, 3.4))
    kinds = list(dict.fromkeys(table["kind"]))
    stages = list(dict.fromkeys(table["stage"]))
    width = 0.8 / len(stages)
    for i, stage in enumerate(stages):
        part = table[table["stage"] == stage].set_index("kind").loc[kinds].reset_index()
        xs = np.arange(len(kinds)) + i * width
        ax.bar(xs, part["lm_loss"], width, label=stage, yerr=_yerr(part, "lm_loss"),
               capsize=3)
        for x, v in zip(xs, part["lm_loss"]):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(np.arange(len(kinds)) + width * (len(stages) - 1) / 2, kinds)
    ax.set_ylabel("LM loss (nats)")
    ax.legend(fontsize=7)
    _caption(ax, label)
    return fig


def error_bars(table: pd.DataFrame, value: str = "accuracy", name: str = "run", ax=None,
               label: str = ""):
    """One point per method (``name``) at its mean ``value`` with whiskers from
    ``<value>_lo`` to ``<value>_hi`` (e.g. a bootstrap 95% interval), annotated mean ± sd when
    ``<value>_sd`` is there."""
    fig, ax = _axes(ax, (6.0, 0.5 + 0.45 * len(table)))
    ys = np.arange(len(table))[::-1]
    ax.errorbar(table[value], ys, xerr=_yerr(table, value), fmt="o", capsize=4,
                color="#1f78b4")
    for y, (_, r) in zip(ys, table.iterrows()):
        sd = f" ± {r[value + '_sd']:.3f}" if f"{value}_sd" in table else ""
        ax.annotate(f"{r[value]:.3f}{sd}", (r[value], y), fontsize=7, xytext=(0, 6),
                    textcoords="offset points", ha="center")
    ax.set_yticks(ys, table[name])
    ax.set_ylim(-0.7, len(table) - 0.3)
    ax.set_xlabel(value.replace("_", " ") + (" (mean, 95% interval)"
                                             if f"{value}_lo" in table else ""))
    _caption(ax, label)
    return fig


def loss_curves(curves: pd.DataFrame, target: float | None = None, ax=None, label: str = ""):
    """Held-out LM loss against training tokens seen, one line per ``run`` (columns ``run``,
    ``tokens``, ``lm_loss``); with a ``seed`` column the mean over seeds per ``step``, in a
    band from the seeds' lowest to highest; ``target`` (e.g. the from-scratch model's final
    loss) dashed."""
    fig, ax = _axes(ax, (6.5, 3.8))
    for run, part in curves.groupby("run", sort=False):
        if "seed" in part:
            g = part.groupby("step")
            mean = g[["tokens", "lm_loss"]].mean()
            ax.fill_between(mean["tokens"], g["lm_loss"].min(), g["lm_loss"].max(), alpha=0.2)
            part = mean
        ax.plot(part["tokens"], part["lm_loss"], "o-", ms=3, label=run)
    if target is not None:
        ax.axhline(target, ls="--", color="#4d4d4d", lw=1, label=f"target {target:.3f}")
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("held-out LM loss (nats)")
    ax.legend(fontsize=7)
    _caption(ax, label)
    return fig


def pareto(table: pd.DataFrame, x: str = "tok_s", y: str = "accuracy", ax=None,
           label: str = ""):
    """Each model (``model``) at (tokens/s, accuracy); the Pareto front (no other model is
    both faster and more accurate) joined by a line."""
    fig, ax = _axes(ax, (6.0, 4.0))
    ax.scatter(table[x], table[y], color="#1f78b4", zorder=3)
    for _, r in table.iterrows():
        ax.annotate(r["model"], (r[x], r[y]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    t = table.sort_values(x, ascending=False)
    front, best = [], -np.inf
    for _, r in t.iterrows():
        if r[y] > best:
            front.append(r)
            best = r[y]
    f = pd.DataFrame(front)
    ax.plot(f[x], f[y], "--", color="#e31a1c", lw=1, label="Pareto front")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y)
    ax.legend(fontsize=7)
    _caption(ax, label)
    return fig


def budget_curves(summary: pd.DataFrame, teacher_accuracy: float, tolerance: float = 0.03,
                  ax=None, label: str = ""):
    """Accuracy against the training-token budget (columns ``method``, ``budget_fraction``,
    ``tokens``, ``accuracy``, ``accuracy_lo``, ``accuracy_hi``: :func:`~workbench.compress.budget_summary.
    budget_summary`), one line per method in a band of its interval, on a log axis; the
    teacher's accuracy solid and ``tolerance`` under it dotted (what "reaches the teacher"
    asks of an interval's upper end)."""
    fig, ax = _axes(ax, (6.5, 3.8))
    for method, part in summary.groupby("method", sort=False):
        part = part.sort_values("tokens")
        ax.fill_between(part["tokens"], part["accuracy_lo"], part["accuracy_hi"], alpha=0.2)
        ax.plot(part["tokens"], part["accuracy"], "o-", ms=4, label=method)
    ax.axhline(teacher_accuracy, color="#4d4d4d", lw=1, label=f"teacher {teacher_accuracy:.3f}")
    ax.axhline(teacher_accuracy - tolerance, color="#4d4d4d", lw=1, ls=":",
               label=f"teacher - {tolerance:g}")
    ax.set_xscale("log")
    ticks = summary.groupby("budget_fraction")["tokens"].mean()
    ax.set_xticks(ticks.to_numpy(), [f"{t:,.0f}\n{f:.0%}" for f, t in ticks.items()])
    ax.minorticks_off()
    ax.set_xlabel("training tokens, share of the teacher's (its count: sequence tokens of "
                  "padded batches)")
    ax.set_ylabel("held-out accuracy (mean, 95% interval)")
    ax.legend(fontsize=7)
    _caption(ax, label)
    return fig
