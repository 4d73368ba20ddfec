"""``workbench`` command line (also ``python -m workbench``)."""
from __future__ import annotations

import argparse
import sys

from .checks import check_int, check_positive
from .plugins import load_plugins

__all__ = ["main"]


def _zoo_train(args) -> int:
    from .zoo import RECIPES
    if args.name not in RECIPES:
        print(f"unknown zoo recipe {args.name!r}; accepted: {sorted(RECIPES)}", file=sys.stderr)
        return 2
    RECIPES[args.name](out_dir=args.out, seed=args.seed, minutes=args.minutes)
    return 0


def _drafter_train(args) -> int:
    """Exit 0 with the drafter saved and its tau printed, 2 for arguments that cannot work
    (one message; nothing loaded, trained or written)."""
    from pathlib import Path

    from .models import load_model, resolve_model_path
    from .speculative.cache import task_key
    from .speculative.fit import FitConfig, fit_drafter_lm, fit_eagle, split_prompts
    config = FitConfig(minutes=args.minutes, seed=args.seed)
    try:
        config.validate()
        resolve_model_path(args.model)
        task_key(args.task)
        split_prompts(args.task, config.train_prompts, config.heldout_prompts, config.seed)
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise FileExistsError(f"--out {args.out!r} is an existing file; pass a folder")
    except (ValueError, OSError) as exc:
        print(f"workbench drafter train: error: {exc}", file=sys.stderr)
        return 2
    policy, tokenizer = load_model(args.model)
    fitter = fit_eagle if args.kind == "eagle" else fit_drafter_lm
    fitted = fitter(policy, tokenizer, args.task, args.out, config)
    print(f"tau {fitted.tau:.3f} (acceptance length, greedy, k={config.k}) on "
          f"{fitted.provenance['heldout_prompts']} held-out prompts of {args.task}; "
          f"{args.kind} drafter saved to {fitted.path}")
    return 0


def _ablation_merge(args) -> int:
    """Exit 0 with the merged folder written, 2 when the folders cannot be merged (nothing
    written)."""
    from .rl.ablation.store import merge_ablations
    try:
        path = merge_ablations(args.sources, args.into)
    except (ValueError, OSError) as exc:
        print(f"workbench ablation merge: error: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(args.sources)} ablation folders into {path}; run the ablation with "
          "every seed and this checkpoint_dir")
    return 0


def _ablation_status(args) -> int:
    """Print how far each folder has got and the held-out accuracy so far; exit 2 when a
    folder is not an ablation's."""
    from .rl.ablation.store import ablation_progress
    try:
        steps, accuracy = ablation_progress(args.folders)
    except (ValueError, OSError) as exc:
        print(f"workbench ablation status: error: {exc}", file=sys.stderr)
        return 2
    for folder, done in steps.items():
        print(f"{folder}: {done} RL steps checkpointed")
    if accuracy.empty:
        print("no held-out evaluation yet")
        return 0
    cells = accuracy.assign(cell=[
        f"{a:.3f}" + ("" if n < 2 else f" ± {sd:.3f}") + f" ({n})"
        for a, sd, n in zip(accuracy["accuracy"], accuracy["accuracy_sd"], accuracy["seeds"])])
    table = cells.pivot(index="variant", columns="step", values="cell")
    table = table.reindex(list(dict.fromkeys(accuracy["variant"]))).fillna("")
    print("held-out accuracy after each evaluated RL step: mean ± sd (seeds)")
    print(table.rename_axis(index=None, columns="step").to_string())
    return 0


def _pipeline_report(args) -> int:
    """Exit 0 with the report written, 2 when the folder holds no pipeline results."""
    from .report import write_report
    try:
        path = write_report(args.folder, args.out)
    except FileNotFoundError as exc:
        print(f"workbench pipeline report: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def _pipeline_run(args) -> int:
    """Exit 0 when every run is ok, 1 when a run failed (recorded in its run.json), 2 for a
    pipeline that cannot run as written, or Ray arguments that cannot work (an address that
    does not answer; one message, nothing run or written)."""
    from .pipeline import run_pipeline
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


def _results_table(args) -> int:
    """Write (or with ``--check`` compare) RESULTS.md from the result files: exit 0 when written
    or up to date, 1 when ``--check`` finds it stale, 2 when a result file is refused."""
    from pathlib import Path

    from .atomic import write_text
    from .provenance import results_table
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


def _results_record(args) -> int:
    """Write a result file from a notebook run's metrics.json (and the run.json beside it, for
    its commit, package versions and date); exit 2 for input that cannot make one."""
    import json
    from pathlib import Path

    from .machine import machine
    from .provenance import clock_of, figures_from_metrics, write_result
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
        run = path.with_name("run.json")
        box, git, date = machine(), None, None
        if run.is_file():  # a pipeline run: its own commit, versions and end time
            record = json.loads(run.read_text(encoding="utf-8"))
            git = record.get("git") or {"commit": None, "dirty": None}
            versions = record.get("versions") or {}
            box.update({k: versions[k] for k in ("torch", "transformers", "python")
                        if versions.get(k)})
            date = record.get("ended_at")
        out = write_result(args.name, args.question, figures, clock=clock,
                           disturbed_share=share, command=args.command, folder=args.folder,
                           machine_info=box, git=git, date=date)
    except (ValueError, OSError) as exc:
        print(f"workbench results record: error: {exc}", file=sys.stderr)
        return 2
    print(f"recorded {len(figures)} figures of {args.metrics} in {out}; regenerate the table "
          "with: workbench results table")
    return 0


def _timeline_export(args) -> int:
    """Write the Chrome trace (Perfetto UI, chrome://tracing) of a run's saved timelines; exit
    2 when there is no timeline there or a step is not saved (one message, nothing written)."""
    from .rollout.chrome_trace import timeline_folders, write_chrome_trace
    from .rollout.timeline import Timeline
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


def _positive_minutes(text: str) -> float:
    """``--minutes`` as a number, under the shared checks' policy (a finite number > 0);
    argparse turns the error into its usage message and exit code 2."""
    try:
        value = float(text)
    except ValueError:
        value = text  # not a number: refused below with the text as typed
    try:
        return check_positive("minutes", value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(name: str):
    """``--<name>`` as a count >= 1 (the shared checks' message, through argparse's usage)."""
    def parse(text: str) -> int:
        try:
            return check_int(name, int(text) if text.lstrip("-").isdigit() else text, 1)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


_jobs, _threads = _count("jobs"), _count("threads")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__)
    p.add_argument("--plugins", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="a .py file or importable module that registers drafters, decoding "
                        "arms, RL variants or importance scores, loaded before the command "
                        "(repeatable; docs/extending.md). A pipeline's notebooks take theirs "
                        "as the 'plugins' parameter in its YAML")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_zoo, _add_drafter, _add_ablation, _add_pipeline, _add_results,
                _add_timeline, _add_diagnose):
        add(sub)
    return p


def _add_zoo(sub) -> None:
    zoo = sub.add_parser("zoo", help="build the embedded models from their seeded recipes")
    zsub = zoo.add_subparsers(dest="zoo_command", required=True)
    zt = zsub.add_parser("train", help="train a zoo model")
    zt.add_argument("name", help="recipe name, e.g. 'default'")
    zt.add_argument("--out", default=None, help="output folder (default: the recipe's data/ path)")
    zt.add_argument("--seed", type=int, default=0)
    zt.add_argument("--minutes", type=_positive_minutes, default=None,
                    help="wall-clock budget; the recipe's own default when omitted")
    zt.set_defaults(func=_zoo_train)


def _add_drafter(sub) -> None:
    drafter = sub.add_parser("drafter", help="fit a drafter to any model and task")
    dsub = drafter.add_subparsers(dest="drafter_command", required=True)
    dt = dsub.add_parser("train", help="fit an EAGLE head or a small-LM drafter on the spot "
                         "(the policy's own outputs on the task's training prompts)")
    dt.add_argument("--model", required=True, help="'default' or a local HF model folder")
    dt.add_argument("--task", required=True,
                    help="embedded task name or a .jsonl file of {\"prompt\", \"answer\"} lines")
    dt.add_argument("--out", required=True, help="folder the drafter is saved into")
    dt.add_argument("--minutes", type=_positive_minutes, required=True,
                    help="wall-clock budget of harvesting and training together")
    dt.add_argument("--kind", choices=["eagle", "lm"], default="eagle",
                    help="an EAGLE head (default) or a small LM")
    dt.add_argument("--seed", type=int, default=0)
    dt.set_defaults(func=_drafter_train)


def _add_ablation(sub) -> None:
    ablation = sub.add_parser("ablation", help="an RL ablation's checkpoint folders")
    asub = ablation.add_subparsers(dest="ablation_command", required=True)
    am = asub.add_parser("merge", help="join the folders of one ablation's seeds run apart "
                         "(each its own process or machine) into one")
    am.add_argument("sources", nargs="+", help="the runs' checkpoint_dir folders")
    am.add_argument("--into", required=True, help="the merged folder (must not exist)")
    am.set_defaults(func=_ablation_merge)
    ast = asub.add_parser("status", help="how far a running or finished ablation has got: its "
                          "RL steps checkpointed and held-out accuracy so far, over the folders "
                          "of its seeds (read from their progress files; loads no model)")
    ast.add_argument("folders", nargs="+", help="the runs' checkpoint_dir folders")
    ast.set_defaults(func=_ablation_status)


def _add_pipeline(sub) -> None:
    pipe = sub.add_parser("pipeline", help="run notebook pipelines with papermill")
    psub = pipe.add_subparsers(dest="pipeline_command", required=True)
    pr = psub.add_parser("run", help="run every notebook x parameter set of a pipeline YAML")
    pr.add_argument("yaml", help="pipeline file, e.g. pipelines/quickstart.yaml")
    pr.add_argument("--redo", action="store_true", help="rerun runs that already finished")
    pr.add_argument("--only", action="append", metavar="ENTRY", default=None,
                    help="run only this entry (its name; repeatable); the other entries' "
                    "finished runs stay in the results")
    pr.add_argument("--runs-root", default="runs", help="where runs/<pipeline>/<run>/ go")
    pr.add_argument("--jobs", type=_jobs, default=1,
                    help="runs at a time, the cores split among their kernels (default 1)")
    pr.add_argument("--ray", action="store_true",
                    help="run every run as a Ray task, in parallel: on a local Ray "
                    "(127.0.0.1 only), or on the cluster at --ray-address / $RAY_ADDRESS")
    pr.add_argument("--ray-address", default=None,
                    help="with --ray: a running cluster's host:port (its nodes need the "
                    "project at the same path and the runs root on a shared filesystem)")
    pr.add_argument("--threads", type=_threads, default=None,
                    help="with --ray: each kernel's torch threads, and the Ray CPUs its task "
                    "holds (default 1)")
    pr.add_argument("--report-to", choices=["none", "tensorboard"], default="none",
                    help="per-step scalars of the notebooks that take report_to (04, 06, 09, "
                         "11): 'tensorboard' writes event files under each run's folder")
    pr.set_defaults(func=_pipeline_run)
    rp = psub.add_parser("report", help="write one static HTML page of a pipeline's runs")
    rp.add_argument("folder", help="the pipeline's run folder, e.g. runs/quickstart")
    rp.add_argument("--out", default=None, help="HTML file (default: <folder>/report.html)")
    rp.set_defaults(func=_pipeline_report)


def _add_results(sub) -> None:
    results = sub.add_parser("results", help="results with their provenance "
                             "(benchmarks/results/*.json) and the table RESULTS.md")
    rsub = results.add_subparsers(dest="results_command", required=True)
    rt = rsub.add_parser("table", help="regenerate RESULTS.md from the result files")
    rt.add_argument("--folder", default="benchmarks/results", help="the result files' folder")
    rt.add_argument("--out", default="RESULTS.md", help="the table's file")
    rt.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when --out differs from what --folder gives")
    rt.set_defaults(func=_results_table)
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
    rr.add_argument("--folder", default="benchmarks/results", help="where the file goes")
    rr.set_defaults(func=_results_record)


def _add_timeline(sub) -> None:
    timeline = sub.add_parser("timeline", help="a run's saved rollout timelines")
    tsub = timeline.add_subparsers(dest="timeline_command", required=True)
    te = tsub.add_parser("export", help="write saved timelines as one Chrome trace-event JSON "
                         "for Perfetto UI or chrome://tracing (docs/chrome_trace.md)")
    te.add_argument("run_dir", metavar="RUN_DIR", help="a saved timeline's folder, or a folder "
                    "whose timelines lie in one folder of step<N> folders")
    te.add_argument("--step", type=int, nargs="+", default=None, metavar="N",
                    help="the RL steps to export, one after another (default: every one)")
    te.add_argument("--out", required=True, help="the trace file, e.g. trace.json")
    te.set_defaults(func=_timeline_export)


def _diagnose(args) -> int:
    """Exit 0 with the report written, 2 for logs, a format, a curve or an --out that cannot
    work (one message naming the value and what is accepted; nothing written)."""
    from .diagnose import diagnose_logs
    try:
        page, diagnosis = diagnose_logs(args.logs, args.out, format=args.format,
                                        sd_curve=args.sd_curve, workers=args.workers,
                                        baseline=args.baseline,
                                        drafter_step_s=args.drafter_step_s,
                                        rollout_dump=args.rollout_dump)
    except (ValueError, OSError) as exc:
        print(f"workbench diagnose: error: {exc}", file=sys.stderr)
        return 2
    print(diagnosis.reading())
    print(f"report: {page}")
    return 0


def _add_diagnose(sub) -> None:
    dg = sub.add_parser("diagnose", help="why didn't TLT pay? a diagnosis of a run's own RL "
                        "logs: step split, long tail, live batch vs SD, remedies "
                        "(docs/diagnose.md)")
    dg.add_argument("logs", metavar="LOGS", help="a metrics file or folder of veRL, OpenRLHF "
                    "or TRL, or a workbench run folder (notebook 04 or 11)")
    dg.add_argument("--format", default=None, help="verl, openrlhf, trl or workbench "
                    "(default: guessed from the logs)")
    dg.add_argument("--out", required=True, help="the report's folder (missing, empty, or an "
                    "earlier diagnosis)")
    dg.add_argument("--sd-curve", default=None, help="SD's speedup per batch size on your "
                    "hardware: a CSV (batch_size, speedup) or notebook 02's curve.csv")
    dg.add_argument("--workers", type=int, default=None, help="the rollout's workers "
                    "(default: what the logs tell)")
    dg.add_argument("--baseline", default=None, help="the same run's logs without SD, to "
                    "compare lengths with")
    dg.add_argument("--drafter-step-s", type=float, default=None,
                    help="one drafter training step's seconds (drafter steps the idle windows hold)")
    dg.add_argument("--rollout-dump", default=None, help="veRL: its trainer.rollout_data_dir "
                    "(<step>.jsonl files: per-request lengths; default: LOGS/rollout_data)")
    dg.set_defaults(func=_diagnose)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        load_plugins(args.plugins)
    except ValueError as exc:
        print(f"workbench: {exc}", file=sys.stderr)
        return 2
    return args.func(args)
