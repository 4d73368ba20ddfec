"""Figures of a task and a policy on it: how long its answers are and where accuracy drops.

Inputs are plain lengths and the tables of :class:`~workbench.evaluate.EvalReport`, so the
figures redraw from saved results. Each draws on ``ax`` when given and returns the figure.
"""
from __future__ import annotations

import numpy as np

from .timeline import _axes, mark_percentiles

__all__ = ["length_distributions", "accuracy_by_bucket"]

BUCKET_COLUMNS = ("problems", "accuracy", "eos_rate")


def _finite(lengths) -> np.ndarray:
    """Token counts as floats, NaN (a problem without a reference) left out."""
    values = np.asarray(list(lengths), dtype=float)
    return values[np.isfinite(values)]


def length_distributions(reference_lengths, generated_lengths, ax=None, bins=40):
    """Reference vs generated response lengths on shared bins, p50/p90/p99 marked for each.

    Shows whether the policy's tail is the task's own (long references) or its own making.
    Problems without a reference (NaN, as in a JSONL task of ``{"prompt", "answer"}``) are left
    out; when none has one, the generated lengths are drawn alone and the title says so.
    """
    ref, gen = _finite(reference_lengths), _finite(generated_lengths)
    if gen.size == 0:
        raise ValueError("no generated lengths to draw: pass the token count of at least one "
                         "response (EvalReport.table['response_tokens'])")
    fig, ax = _axes(ax, (8, 4.5))
    edges = np.histogram_bin_edges(np.concatenate([ref, gen]), bins=bins)
    series = (("reference", ref, "#4c72b0"), ("generated", gen, "#dd8452"))
    for name, lengths, color in (s for s in series if s[1].size):
        ax.hist(lengths, bins=edges, color=color, alpha=0.45, gid=f"{name}-hist",
                label=f"{name} ({len(lengths)})")
        mark_percentiles(ax, lengths, color=color, prefix=f"{name}-")
    ax.set_xlabel("response tokens")
    ax.set_ylabel("problems")
    ax.set_title("Response lengths: reference vs generated" if ref.size else
                 "Response lengths: generated (the task has no reference traces)")
    ax.legend(fontsize=8, ncol=2 if ref.size else 1)
    return fig


def accuracy_by_bucket(bucket_table, ax=None):
    """Accuracy per length bucket (``EvalReport.by_bucket()``), problems counted on each bar.

    The EOS rate is drawn as markers: a bucket failing by truncation shows a low EOS rate.
    """
    missing = [c for c in BUCKET_COLUMNS if c not in bucket_table.columns]
    buckets = [c for c in bucket_table.columns if c.endswith(" bucket")]
    if missing or not buckets:
        raise ValueError(f"bucket_table needs a '<column> bucket' column and {BUCKET_COLUMNS} "
                         f"(EvalReport.by_bucket() returns them); got {list(bucket_table.columns)}")
    fig, ax = _axes(ax, (7, 4))
    x = np.arange(len(bucket_table))
    bars = ax.bar(x, bucket_table["accuracy"], color="#4c72b0", label="accuracy",
                  gid="accuracy-bars")
    for bar in bars:
        bar.set_gid("accuracy-bar")
    ax.bar_label(bars, labels=[f"n={n}" for n in bucket_table["problems"]], fontsize=8,
                 padding=2)
    ax.plot(x, bucket_table["eos_rate"], "o", color="black", markersize=5, label="EOS rate",
            gid="eos-rate")
    ax.set_xticks(x, bucket_table[buckets[0]], fontsize=8)
    ax.set_xlabel(buckets[0].replace("_", " "))
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("accuracy")
    ax.set_title("Accuracy by length bucket")
    # beside the axes: inside, it would cover a bucket's EOS marker near 1
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig
