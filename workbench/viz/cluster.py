"""Figures of notebook 10 (the cluster simulator), drawn from its tables, and its what-if
explorer.

``scaling`` is ``cluster.whatif.scaling_table`` (one row per N: the predicted step plain,
under the threshold rule and under the bandit's limit); ``validation`` is
``cluster.validation.validation_table`` (one row per held-out real run). The length fit takes
the recorded lengths and fitted models (anything with ``family``, ``ks`` and ``cdf(x)``, as
``cluster.LengthModel``). Every prediction is on the *sim* clock: N virtual workers in
parallel, each rollout followed by the policy update.
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter, ScalarFormatter

from ..checks import check_choice, check_int, check_positive
from .explorer import Explorer, legend_beside
from .timeline import _axes

__all__ = ["scaling_curves", "length_fit", "validation_scatter", "ClusterWhatIf"]

RULE_STYLES = {"plain": ("#4d4d4d", "-"), "tlt": ("#1f78b4", "-"), "bandit": ("#33a02c", "--")}
RULE_LABELS = {"plain": "plain decoding", "tlt": "TLT, threshold rule",
               "bandit": "TLT, bandit's limit"}
CLOCK_MARKERS = {"sim": ("o", "#1f78b4", "sim clock (local backend)"),
                 "wall": ("^", "#e31a1c", "wall clock (Ray actors)")}
SIM_NOTE = "sim clock: N virtual workers in parallel, then the policy update"


def _n_axis(ax, workers) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(workers), [str(int(n)) for n in workers])
    ax.set_xlabel("workers N")
    ax.grid(alpha=0.3)


def scaling_curves(scaling: pd.DataFrame, label: str = ""):
    """Against N: the predicted RL step time, the rollout's idle fraction, and TLT's
    end-to-end speedup (step time plain over TLT's), per rule."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), layout="constrained")
    n = scaling["workers"]
    for rule in ("plain", "tlt", "bandit"):
        color, style = RULE_STYLES[rule]
        # plain wide and pale underneath: a rule that never speculates lies on it, visibly
        look = dict(linewidth=5, alpha=0.35) if rule == "plain" else {}
        step = (scaling[f"step_s_{rule}"] if rule != "bandit" else
                scaling["makespan_bandit_s"] + scaling["update_s"])
        axes[0].plot(n, step, style, marker="o", color=color, label=RULE_LABELS[rule], **look)
        axes[1].plot(n, scaling[f"idle_fraction_{rule}"], style, marker="o", color=color,
                     label=RULE_LABELS[rule], **look)
    steps = {"tlt": scaling["e2e_speedup"],
             "bandit": scaling["step_s_plain"] / (scaling["makespan_bandit_s"]
                                                  + scaling["update_s"])}
    for rule, speedup in steps.items():
        color, style = RULE_STYLES[rule]
        axes[2].plot(n, speedup, style, marker="o", color=color, label=RULE_LABELS[rule])
    axes[2].axhline(1.0, color="black", linestyle=":", linewidth=1.2, label="no speedup")
    titles = ("predicted RL step time (s)", "rollout idle fraction", "TLT end-to-end speedup")
    for ax, title in zip(axes, titles):
        _n_axis(ax, n)
        ax.set_title(title, fontsize=10)
    axes[1].set_ylim(0, 1)
    legend_beside(axes[2])
    axes[0].legend(fontsize=7)
    fig.suptitle(" | ".join(t for t in (label, SIM_NOTE) if t), fontsize=8, color="#555555")
    return fig


def length_fit(lengths, models, ax=None, label: str = ""):
    """The recorded lengths' survival function P(length > x) on log-log axes against each
    fitted model's, the KS distance in its legend entry: the tail is where they part."""
    fig, ax = _axes(ax, (6.5, 3.8))
    x = np.sort(np.asarray(lengths, dtype=float))
    survival = 1 - np.arange(1, len(x) + 1) / len(x)
    ax.step(x[:-1], survival[:-1], where="post", color="black", linewidth=1.6,
            label=f"recorded ({len(x)} responses)")
    grid = np.geomspace(max(x.min(), 1), x.max(), 200)
    for model, style in zip(models, ("--", ":", "-.")):
        ax.plot(grid, 1 - model.cdf(grid), style, linewidth=1.6,
                label=f"{model.family} fit (KS {model.ks:.3f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("P(length > x)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax.set_title(label or "Response lengths against the fitted tails", fontsize=10)
    return fig


def validation_scatter(validation: pd.DataFrame, ax=None, label: str = ""):
    """Each held-out run's predicted makespan against its measured one, sim-clock and Ray
    wall-clock runs marked apart, with y = x (a perfect prediction) and each run named."""
    fig, ax = _axes(ax, (5.6, 4.6))
    top = float(max(validation["measured_s"].max(), validation["predicted_s"].max())) * 1.1
    ax.plot([0, top], [0, top], color="#7f7f7f", linestyle="--", label="y = x")
    for clock, rows in validation.groupby("clock"):
        marker, color, name = CLOCK_MARKERS.get(clock, ("s", "#6a3d9a", clock))
        ax.scatter(rows["measured_s"], rows["predicted_s"], marker=marker, color=color, s=45,
                   zorder=3, label=name)
        for _, r in rows.iterrows():
            ax.annotate(str(r["run"]), (r["measured_s"], r["predicted_s"]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_aspect("equal")
    ax.set_xlabel("measured makespan (s)")
    ax.set_ylabel("predicted makespan (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(label or "Held-out runs: predicted against measured", fontsize=10)
    return fig


class ClusterWhatIf(Explorer):
    """Sliders for the length tail, N, the threshold and the drafter's tau over the
    simulator: each move predicts one RL step again.

    Left: every worker's rollout busy time, sorted, plain and under the threshold rule, with
    both makespans. Right: GPU-hours of the RL step, plain, threshold rule and bandit's limit.
    The panel states makespans, idle fractions, speedups and the drafter steps the idle
    windows hold.

    Args:
        predict: ``predict(tail=, workers=, threshold=, tau=)`` -> a prediction with
            ``plain`` and ``tlt`` Timelines and ``summary()`` (``cluster.Prediction``; the
            notebook binds ``cluster.whatif.whatif_prediction`` to its lengths and costs).
        tail: the tail slider's (start, low, high): sigma of a log-normal length model.
        workers: the N offered (powers of two, say), and ``start_workers`` the first shown.
        max_threshold: the threshold slider's end (a worker's requests: SD everywhere).
        tau: the tau slider's (start, low, high).
    """

    figsize = (12.0, 4.4)

    def __init__(self, predict, tail: tuple, workers, start_workers: int, max_threshold: int,
                 threshold: int, tau: tuple):
        import ipywidgets as widgets
        self.predict = predict
        workers = [check_int("workers", n, 1) for n in workers]
        start_workers = check_choice("start_workers (one of workers)", start_workers, workers)
        max_threshold = check_int("max_threshold", max_threshold, 1)
        threshold = check_int(f"threshold (0 to max_threshold {max_threshold})", threshold, 0,
                              max_threshold)
        sliders = {}
        for name, (start, low, high) in (("tail", tail), ("tau", tau)):
            start, low, high = (check_positive(f"{name} {w}", v) for w, v in
                                zip(("start", "low", "high"), (start, low, high)))
            sliders[name] = widgets.FloatSlider(value=start, min=low, max=high,
                                                step=(high - low) / 40, description=name)
        controls = {"tail": sliders["tail"],
                    "workers": widgets.SelectionSlider(options=workers, value=start_workers,
                                                       description="N"),
                    "threshold": widgets.IntSlider(value=threshold, min=0, max=max_threshold,
                                                   description="threshold"),
                    "tau": sliders["tau"]}
        controls["tail"].tooltip = "sigma of the log-normal response lengths (larger: heavier)"
        controls["tau"].tooltip = "tokens per row per speculative step (drafter quality)"
        super().__init__(controls)

    def draw(self, fig, tail, workers, threshold, tau) -> str:
        p = self.predict(tail=tail, workers=workers, threshold=threshold, tau=tau)
        s = p.summary()
        left, right = fig.subplots(1, 2, width_ratios=[2, 1])
        for rule, timeline in (("plain", p.plain), ("tlt", p.tlt)):
            color, style = RULE_STYLES[rule]
            busy = np.sort(timeline.worker_summary()["busy_s"].to_numpy())
            left.plot(np.arange(len(busy)), busy, style, color=color, gid=f"busy-{rule}",
                      label=f"{RULE_LABELS[rule]}: makespan {timeline.makespan_s:.2f} s")
            left.axhline(timeline.makespan_s, color=color, linestyle=":", linewidth=1)
        left.set_xlabel("worker (sorted by busy time)")
        left.set_ylabel("rollout busy time (s, sim clock)")
        left.set_ylim(0, s["makespan_plain_s"] * 1.1)
        left.grid(alpha=0.3)
        left.legend(fontsize=7, loc="lower right")
        left.set_title(f"N={workers}, tail sigma {tail:.2f}, SD below batch {threshold} "
                       f"at tau {tau:.2f}", fontsize=10)
        rules = ["plain", "tlt", "bandit"]
        hours = [s["gpu_hours_plain"], s["gpu_hours_tlt"], s["gpu_hours_bandit"]]
        for i, (rule, h) in enumerate(zip(rules, hours)):
            bar = right.bar(i, h, color=RULE_STYLES[rule][0])[0]
            bar.set_gid(f"gpu-hours-{rule}")
        right.set_xticks(range(3), ["plain", "threshold", "bandit"])
        right.set_ylabel("GPU-hours per RL step")
        right.set_title("GPU-hours (rollout + update)", fontsize=10)
        return _panel(s)


def _panel(s: dict) -> str:
    """The side panel: the predicted step under each rule, in numbers."""
    return (f"<b>makespan</b> plain {s['makespan_plain_s']:.3f} s, threshold rule "
            f"{s['makespan_tlt_s']:.3f} s, bandit {s['makespan_bandit_s']:.3f} s "
            f"(sim clock)<br><b>idle fraction</b> plain {s['idle_fraction_plain']:.2f}, "
            f"threshold rule {s['idle_fraction_tlt']:.2f}<br><b>speedup</b> rollout "
            f"{s['sd_speedup']:.2f}×, end to end {s['e2e_speedup']:.2f}× (bandit's limit: "
            f"{s['sd_speedup_bandit']:.2f}× rollout)<br><b>drafter steps</b> in the idle "
            f"windows: {s['drafter_steps']}<br><i>{html.escape(SIM_NOTE)}; a model, not a "
            "run</i>")
