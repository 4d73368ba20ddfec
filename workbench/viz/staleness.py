"""Figures of a drafter-staleness run, drawn from its tables (``workbench.rl.staleness``).

``history``: one row per RL step, with ``tau_<drafter>`` and ``kl_start``; ``evals``: held-out
greedy accuracy per ``step``; ``positions``: per step, drafter and response-position bucket,
``verify_steps`` and ``emitted``; the by-product table: ``drafter``, ``temperature``,
``acceptance_length``. tau is the acceptance length (tokens emitted per verify step, docs/
design.md) on each step's own rollout at the run's temperature, coupled verification.
``label`` is the RL configuration every figure states beside it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..checks import check_int
from .timeline import _caption

__all__ = ["tau_over_steps", "tau_by_position", "byproduct_bars", "suffix_against_sibling",
           "DRAFTER_COLORS"]

DRAFTER_COLORS = {"frozen": "#1f78b4", "adaptive": "#33a02c", "ceiling": "#6a3d9a",
                  "sibling": "#ff7f00", "suffix": "#e31a1c"}
"""One colour per staleness drafter, shared by the figures."""


def _drafters(history: pd.DataFrame) -> list[str]:
    return [c.removeprefix("tau_") for c in history.columns if c.startswith("tau_")]


def tau_over_steps(history: pd.DataFrame, evals: pd.DataFrame | None = None, label: str = "",
                   k: int | None = None, smooth: int | None = None):
    """tau of every drafter against the RL step, above the policy's KL to its start and
    (with ``evals``) its held-out greedy accuracy, on one step axis. ``smooth``: the mean of
    the last ``smooth`` steps drawn over each drafter's per-step points (faint then), for a
    long run whose step-to-step noise hides the trend."""
    smooth = check_int("smooth (steps)", smooth, 1, optional="the per-step points alone")
    panels = 3 if evals is not None and len(evals) else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7.0, 2.2 + 1.8 * panels), sharex=True,
                             layout="constrained", height_ratios=[2] + [1] * (panels - 1))
    ax = axes[0]
    for name in _drafters(history):
        color, tau = DRAFTER_COLORS.get(name), history[f"tau_{name}"]
        ax.plot(history["step"], tau, marker="o", ms=2.5 if smooth is None else 1.5,
                lw=1.2 if smooth is None else 0.4, alpha=1.0 if smooth is None else 0.35,
                label=name if smooth is None else None, color=color)
        if smooth is not None:
            ax.plot(history["step"], tau.rolling(smooth, min_periods=1).mean(), lw=2.0,
                    color=color, label=name)
    ax.set_ylabel("tau (tokens per verify step)" + (f", k={k}" if k else ""))
    ax.legend(fontsize=7, ncols=4, loc="lower left",
              title=None if smooth is None else f"points: each step; lines: mean of the "
                                                f"last {smooth}", title_fontsize=7)
    _caption(ax, label)
    axes[1].plot(history["step"], history["kl_start"], color="#984ea3")
    axes[1].set_ylabel("KL to the start (k3)")
    if panels == 3:
        axes[2].plot(evals["step"], evals["accuracy"], marker="o", color="#4d4d4d")
        axes[2].set_ylabel("held-out accuracy\n(greedy)")
    axes[-1].set_xlabel("RL step")
    return fig


def tau_by_position(positions: pd.DataFrame, steps=None, label: str = ""):
    """tau against response position (bucket start) of every drafter, one panel per step of
    ``steps`` (default: the first and the last step in the table)."""
    if positions.empty:
        raise ValueError("the positions table is empty: run at least one RL step")
    steps = [int(positions["step"].min()), int(positions["step"].max())] if steps is None \
        else list(steps)
    steps = list(dict.fromkeys(steps))
    fig, axes = plt.subplots(1, len(steps), figsize=(4.2 * len(steps), 3.4), sharey=True,
                             layout="constrained", squeeze=False)
    for ax, step in zip(axes[0], steps):
        at = positions[positions["step"] == step]
        if at.empty:
            raise ValueError(f"no RL step {step} in the positions table; steps: "
                             f"{sorted(positions['step'].unique())}")
        for name, rows in at.groupby("drafter", sort=False):
            ax.plot(rows["position"], rows["emitted"] / rows["verify_steps"], marker="o",
                    ms=3, label=name, color=DRAFTER_COLORS.get(name))
        ax.set_title(f"RL step {step}", fontsize=9)
        ax.set_xlabel("response position (tokens, bucket start)")
    axes[0][0].set_ylabel("tau (tokens per verify step)")
    axes[0][0].legend(fontsize=7)
    if label:
        fig.suptitle(label, fontsize=7, color="#555555")
    return fig


def byproduct_bars(table: pd.DataFrame, label: str = ""):
    """The by-product: tau of the frozen and the adaptive drafter with the final policy on
    held-out prompts, a pair of bars per temperature, each bar labelled with its value."""
    fig, ax = plt.subplots(figsize=(5.6, 3.6), layout="constrained")
    temps = sorted(table["temperature"].unique())
    names = list(dict.fromkeys(table["drafter"]))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        rows = table[table["drafter"] == name].set_index("temperature").reindex(temps)
        xs = np.arange(len(temps)) + (j - (len(names) - 1) / 2) * width
        ax.bar(xs, rows["acceptance_length"], width, label=name,
               color=DRAFTER_COLORS.get(name))
        for x, v in zip(xs, rows["acceptance_length"]):
            ax.text(x, v, f"{v:.3f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(np.arange(len(temps)), [f"T={t:g}" for t in temps])
    ax.set_ylabel("tau on held-out prompts, final policy")
    ax.legend(fontsize=7, loc="lower right")
    _caption(ax, label)
    return fig


def suffix_against_sibling(taus: pd.DataFrame, label: str = "", k: int | None = None):
    """Above, tau per RL step, one line per drafter (the model-free ones bold); below, the
    suffix drafter's tau minus the sibling drafter's on each step's same rollouts, with its
    mean. ``taus``: ``rl.staleness.report.tau_per_step``'s table (``step``, ``tau_<drafter>``,
    ``suffix_minus_sibling``)."""
    missing = [c for c in ("step", "tau_suffix", "tau_sibling", "suffix_minus_sibling")
               if c not in taus]
    if missing:
        raise ValueError(f"the tau-per-step table lacks {missing}; it needs a run that "
                         "measured the suffix and sibling drafters (tau_per_step's table)")
    fig, (top, low) = plt.subplots(2, 1, figsize=(7.0, 5.2), sharex=True,
                                   layout="constrained", height_ratios=[2, 1])
    for name in _drafters(taus):
        bold = name in ("suffix", "sibling")
        top.plot(taus["step"], taus[f"tau_{name}"], marker="o", ms=3 if bold else 2,
                 lw=1.8 if bold else 0.9, alpha=1.0 if bold else 0.6, label=name,
                 color=DRAFTER_COLORS.get(name))
    top.set_ylabel("tau (tokens per verify step)" + (f", k={k}" if k else ""))
    top.legend(fontsize=7, ncols=5, loc="best")
    _caption(top, label)
    diff = taus["suffix_minus_sibling"]
    low.bar(taus["step"], diff, color=np.where(diff >= 0, DRAFTER_COLORS["suffix"],
                                               DRAFTER_COLORS["sibling"]), alpha=0.7)
    low.axhline(float(diff.mean()), color="#333333", lw=1.0, ls="--",
                label=f"mean {diff.mean():+.3f}")
    low.axhline(0.0, color="#999999", lw=0.6)
    low.set_ylabel("tau: suffix\nminus sibling")
    low.set_xlabel("RL step")
    low.legend(fontsize=7, loc="upper right")
    return fig
