"""``workbench timeline export``: a run's saved rollout timelines as one Chrome trace, for
Perfetto UI or chrome://tracing (docs/chrome_trace.md)."""
from __future__ import annotations

import sys

__all__ = ["add"]


def add(sub) -> None:
    timeline = sub.add_parser("timeline", help="a run's saved rollout timelines")
    tsub = timeline.add_subparsers(dest="timeline_command", required=True)
    te = tsub.add_parser("export", help="write saved timelines as one Chrome trace-event JSON "
                         "for Perfetto UI or chrome://tracing (docs/chrome_trace.md)")
    te.add_argument("run_dir", metavar="RUN_DIR", help="a saved timeline's folder, or a folder "
                    "whose timelines lie in one folder of step<N> folders")
    te.add_argument("--step", type=int, nargs="+", default=None, metavar="N",
                    help="the RL steps to export, one after another (default: every one)")
    te.add_argument("--out", required=True, help="the trace file, e.g. trace.json")
    te.set_defaults(func=export)


def export(args) -> int:
    """Write the Chrome trace of a run's saved timelines; exit 2 when there is no timeline
    there or a step is not saved (one message, nothing written)."""
    from ..rollout.chrome_trace import timeline_folders, write_chrome_trace
    from ..rollout.timeline import Timeline
    try:
        folders = timeline_folders(args.run_dir, args.step)
        parts = {name: Timeline.load(folder) for name, folder in folders.items()}
        path = write_chrome_trace(parts, args.out)
    except (ValueError, OSError) as exc:
        print(f"workbench timeline export: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}: {len(parts)} timeline(s) ({', '.join(parts)}) one after another; "
          "open it in ui.perfetto.dev (Open trace file) or chrome://tracing")
    return 0
