"""Draw a rollout Chrome trace (``workbench timeline export``) as Perfetto lays it out: one
block of rows per worker process (its counter, its steps, idle and drafter-training threads,
then one thread per request), slices as bars. Drawn with matplotlib from the trace JSON alone,
because no trace viewer runs offline here; it is not a screenshot of Perfetto.

    workbench timeline export runs/issue36/04_quiet1/timelines/tlt-seed0 --step 7 \\
        --out /tmp/tlt_step7.json
    python docs/figures/chrome_trace_figure.py /tmp/tlt_step7.json --workers 4 12 13 \\
        --out docs/figures/chrome_trace_tlt_step.png
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"prefill": "#4c72b0", "decode": "#8fb0d8", "draft": "#dd8452", "verify": "#55a868",
          "drafter_train": "#8172b3", "drafter_train (preempted)": "#c44e52",
          "idle": "#e5e5e5", "failed": "#222222", "request": "#d3d9e0"}


def _color(event) -> str:
    name = event["name"].replace(" (rerun)", "")
    return COLORS.get(name, COLORS["request"] if event["cat"] == "request" else "#999999")


def draw(trace: dict, workers: list[int], out: str) -> None:
    events = trace["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    slices, counters = defaultdict(list), defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["pid"] - 1 in workers:
            slices[(e["pid"], e["tid"])].append(e)
        elif e["ph"] == "C" and e["name"] == "active batch" and e["pid"] - 1 in workers:
            counters[e["pid"]].append((e["ts"], e["args"]["batch_size"]))
    rows = []  # (label, kind, key) top to bottom
    for w in workers:
        pid = w + 1
        rows.append((f"worker {w} · active batch", "counter", pid))
        rows += [(f"  {names[key]}", "thread", key) for key in sorted(slices)
                 if key[0] == pid]
    fig, ax = plt.subplots(figsize=(12, 0.22 * len(rows) + 1.2), layout="constrained")
    peak = max((b for c in counters.values() for _, b in c), default=1) or 1
    for y, (label, kind, key) in enumerate(rows):
        if kind == "counter":
            ts, values = zip(*sorted(counters[key]))
            ax.fill_between([t / 1e3 for t in ts], y + 0.45, [y + 0.45 - 0.85 * v / peak
                                                             for v in values],
                            step="post", color="#6a9fd4", alpha=0.6, linewidth=0)
            ax.axhline(y - 0.5, color="#999999", linewidth=0.6)
            continue
        for e in slices[key]:
            ax.barh(y, max(e["dur"], 1) / 1e3, left=e["ts"] / 1e3, height=0.8,
                    color=_color(e), edgecolor="white", linewidth=0.2)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=6)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("time (ms, the trace's ts; sim clock)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    name = trace["metadata"]["timelines"][0]["name"]
    ax.set_title(f"Chrome trace of TLT step {name}, workers {workers} (drawn with matplotlib "
                 "from the trace JSON, laid out as Perfetto shows it)", fontsize=9)
    fig.savefig(out, dpi=130)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--workers", type=int, nargs="+", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with open(args.trace, encoding="utf-8") as f:
        draw(json.load(f), args.workers, args.out)


if __name__ == "__main__":
    main()
