"""Figures of the long-tail remedies side by side (notebook 11), drawn from an ablation's
tables: the history (one row per variant, seed and RL step) and the accuracy-against-time
table (``rl.remedies.compare.accuracy_vs_time``: variant, step, time_s, accuracy,
accuracy_sd, accuracy_se).

The three a practitioner reads to pick a remedy: what a step costs, what accuracy each buys
for the time spent, and how much of the data it trains on is stale; and beside them what each
does to learning per RL step, whatever the step costs. Times are on the sim
clock (N workers side by side, the policy update charged as its time / N), and each figure
says so; ``label`` is the RL configuration stated beside every figure.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from .rl import VARIANT_COLORS, _caption
from .timeline import _axes

__all__ = ["step_times", "accuracy_vs_time", "learning_over_steps", "offpolicy_share"]

REMEDY_COLORS = {**VARIANT_COLORS, "overprovision": "#6a3d9a", "april": "#cab2d6",
                 "partial": "#ff7f00", "async": "#b15928", "tail_batching": "#a6cee3"}


def _color(variant: str, i: int):
    """The variant's own color; a composed one (``tlt+async``) its remedy's, others cycled."""
    name = variant.removeprefix("tlt+")
    return REMEDY_COLORS.get(name, f"C{i % 10}")


def step_times(history: pd.DataFrame, ax=None, label: str = ""):
    """Mean seconds per RL step of each variant (over seeds and steps, with one standard
    deviation), each labelled with its speedup over the baseline's mean when the baseline
    ran; composed variants (``tlt+...``) hatched."""
    fig, ax = _axes(ax, (7.0, 3.8))
    g = history.groupby("variant", sort=False)["step_s"]
    mean, sd = g.mean(), g.std(ddof=1).fillna(0.0)
    x = np.arange(len(mean))
    bars = ax.bar(x, mean.to_numpy(), yerr=sd.to_numpy(), capsize=3,
                  color=[_color(v, i) for i, v in enumerate(mean.index)], edgecolor="white")
    for bar, v in zip(bars, mean.index):
        if v.startswith("tlt+"):
            bar.set_hatch("//")
    base = mean.get("baseline")
    for xi, (v, m) in enumerate(mean.items()):
        text = f"{m:.2f}s" + (f"\n{base / m:.2f}x" if base is not None and m > 0 else "")
        ax.text(xi, m + sd[v], text, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, mean.index, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("seconds per RL step (sim clock)")
    ax.set_ylim(0, float((mean + sd).max()) * 1.3 or 1.0)
    _caption(ax, label)
    return fig


def accuracy_vs_time(curves: pd.DataFrame, target: float | None = None, ax=None,
                     label: str = ""):
    """Held-out accuracy (mean over seeds, its standard error shaded: the band that says
    whether two means differ, which a standard deviation's band, ten variants deep, hides)
    against the cumulative sim time of the RL steps before each evaluation, one line per
    variant;
    ``target`` (the baseline's final accuracy) as a dashed line: the variant whose line
    crosses it furthest left got there first."""
    fig, ax = _axes(ax, (7.0, 4.0))
    for i, (v, c) in enumerate(curves.groupby("variant", sort=False)):
        color = _color(v, i)
        style = "--" if v.startswith("tlt+") else "-"
        ax.plot(c["time_s"], c["accuracy"], style, marker="o", ms=3, color=color, label=v)
        se = c["accuracy_se"].fillna(0.0)
        ax.fill_between(c["time_s"], c["accuracy"] - se, c["accuracy"] + se, color=color,
                        alpha=0.12, linewidth=0)
    if target is not None:
        ax.axhline(target, color="#4d4d4d", linestyle=":", linewidth=1,
                   label="baseline's final accuracy")
    ax.set_xlabel("cumulative time of the RL steps (s, sim clock)")
    ax.set_ylabel("held-out accuracy (greedy)\nmean over seeds ± standard error")
    ax.legend(fontsize=7, ncol=2)
    _caption(ax, label)
    return fig


def learning_over_steps(history: pd.DataFrame, curves: pd.DataFrame, window: int = 5,
                        label: str = ""):
    """Two panels against RL steps, one line per variant (``tlt+...`` dashed): the training
    reward (mean over seeds, then a trailing moving mean over ``window`` steps: one step's
    batch is a few prompts, so its reward is noisy) and the held-out accuracy (``curves``, the
    accuracy-against-time table: mean over seeds, its standard error shaded). Per step, not per second: what a remedy's stale or
    dropped data does to learning, which its speedup then buys back or not."""
    fig = plt.figure(figsize=(10.0, 3.8), layout="constrained")
    reward_ax, accuracy_ax = fig.subplots(1, 2)
    reward = history.groupby(["variant", "step"], sort=False)["reward"].mean()
    for i, v in enumerate(dict.fromkeys(history["variant"])):
        style = dict(color=_color(v, i), linestyle="--" if v.startswith("tlt+") else "-")
        r = reward.loc[v].sort_index()
        reward_ax.plot(r.index, r.rolling(window, min_periods=1).mean(), label=v, **style)
        a = curves[curves["variant"] == v]
        if len(a):
            accuracy_ax.plot(a["step"], a["accuracy"], marker="o", ms=3, label=v, **style)
            se = a["accuracy_se"].fillna(0.0)
            accuracy_ax.fill_between(a["step"], a["accuracy"] - se, a["accuracy"] + se,
                                     color=style["color"], alpha=0.12, linewidth=0)
    reward_ax.set_ylabel(f"training reward\n(mean over seeds, {window}-step moving mean)")
    accuracy_ax.set_ylabel("held-out accuracy (greedy,\nmean over seeds ± standard error)")
    reward_ax.set_xlabel("RL step (its rollout's reward)")
    accuracy_ax.set_xlabel("RL steps done before the evaluation")
    for ax in (reward_ax, accuracy_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    accuracy_ax.legend(fontsize=7, ncol=2)
    _caption(reward_ax, label, clock=False)  # per step: no clock in it
    return fig


def offpolicy_share(history: pd.DataFrame, ax=None, label: str = ""):
    """Per variant, the mean share of trained tokens that an older policy sampled (0 for a
    variant without the column's values: on-policy), labelled with the mean and largest
    staleness (versions behind)."""
    fig, ax = _axes(ax, (7.0, 3.6))
    h = history.reindex(columns=list(history.columns) + [
        c for c in ("offpolicy_token_share", "mean_staleness", "max_staleness")
        if c not in history])
    g = h.groupby("variant", sort=False)
    share = g["offpolicy_token_share"].mean().fillna(0.0)
    mean_st = g["mean_staleness"].mean().fillna(0.0)
    max_st = g["max_staleness"].max().fillna(0.0)
    x = np.arange(len(share))
    ax.bar(x, share.to_numpy(), color=[_color(v, i) for i, v in enumerate(share.index)],
           edgecolor="white")
    for xi, v in enumerate(share.index):
        ax.text(xi, share[v], f"{share[v]:.0%}\nstale {mean_st[v]:.2f} (max {max_st[v]:.0f})",
                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, share.index, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("off-policy share of trained tokens")
    ax.set_ylim(0, max(1.0, float(share.max()) * 1.3))
    _caption(ax, label, clock=False)
    return fig
