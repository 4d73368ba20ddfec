"""Figures of one rollout step, drawn from its :class:`~workbench.rollout.timeline.Timeline` alone.

Every function takes a ``Timeline`` or the run folder it was saved in, so a figure can be
redrawn from a run's files without the engine. Each draws on ``ax`` when given (a figure is
created only when it is not) and returns the figure, so notebooks can lay figures out freely.
Every time axis names its clock (docs/design.md, "Every time figure names its clock").
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from ..checks import check_int
from ..rollout.timeline import STEP_KINDS, Timeline
from ..rollout.timeline_stats import length_percentiles

__all__ = ["gantt", "length_histogram", "active_batch", "save_figure", "mark_percentiles"]

# Light colors: steps are the background the request bars are read against.
KIND_COLORS = {"prefill": "#fdbf6f", "decode": "#a6cee3", "draft": "#cab2d6",
               "verify": "#b2df8a", "compile": "#ffff99", "drafter_train": "#fb9a99",
               "train": "#e0e0e0", "failed": "#e31a1c"}
PERCENTILE_STYLES = {50: "-", 90: "--", 99: ":"}
IDLE_STYLE = {"facecolor": "#f2f2f2", "edgecolor": "#7f7f7f", "hatch": "///", "linewidth": 0}
TAIL_Q = 0.9


def _as_timeline(x) -> Timeline:
    """A Timeline as is, or the one saved in a run folder; figures never need an engine."""
    if isinstance(x, Timeline):
        return x
    if isinstance(x, (str, os.PathLike)):
        return Timeline.load(x)
    raise TypeError(f"expected a Timeline or a run folder path, got {type(x).__name__} "
                    "(for a rollout result pass result.timeline)")


def _axes(ax, figsize):
    """``ax`` and its figure, or a new constrained-layout figure when ``ax`` is None."""
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, layout="constrained")
        return fig, ax
    return ax.figure, ax


def _caption(ax, *lines: str) -> None:
    """The figure's small grey caption above the axes: ``lines`` (empty ones skipped), each
    wrapped to the figure's width (~17 characters an inch at its 7 points), so that a long run
    label never widens the figure and squeezes the axes."""
    width = max(40, int(ax.figure.get_figwidth() * 17))
    text = "\n".join(textwrap.fill(line, width) for line in lines if line)
    if text:
        ax.set_title(text, fontsize=7, loc="left", color="#555555")


def _time_label(timeline: Timeline) -> str:
    return f"time (s, {timeline.clock} clock)"


def _tail_start_s(timeline: Timeline) -> float:
    """When ``TAIL_Q`` of the requests had finished, from the timeline's own tail share."""
    return timeline.makespan_s * (1.0 - timeline.tail_share(TAIL_Q))


def pack_lanes(starts, ends, max_lanes: int) -> np.ndarray:
    """Lane of each interval: greedy interval-graph coloring (first lane free by its start).

    When more lanes are needed than ``max_lanes`` they fold onto ``lane % max_lanes``; in a
    wave (all requests start together) lanes are ranks by end time, so requests sharing a lane
    end far apart and each end stays visible.
    """
    order = np.lexsort((ends, starts))
    lane_end: list[float] = []
    lanes = np.empty(len(order), dtype=int)
    for i in order:
        free = next((k for k, e in enumerate(lane_end) if e <= starts[i]), len(lane_end))
        if free == len(lane_end):
            lane_end.append(ends[i])
        lane_end[free] = ends[i]
        lanes[i] = free
    return lanes % max_lanes


def _merge_runs(starts, ends) -> list[tuple[float, float]]:
    """``(start, width)`` of maximal runs of touching intervals (sorted by start)."""
    runs: list[list[float]] = []
    for s, e in zip(starts, ends):
        if runs and s <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], e)
        else:
            runs.append([s, e])
    return [(s, e - s) for s, e in runs]


def _draw_steps(ax, timeline: Timeline, kinds=STEP_KINDS) -> list[str]:
    """Shade each worker's steps of ``kinds`` behind its band; the kinds drawn, in schema order."""
    steps = timeline.steps[timeline.steps["kind"].isin(kinds)].sort_values(["worker", "start_s"])
    for (worker, kind), s in steps.groupby(["worker", "kind"]):
        ax.broken_barh(_merge_runs(s["start_s"], s["end_s"]), (worker + 0.04, 0.92),
                       facecolor=KIND_COLORS[kind], linewidth=0, zorder=1,
                       gid=f"steps-{kind}-w{worker}")
    return [k for k in STEP_KINDS if k in set(steps["kind"])]


def _draw_idle(ax, timeline: Timeline) -> list[str]:
    """Hatch each worker's bubble after its last rollout step; the tick label per worker."""
    m = timeline.makespan_s
    last_end = timeline.rollout_ends()
    labels = []
    for w in range(timeline.num_workers):
        start = float(last_end[w])
        ax.broken_barh([(start, m - start)], (w + 0.04, 0.92), zorder=0.5,
                       gid=f"idle-w{w}", **IDLE_STYLE)
        share = (m - start) / m if m > 0 else 0.0
        labels.append(f"worker {w}\nidle {m - start:.2f} s ({share:.0%})")
    return labels


def _draw_requests(ax, timeline: Timeline, max_lanes: int) -> PolyCollection:
    """One bar per request in its worker's band, colored by response length.

    Longer requests are drawn first so a shorter one sharing its lane sits on top of it.
    """
    req = timeline.requests
    verts, colors = [], []
    for w, r in req.groupby("worker"):
        starts, ends = r["start_s"].to_numpy(float), r["end_s"].to_numpy(float)
        lanes = pack_lanes(starts, ends, max_lanes)
        n_lanes = lanes.max() + 1
        height = 0.76 / n_lanes
        for i in np.argsort(starts - ends, kind="stable"):
            y0 = w + 0.12 + lanes[i] * height
            y1 = y0 + 0.8 * height
            verts.append([(starts[i], y0), (starts[i], y1), (ends[i], y1), (ends[i], y0)])
            colors.append(r["response_tokens"].iloc[i])
    bars = PolyCollection(verts, array=np.asarray(colors, dtype=float), cmap="viridis",
                          edgecolor="white", linewidth=0.3, zorder=2, gid="requests")
    ax.add_collection(bars)
    return bars


def gantt(timeline, ax=None, max_lanes_per_worker: int = 16, kinds=None):
    """Per-worker Gantt chart of one rollout: where the long tail leaves workers idle.

    Each worker is a band: its steps shaded by kind, one bar per request (packed into at most
    ``max_lanes_per_worker`` sub-lanes, colored by response tokens), and the idle bubble from
    its last rollout step to the makespan hatched, its seconds and share in the tick label.
    A dashed line marks when 90% of requests had finished (start of the tail). ``kinds``
    (default: all) are the step kinds shaded; hiding some changes no number, since idle time,
    tail and makespan always come from the whole timeline. Returns the figure.
    """
    check_int("max_lanes_per_worker", max_lanes_per_worker, 1)
    kinds = STEP_KINDS if kinds is None else tuple(kinds)
    unknown = sorted(set(kinds) - set(STEP_KINDS))
    if unknown:
        raise ValueError(f"unknown step kind(s) {unknown}; accepted: {list(STEP_KINDS)}")
    tl = _as_timeline(timeline)
    n = tl.num_workers
    fig, ax = _axes(ax, (11, 1.6 + 1.0 * n))
    kinds = _draw_steps(ax, tl, kinds)
    ticks = _draw_idle(ax, tl)
    bars = _draw_requests(ax, tl, max_lanes_per_worker)
    fig.colorbar(bars, ax=ax, label="response tokens", pad=0.01)
    tail = ax.axvline(_tail_start_s(tl), color="crimson", linestyle="--", linewidth=1.2,
                      zorder=3, gid="tail-start")

    ax.set_xlim(0, tl.makespan_s * 1.01 or 1.0)
    ax.set_ylim(n, 0)
    ax.set_yticks(np.arange(n) + 0.5, ticks, fontsize=8)
    ax.set_xlabel(_time_label(tl))
    ax.set_title(f"Rollout of {len(tl.requests)} requests on {n} worker{'s' * (n > 1)}: idle "
                 f"{tl.idle_fraction():.0%}, tail share {tl.tail_share(TAIL_Q):.0%}, makespan "
                 f"{tl.makespan_s:.2f} s", pad=24)
    handles = [Patch(color=KIND_COLORS[k], label=k) for k in kinds]
    handles += [Patch(label="idle", **IDLE_STYLE),
                Line2D([], [], color=tail.get_color(), linestyle="--",
                       label=f"{TAIL_Q:.0%} of requests done")]
    # between the title and the axes: a fixed offset in points, whatever the figure's height
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles),
              fontsize=8, frameon=False, borderaxespad=0.2)
    return fig


def mark_percentiles(ax, lengths, color="black", prefix="") -> list[Line2D]:
    """Vertical lines at p50/p90/p99 of ``lengths``, their values in the legend labels."""
    lines = []
    for key, value in length_percentiles(lengths, tuple(PERCENTILE_STYLES)).items():
        q = int(key.removeprefix("length_p"))
        lines.append(ax.axvline(value, color=color, linestyle=PERCENTILE_STYLES[q],
                                linewidth=1.3, gid=f"{prefix}p{q}",
                                label=f"{prefix.replace('-', ' ')}p{q} = {value:.0f}"))
    return lines


def length_histogram(timeline_or_lengths, ax=None, bins=40, log: bool = False):
    """Histogram of response lengths with p50/p90/p99 marked: how long the tail is.

    Takes a Timeline, a run folder, or a plain sequence of token counts. ``log`` puts the
    counts on a log scale, where the few longest responses become visible.
    """
    if isinstance(timeline_or_lengths, (Timeline, str, os.PathLike)):
        lengths = _as_timeline(timeline_or_lengths).requests["response_tokens"].to_numpy()
    else:
        lengths = np.asarray(list(timeline_or_lengths), dtype=float)
    fig, ax = _axes(ax, (7, 4))
    ax.hist(lengths, bins=bins, color="#4c72b0", alpha=0.8, gid="length-hist")
    mark_percentiles(ax, lengths, color="crimson")
    if log:
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")  # counts, not powers of ten
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("response tokens")
    ax.set_ylabel("requests")
    ax.set_title(f"Response lengths ({len(lengths)} requests)")
    ax.legend(fontsize=9)
    return fig


def _batch_curve(steps) -> tuple[list[float], list[float]]:
    """Step-function points of one worker's active batch: 0 in gaps and after its last step."""
    xs, ys, prev_end = [], [], 0.0
    for start, end, size in steps[["start_s", "end_s", "batch_size"]].itertuples(index=False):
        if xs and start > prev_end:
            xs.append(prev_end)
            ys.append(0)
        xs.append(start)
        ys.append(size)
        prev_end = end
    if xs:
        xs.append(prev_end)
        ys.append(0)
    return xs, ys


def active_batch(timeline, ax=None):
    """Active batch size over time, one line per worker: how fast batches drain into the tail."""
    tl = _as_timeline(timeline)
    fig, ax = _axes(ax, (9, 4))
    table = tl.active_batch().sort_values(["worker", "start_s"])
    for w, steps in table.groupby("worker"):
        xs, ys = _batch_curve(steps)
        ax.step(xs, ys, where="post", linewidth=1.4, label=f"worker {w}",
                gid=f"active-batch-w{w}")
    ax.set_xlim(0, tl.makespan_s * 1.01 or 1.0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(_time_label(tl))
    ax.set_ylabel("active batch (requests)")
    ax.set_title("Active batch per worker")
    ax.legend(fontsize=8, ncol=max(1, tl.num_workers // 4))
    return fig


def save_figure(fig, path) -> Path:
    """Write ``fig`` as a PNG atomically (temporary file, then rename); creates the folder.

    A reader (or an interrupted run) never sees a half-written image.
    """
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"save_figure writes PNG files; got {str(path)!r} (use a .png name)")
    from ..atomic import atomic_file
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    return path
