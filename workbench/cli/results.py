"""``workbench results table|record``: results with their provenance
(``benchmarks/results/*.json``) and the table ``RESULTS.md`` generated from them."""
from __future__ import annotations

import sys

__all__ = ["add"]


def add(sub) -> None:
    results = sub.add_parser("results", help="results with their provenance "
                             "(benchmarks/results/*.json) and the table RESULTS.md")
    rsub = results.add_subparsers(dest="results_command", required=True)
    rt = rsub.add_parser("table", help="regenerate RESULTS.md from the result files")
    rt.add_argument("--folder", default="benchmarks/results", help="the result files' folder")
    rt.add_argument("--out", default="RESULTS.md", help="the table's file")
    rt.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when --out differs from what --folder gives")
    rt.set_defaults(func=table)
    rr = rsub.add_parser("record", help="write a result file from a notebook run's "
                         "metrics.json (flat scalars; x, x_q25, x_q75, x_min, x_max, x_n form "
                         "one figure)")
    rr.add_argument("name", help="the result's name: the file <folder>/<name>.json")
    rr.add_argument("--question", required=True, help="the question the figures answer")
    rr.add_argument("--from", dest="metrics", required=True, metavar="METRICS_JSON",
                    help="the run's metrics.json, e.g. runs/tlt/04_tlt_rl/metrics.json")
    rr.add_argument("--keys", required=True, help="comma-separated metrics, one figure each")
    rr.add_argument("--command", required=True,
                    help="the exact command that produced the run (the papermill command)")
    rr.add_argument("--clock", default=None, help="the figures' clock, when the metrics "
                    "hold no 'clock' (wall, sim-thread-cpu, sim-wall, none)")
    rr.add_argument("--disturbed-share", type=float, default=None,
                    help="when the metrics hold no 'disturbed_share' (default: not measured)")
    rr.add_argument("--notebook", default=None, metavar="EXECUTED_IPYNB",
                    help="the executed notebook whose papermill parameters go into the result "
                    "(default: run.json beside the metrics, else notebook.ipynb beside them, "
                    "else <run folder>.ipynb)")
    rr.add_argument("--folder", default="benchmarks/results", help="where the file goes")
    rr.set_defaults(func=record)


def table(args) -> int:
    """Write (or with ``--check`` compare) RESULTS.md from the result files: exit 0 when written
    or up to date, 1 when ``--check`` finds it stale, 2 when a result file is refused."""
    from pathlib import Path

    from ..atomic import write_text
    from ..provenance_table import results_table
    try:
        text = results_table(args.folder)
    except (ValueError, OSError) as exc:
        print(f"workbench results table: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if args.check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != text:
            why = "does not exist" if current is None else "differs from"
            print(f"{out} {why} what {args.folder} gives; regenerate it with: workbench "
                  f"results table --folder {args.folder} --out {out}", file=sys.stderr)
            return 1
        print(f"{out} is up to date with {args.folder}")
        return 0
    write_text(out, text)
    print(f"wrote {out} from {args.folder}")
    return 0


def record(args) -> int:
    """Write a result file from a notebook run's metrics.json and its parameters, with the
    commit, machine and date of the run: from the pipeline's run.json beside it, else from
    the provenance.json ``write_metrics`` wrote, else this checkout's and now; exit 2 for
    input that cannot make one."""
    import json
    from pathlib import Path

    from ..machine import machine
    from ..provenance import clock_of, figures_from_metrics, run_parameters, write_result
    from ..results import PROVENANCE
    try:
        path = Path(args.metrics)
        metrics = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(metrics, dict):
            raise ValueError(f"{path} must hold a JSON object of metrics")
        figures = figures_from_metrics(metrics, [k.strip() for k in args.keys.split(",")
                                                 if k.strip()])
        clock = args.clock if args.clock is not None else clock_of(metrics)
        if clock is None:
            raise ValueError(f"{path} has no 'clock' metric (or a sim clock without "
                             "'sim_seconds'); pass --clock")
        share = (args.disturbed_share if args.disturbed_share is not None
                 else metrics.get("disturbed_share"))
        run, written = path.with_name("run.json"), path.with_name(PROVENANCE)
        box, git, date = machine(), None, None
        if run.is_file():  # a pipeline run: its own commit, versions and end time
            record = json.loads(run.read_text(encoding="utf-8"))
            git = record.get("git") or {"commit": None, "dirty": None}
            versions = record.get("versions") or {}
            box.update({k: versions[k] for k in ("torch", "transformers", "python")
                        if versions.get(k)})
            date = record.get("ended_at")
        elif written.is_file():  # a notebook run of its own: what write_metrics recorded
            record = json.loads(written.read_text(encoding="utf-8"))
            git, box, date = record["git"], record["machine"], record["written_at"]
        parameters = run_parameters(path, args.notebook)
        out = write_result(args.name, args.question, figures, clock=clock,
                           disturbed_share=share, command=args.command, folder=args.folder,
                           machine_info=box, git=git, date=date, parameters=parameters)
    except (ValueError, OSError) as exc:
        print(f"workbench results record: error: {exc}", file=sys.stderr)
        return 2
    print(f"recorded {len(figures)} figures of {args.metrics} in {out}; regenerate the table "
          "with: workbench results table")
    return 0
