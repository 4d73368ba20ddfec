"""``workbench pipeline run|report``: run notebook pipelines with papermill, and write one
static HTML page of their runs."""
from __future__ import annotations

import sys

from .arguments import count

__all__ = ["add"]


def add(sub) -> None:
    pipe = sub.add_parser("pipeline", help="run notebook pipelines with papermill")
    psub = pipe.add_subparsers(dest="pipeline_command", required=True)
    pr = psub.add_parser("run", help="run every notebook x parameter set of a pipeline YAML")
    pr.add_argument("yaml", help="pipeline file, e.g. pipelines/quickstart.yaml")
    pr.add_argument("--redo", action="store_true", help="rerun runs that already finished")
    pr.add_argument("--only", action="append", metavar="ENTRY", default=None,
                    help="run only this entry (its name; repeatable); the other entries' "
                    "finished runs stay in the results")
    pr.add_argument("--runs-root", default="runs", help="where runs/<pipeline>/<run>/ go")
    pr.add_argument("--jobs", type=count("jobs"), default=1,
                    help="runs at a time, the cores split among their kernels (default 1)")
    pr.add_argument("--ray", action="store_true",
                    help="run every run as a Ray task, in parallel: on a local Ray "
                    "(127.0.0.1 only), or on the cluster at --ray-address / $RAY_ADDRESS")
    pr.add_argument("--ray-address", default=None,
                    help="with --ray: a running cluster's host:port (its nodes need the "
                    "project at the same path and the runs root on a shared filesystem)")
    pr.add_argument("--threads", type=count("threads"), default=None,
                    help="with --ray: each kernel's torch threads, and the Ray CPUs its task "
                    "holds (default 1)")
    pr.add_argument("--report-to", choices=["none", "tensorboard"], default="none",
                    help="per-step scalars of the notebooks that take report_to (04, 06, 09, "
                         "11): 'tensorboard' writes event files under each run's folder")
    pr.set_defaults(func=run)
    rp = psub.add_parser("report", help="write one static HTML page of a pipeline's runs")
    rp.add_argument("folder", help="the pipeline's run folder, e.g. runs/quickstart")
    rp.add_argument("--out", default=None, help="HTML file (default: <folder>/report.html)")
    rp.set_defaults(func=report)


def run(args) -> int:
    """Exit 0 when every run is ok, 1 when a run failed (recorded in its run.json), 2 for a
    pipeline that cannot run as written, or Ray arguments that cannot work (an address that
    does not answer; one message, nothing run or written)."""
    from ..pipeline import run_pipeline
    try:
        table = run_pipeline(args.yaml, redo=args.redo, runs_root=args.runs_root, jobs=args.jobs,
                             ray=args.ray, ray_address=args.ray_address, threads=args.threads,
                             only=args.only, report_to=args.report_to)
    except (ValueError, ConnectionError) as exc:  # PipelineError is a ValueError
        print(f"workbench pipeline run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench pipeline run: interrupted; finished runs are kept and rerunning "
              "resumes from them", file=sys.stderr)
        return 130
    return 0 if (table["status"] == "ok").all() else 1


def report(args) -> int:
    """Exit 0 with the report written, 2 when the folder holds no pipeline results."""
    from ..report import write_report
    try:
        path = write_report(args.folder, args.out)
    except FileNotFoundError as exc:
        print(f"workbench pipeline report: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
