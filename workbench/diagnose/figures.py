"""The diagnosis's figures, drawn from its tables alone (a report redraws them from its CSVs).

- ``step_split_figure``: each step's time stacked by part (rollout, reward, log-probs,
  update, other), the reading "what is the step made of" at a glance;
- ``live_batch_figure``: one step's live batch on each worker over the rollout, against the
  batch where SD stops paying, and the share of decode time at each live batch;
- ``remedies_figure``: each remedy's predicted end-to-end speedup with the simulator's error
  as a bar, bounds marked, the remedies the simulator does not model named at zero.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .steplog import PARTS  # noqa: E402

__all__ = ["step_split_figure", "live_batch_figure", "remedies_figure"]

COLORS = {"rollout_s": "#d62728", "reward_s": "#ff7f0e", "logprob_s": "#1f77b4",
          "update_s": "#2ca02c", "other_s": "#9e9e9e"}


def step_split_figure(diagnosis):
    """Stacked bars: each step's seconds by part (parts the logs lack are left out)."""
    s = diagnosis.steps
    fig, ax = plt.subplots(figsize=(8, 3.6))
    bottom = np.zeros(len(s))
    for part in (*PARTS, "other_s"):
        if part in s and s[part].notna().any():
            values = s[part].fillna(0).to_numpy()
            ax.bar(s["step"], values, bottom=bottom, color=COLORS[part],
                   label=part.removesuffix("_s"))
            bottom += values
    ax.set_xlabel("RL step")
    ax.set_ylabel("seconds")
    ax.set_title("Each step's time by part (from the logs)")
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1), fontsize=8)
    fig.tight_layout()
    return fig


def live_batch_figure(diagnosis):
    """Left: one step's live batch per worker over the simulated rollout, the SD threshold
    dashed; right: the share of decode time at each live batch. None without a rollout."""
    live, batch = diagnosis.live, diagnosis.batch
    if live is None or batch is None:
        return None
    threshold = diagnosis.summary.get("sd_threshold", 0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for w, rows in list(live.groupby("worker"))[:16]:
        t = np.repeat(np.r_[rows["start_s"].to_numpy(), rows["end_s"].iloc[-1]], 2)[1:-1]
        b = np.repeat(rows["batch_size"].to_numpy(), 2)
        left.plot(t / max(live["end_s"].max(), 1e-12), b, lw=1)
    if threshold:
        left.axhline(threshold, ls="--", color="k", lw=1)
        right.axvline(threshold, ls="--", color="k", lw=1)
        left.text(0.99, threshold, f" SD stops paying at {threshold}", ha="right", va="bottom",
                  fontsize=8)
    left.set_xlabel("time in the rollout (fraction of its makespan)")
    left.set_ylabel("live batch per worker")
    left.set_title(f"Live batch over step {int(live['step'].iloc[0])}'s rollout (simulated)")
    right.bar(batch["batch_size"], batch["share"], width=batch["batch_size"] * 0.25,
              color="#555")
    right.set_xscale("log")
    right.set_xlabel("live batch")
    right.set_ylabel("share of decode time")
    right.set_title("Decode time by live batch")
    fig.tight_layout()
    return fig


def remedies_figure(diagnosis):
    """Horizontal bars of each remedy's predicted end-to-end speedup (error bars: the
    simulator's validated error; a number whose model has no recorded check says so);
    remedies without a number are listed at 1 in grey."""
    r = diagnosis.remedies
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(r) + 1.2))
    value = r["predicted_e2e_speedup"].to_numpy(float)
    known = np.isfinite(value)
    err = np.where(known & np.isfinite(r["error"].to_numpy(float)),
                   value * r["error"].fillna(0).abs().to_numpy(float), 0)  # a signed error's size
    colors = ["#1f77b4" if m.startswith("simulated") else "#999" if not k else "#ff7f0e"
              for m, k in zip(r["method"], known)]
    ax.barh(r["remedy"], np.where(known, value - 1, 0), left=1, xerr=err, color=colors)
    unchecked = r["error_source"].fillna("").str.startswith("not validated").to_numpy()
    for y, (v, k, e, u) in enumerate(zip(value, known, err, unchecked)):
        ax.text(v + e if k else 1, y, (f" {v:.2f}x" + (" (error not validated)" if u else ""))
                if k else " not modelled / not decided", va="center", fontsize=8)
    ax.axvline(1, color="k", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("predicted end-to-end speedup over the logged steps (blue: simulated, "
                  "orange: bound from the logs)", fontsize=8)
    ax.set_title("What each remedy would buy on these steps")
    fig.tight_layout()
    return fig
