"""Figures of RL runs, drawn from their tables: per-step histories and bandit choice tables.

Every function takes the tidy tables the RL loop writes (one row per variant, seed and RL
step; see ``workbench.rl.ablation``), draws on ``ax`` when given, and returns the figure. Times
are on the sim clock (N workers side by side, the policy update charged as its measured time
divided by N), and each figure says so; ``label`` is the RL configuration (P, G, length cap,
lr, steps) that every figure states beside it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .timeline import _axes, _caption as caption

__all__ = ["rl_label", "engine_label", "step_time_breakdown", "makespan_per_step", "reward_curves",
           "heldout_accuracy", "acceptance_over_steps", "speedup_vs_amdahl", "bandit_choices",
           "timeline_before_after"]

VARIANT_COLORS = {"baseline": "#4d4d4d", "static_sd": "#1f78b4",
                  "adaptive_drafter": "#33a02c", "tlt": "#e31a1c"}
SIM_NOTE = "sim clock: N workers in parallel, policy update charged as its time / N"


def rl_label(grpo, steps: int) -> str:
    """``P x G, cap, lr, steps, N workers`` of a GRPOConfig: the line under every RL figure."""
    rollout = grpo.rollout
    return (f"P={grpo.prompts_per_step} x G={rollout.samples_per_prompt}, max "
            f"{rollout.max_new_tokens} tokens, lr {grpo.train.lr:g}, T={rollout.temperature:g}, "
            f"{steps} RL steps, N={rollout.workers} workers"
            + (f", KL coef {grpo.kl_coef:g}" if grpo.kl_coef else ""))


def engine_label(spec_k: int, threshold: int | None, explore_budget: float,
                 drafter_delay_s: float = 0.0, explore_run: int = 6, settle: int = 3) -> str:
    """What the ablation's SD engines were told: the static chain's depth, where the adaptive
    engine may speculate, what its exploring may cost and how it explores (runs of
    ``explore_run`` pulls, the first ``settle`` teaching nothing), and the hostile machine's
    delay."""
    where = ("learns where SD pays" if threshold is None
             else f"no SD above batch {threshold}")
    how = ("one step at a time" if explore_run == 1
           else f"in runs of {explore_run}, {settle} settling")
    hostile = (f" | hostile machine: +{drafter_delay_s * 1e3:g} ms per drafted depth"
               if drafter_delay_s else "")
    return (f"static k {spec_k} | adaptive engine: {where}, exploring <= {explore_budget:.0%} "
            f"of decode time {how}{hostile}")


def _color(variant: str):
    return VARIANT_COLORS.get(variant)


def _caption(ax, label: str, clock: bool = True) -> None:
    """``label`` above the axes, and with ``clock`` the note on the sim clock's step times."""
    caption(ax, label, SIM_NOTE if clock else "")


def step_time_breakdown(history: pd.DataFrame, ax=None, label: str = ""):
    """Mean seconds per RL step of each variant, split into rollout, policy update (/N) and
    drafter training that overran its idle window."""
    fig, ax = _axes(ax, (6.0, 3.8))
    h = history.assign(overrun=history["step_s"] - history["rollout_s"] - history["update_sim_s"])
    mean = h.groupby("variant", sort=False)[["rollout_s", "update_sim_s", "overrun"]].mean()
    bottom = np.zeros(len(mean))
    parts = [("rollout_s", "rollout", "#a6cee3"), ("update_sim_s", "policy update / N", "#fdbf6f"),
             ("overrun", "drafter training past the idle window", "#fb9a99")]
    for col, name, color in parts:
        vals = mean[col].clip(lower=0).to_numpy()
        ax.bar(mean.index, vals, bottom=bottom, label=name, color=color, edgecolor="white")
        bottom += vals
    for x, (total, roll) in enumerate(zip(bottom, mean["rollout_s"])):
        ax.text(x, total, f"{total:.2f}s\nrollout {roll / total:.0%}", ha="center",
                va="bottom", fontsize=7)
    ax.set_ylabel("seconds per RL step (sim clock)")
    ax.set_ylim(0, bottom.max() * 1.25)
    ax.legend(fontsize=7, loc="upper right")
    _caption(ax, label)
    return fig


def _per_step(history: pd.DataFrame, column: str) -> pd.DataFrame:
    return history.groupby(["variant", "step"], sort=False)[column].agg(["mean", "std"])


def makespan_per_step(history: pd.DataFrame, ax=None, label: str = ""):
    """Each variant's RL step time (sim) against the step, mean over seeds."""
    fig, ax = _axes(ax, (6.0, 3.6))
    stats = _per_step(history, "step_s")
    for variant in history["variant"].unique():
        s = stats.loc[variant]
        ax.plot(s.index, s["mean"], marker="o", ms=3, label=variant, color=_color(variant))
    ax.set_xlabel("RL step")
    ax.set_ylabel("step time (s, sim clock)")
    ax.legend(fontsize=7)
    _caption(ax, label)
    return fig


def _curves_over_seeds(frame: pd.DataFrame, column: str, ylabel: str, ax, label: str,
                       marker=None):
    """Mean of ``column`` per RL step of every variant, with a band of one standard deviation
    over the seeds."""
    fig, ax = _axes(ax, (6.0, 3.8))
    stats = _per_step(frame, column)
    seeds = frame.groupby("variant")["seed"].nunique()
    for variant in frame["variant"].unique():
        s = stats.loc[variant]
        c = _color(variant)
        ax.plot(s.index, s["mean"], label=f"{variant} ({seeds[variant]} seeds)", color=c,
                marker=marker, ms=3)
        ax.fill_between(s.index, s["mean"] - s["std"].fillna(0),
                        s["mean"] + s["std"].fillna(0), color=c, alpha=0.12)
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    _caption(ax, label, clock=False)
    return fig


def reward_curves(history: pd.DataFrame, ax=None, label: str = "", column: str = "reward"):
    """Mean reward per RL step of every variant, with a band of one standard deviation over
    the seeds."""
    return _curves_over_seeds(history, column, f"training {column} (mean over the step's "
                              "samples)", ax, label)


def heldout_accuracy(evals: pd.DataFrame, ax=None, label: str = ""):
    """Held-out greedy accuracy of every variant at each evaluation (the ablation's
    ``evals`` table), mean over the seeds with a band of one standard deviation."""
    return _curves_over_seeds(evals, "accuracy", "held-out greedy accuracy", ax, label,
                              marker="o")


def acceptance_over_steps(history: pd.DataFrame, ax=None, label: str = "",
                          variants=("static_sd", "adaptive_drafter")):
    """Acceptance length per RL step of the static and adaptive drafters, with the policy's
    KL drift from its starting point on a second axis."""
    fig, ax = _axes(ax, (6.4, 3.8))
    for variant in variants:
        s = _per_step(history[history["variant"] == variant], "accept_len")
        if len(s):
            s = s.loc[variant]
            ax.plot(s.index, s["mean"], marker="o", ms=3, label=f"{variant} drafter",
                    color=_color(variant))
    ax.set_xlabel("RL step")
    ax.set_ylabel("acceptance length tau (tokens per verify)")
    kl = history.groupby("step")["kl_start"].mean()
    ax2 = ax.twinx()
    ax2.plot(kl.index, kl.to_numpy(), ls="--", color="#984ea3", label="KL(policy || start)")
    ax2.set_ylabel("policy KL drift from the start (k3)", color="#984ea3")
    lines = ax.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower left")
    _caption(ax, label, clock=False)
    return fig


def speedup_vs_amdahl(per_variant: pd.DataFrame, ax=None, label: str = ""):
    """Each variant's end-to-end speedup over the baseline beside its Amdahl prediction from
    the baseline's rollout fraction and the variant's rollout speedup."""
    fig, ax = _axes(ax, (6.0, 3.6))
    pv = per_variant[per_variant["variant"] != "baseline"]
    x = np.arange(len(pv))
    ax.bar(x - 0.2, pv["e2e_speedup"], 0.4, label="end-to-end speedup (measured)",
           color="#e31a1c")
    ax.bar(x + 0.2, pv["amdahl_prediction"], 0.4, label="Amdahl prediction", color="#cccccc",
           edgecolor="#555555")
    for xi, (e, a) in enumerate(zip(pv["e2e_speedup"], pv["amdahl_prediction"])):
        ax.text(xi - 0.2, e, f"{e:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.text(xi + 0.2, a, f"{a:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x, pv["variant"])
    ax.set_ylabel("speedup over the baseline (sim clock)")
    ax.legend(fontsize=7, loc="lower right")
    _caption(ax, label)
    return fig


def bandit_choices(choices: pd.DataFrame, ax=None, label: str = ""):
    """Pulls of each SD strategy per batch-size bucket (``speculative.decisions.bandit_choices``
    tables concatenated over steps, as ``Ablation.bandit_choices`` gives them), with each arm's
    mean reward (tokens/s) written on its bar."""
    fig, ax = _axes(ax, (6.4, 3.8))
    if choices.empty:
        ax.text(0.5, 0.5, "no bandit decisions (SD never switched on)", ha="center",
                transform=ax.transAxes)
        return fig
    t = choices.groupby(["bucket", "arm"], sort=False).agg(
        pulls=("pulls", "sum"), tokens_per_s=("tokens_per_s", "mean")).reset_index()
    buckets = list(dict.fromkeys(t["bucket"]))
    arms = sorted(t["arm"].unique())
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        rows = t[t["arm"] == arm].set_index("bucket").reindex(buckets)
        xs = np.arange(len(buckets)) + (j - (len(arms) - 1) / 2) * width
        ax.bar(xs, rows["pulls"].fillna(0), width, label=arm)
        for xv, p, r in zip(xs, rows["pulls"], rows["tokens_per_s"]):
            if p > 0:
                ax.text(xv, p, f"{r:.0f}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(np.arange(len(buckets)), buckets)
    ax.set_xlabel("live batch size bucket")
    ax.set_ylabel("decode steps that ran the strategy")
    ax.legend(fontsize=7, title="strategy (mean tokens/s on bars)", title_fontsize=7)
    _caption(ax, label)
    return fig


def timeline_before_after(before, after, labels=("baseline", "TLT"), label: str = ""):
    """Two Gantt charts of the same RL step, one above the other on one time scale: the
    baseline's rollout and TLT's (SD in the tail, drafter training in the idle window)."""
    import matplotlib.pyplot as plt

    from .timeline import gantt
    n = max(before.num_workers, after.num_workers)
    fig = plt.figure(figsize=(11, 2 * (2.2 + 0.45 * n)), layout="constrained")
    end = max(before.makespan_s, after.makespan_s) * 1.01
    for sub, tl, name in zip(fig.subfigures(2, 1), (before, after), labels):
        ax = sub.subplots()
        gantt(tl, ax=ax)
        ax.set_xlim(0, end)
        ax.set_title(f"{name}: {ax.get_title()}", pad=24, fontsize=10)
    if label:
        fig.suptitle(label, fontsize=8, color="#555555")
    return fig
