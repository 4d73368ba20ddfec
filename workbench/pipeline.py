"""Run notebooks through papermill as a pipeline: ``workbench pipeline run pipelines/x.yaml``.

The YAML format and its validation live in :mod:`workbench.pipeline_spec` (its names are
re-exported here); every check happens before anything runs or is written.

Each run folder holds the executed ``notebook.ipynb``, whatever the notebook writes (figures,
``metrics.json``), and ``run.json``: parameters, their hash, notebook path, git commit and
dirty flag, package versions, start/end time, duration, status (``ok`` or ``failed``), error,
and the metrics. A run name is readable and unique: prefix, the values that vary (grid, seed),
and a hash of all parameters, e.g. ``task_and_policy-temperature1.0-seed0-3f9a1c2b``.

Runs go one at a time, or ``jobs`` at a time (``--jobs N``): each kernel then gets
``cpu_count // jobs`` torch threads (``OMP_NUM_THREADS``), because kernels that together ask
for more threads than there are cores run several times slower than one after another
(measured: two kernels of two threads each on two cores, 4x slower; two of one thread, 1.6x
faster). Or they go as Ray tasks (``--ray``), one per run, each holding ``threads`` Ray
CPUs and giving its kernel as many torch threads: on a local Ray (127.0.0.1 only) they run on
this machine, as many at a time as its cores hold; with an address (``--ray-address``, or
``$RAY_ADDRESS``) on the cluster's nodes, which then need the project at the same path and
the runs root on a filesystem they share (a task writes its run folder where the driver
reads it). The results table keeps the YAML's order whatever finishes first.

A failing notebook marks its run ``failed`` and the pipeline goes on. Rerunning a pipeline
skips runs whose folder holds an ``ok`` run.json with the same parameter hash (edit a notebook
and pass ``redo=True`` to rerun them); failed runs are retried. A run that executes starts
from an emptied folder, so its artifacts are all its own.

Results: one row per run of the YAML (older run folders not in it are ignored), written to
``<runs_root>/<pipeline>/results.csv`` and ``results.parquet``. Columns: ``pipeline``,
``entry`` (the notebook's run-name prefix), ``notebook`` (as written in the YAML),
``run_name``, ``param_hash``, ``param.<k>`` per parameter, ``status``, ``skipped`` (True when
this call reused a finished run), ``error`` (``"Type: message"``), ``duration_s`` (of the
execution that produced the run) and ``metric.<k>`` for every scalar in the run's
``metrics.json`` (nested objects flatten to ``metric.a.b``; lists are left out). The printed
summary, :func:`summarize`, gives per entry and non-seed parameter combination the mean and
sample standard deviation of each metric over its ok runs, with counts of ok and failed runs.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import papermill
from jupyter_client.manager import AsyncKernelManager
from traitlets import default
from .progress import tqdm

from .atomic import atomic_file, write_text
from .checks import check_bool, check_choice, check_int
from .scalar_log import REPORT_TO
from .environ import environ
from .pipeline_spec import OUT_DIR, SEED, PipelineError, RunSpec, load_pipeline

__all__ = ["run_pipeline", "load_results", "summarize", "summary_view"]

VERSIONED_PACKAGES = ("torch", "transformers", "papermill", "pandas", "workbench")


# ----------------------------------------------------------------------------- running

def run_pipeline(yaml_path: str | os.PathLike, *, redo: bool = False,
                 runs_root: str | os.PathLike = "runs", jobs: int = 1, ray: bool = False,
                 ray_address: str | None = None, threads: int | None = None,
                 only=None, report_to: str = "none") -> pd.DataFrame:
    """Run every run of a pipeline YAML, write and print its results, and return the table.

    Validation happens first (PipelineError, or a ValueError for the arguments; nothing
    written). Runs that already finished with the same parameters are reused unless
    ``redo``; failed runs do not stop the others. ``jobs`` runs execute at a time, their
    kernels sharing the cores; or, with ``ray``, every run is a Ray task of ``threads``
    CPUs (default 1) on a local Ray or the cluster at ``ray_address`` (module docstring).
    ``only``: the names of the entries to run (None: all); the other entries' finished runs
    are reused into the results, their unfinished ones left out. ``report_to``
    (``"tensorboard"``: ``--report-to``) goes to every notebook that declares a ``report_to``
    parameter (their runs log per-step scalars under their run folder); it is no parameter of
    the run (not in its hash: a finished run is reused whatever its log was).
    """
    check_choice("report_to", report_to, REPORT_TO)  # every run has its folder
    executor = _executor(jobs, ray, ray_address, threads)
    pipeline = load_pipeline(yaml_path)
    picked = _picked(pipeline.runs, only)
    pipeline_dir = Path(runs_root) / pipeline.name
    _check_outputs(pipeline_dir, pipeline.runs)
    provenance = {root: _git_info(root) for root in {run.root for run in pipeline.runs}}
    versions = _package_versions()
    run_dirs = [(pipeline_dir / run.run_name).resolve() for run in pipeline.runs]
    reused = [None if redo and pick else _finished_record(run_dir, run)
              for run, run_dir, pick in zip(pipeline.runs, run_dirs, picked)]
    shown = [pick or record is not None for pick, record in zip(picked, reused)]

    progress = tqdm(total=sum(shown), desc=pipeline.name, unit="run")
    logged = _logged(pipeline.runs, report_to)
    with executor as submit:
        futures = [submit(run, run_dir, provenance[run.root], versions, logged[run.notebook_path])
                   if pick and record is None else None
                   for run, run_dir, record, pick in zip(pipeline.runs, run_dirs, reused, picked)]
        rows = []
        for run, record, future in zip(pipeline.runs, reused, futures):  # in the YAML's order
            if future is None and record is None:
                continue  # an entry not picked, never finished
            progress.set_postfix_str(run.run_name)
            rows.append(_row(record, run, skipped=True) if future is None
                        else _row(future.result(), run, skipped=False))
            progress.update()
    progress.close()

    table = pd.DataFrame(rows)
    _write_results(table, pipeline_dir)
    _print_report(table, pipeline_dir)
    return table


def _logged(runs: list[RunSpec], report_to: str) -> dict[Path, dict]:
    """Per notebook, the log parameter it gets: ``{"report_to": report_to}`` for a notebook
    that declares ``report_to`` when a log is asked for, else none."""
    paths = {run.notebook_path for run in runs}
    if report_to == "none":
        return {path: {} for path in paths}
    return {path: {"report_to": report_to}
            if "report_to" in papermill.inspect_notebook(str(path)) else {} for path in paths}


def _picked(runs: list[RunSpec], only) -> list[bool]:
    """Per run, whether its entry is among ``only`` (every run when None); unknown names are
    refused, naming the pipeline's entries, before anything runs."""
    if only is None:
        return [True] * len(runs)
    entries = list(dict.fromkeys(run.entry for run in runs))
    only = [only] if isinstance(only, str) else list(only)
    unknown = [name for name in only if name not in entries]
    if unknown or not only:
        raise ValueError(f"only {only!r}" + (f" (no entry named {unknown})" if unknown else "")
                         + f": accepted: one or more of this pipeline's entries {entries}")
    return [run.entry in only for run in runs]


def _executor(jobs: int, ray: bool, ray_address: str | None, threads: int | None):
    """A context that yields ``submit(run, run_dir, git, versions, logged) -> future`` (its
    ``result()``: :func:`_execute`'s record): a pool of ``jobs`` threads, or Ray tasks
    (:mod:`workbench.pipeline_ray`). The arguments are checked here, before anything runs."""
    jobs = check_int("jobs", jobs, 1)
    check_bool("ray", ray)
    if not ray:
        if ray_address is not None or threads is not None:
            raise ValueError(f"ray_address={ray_address!r} and threads={threads!r} are for Ray "
                             "tasks; accepted: ray=True with them (--ray), or neither")
        return _thread_pool(jobs)
    if jobs != 1:
        raise ValueError(f"jobs={jobs} with ray=True; accepted: jobs=1 (on Ray the cluster's "
                         "CPUs decide how many runs go at once, threads each)")
    from .pipeline_ray import ray_tasks  # importing Ray takes seconds: only when asked for
    return ray_tasks(_execute, ray_address, check_int("threads", threads, 1, optional="1") or 1)


@contextmanager
def _thread_pool(jobs: int):
    with _kernel_threads(jobs), ThreadPoolExecutor(jobs) as pool:
        yield lambda *args: pool.submit(_execute, *args)


@contextmanager
def _kernel_threads(jobs: int):
    """With ``jobs`` > 1, every kernel started inside gets ``cpu_count // jobs`` torch threads
    (kernels inherit the environment); the environment is restored on exit."""
    if jobs == 1:
        yield
        return
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    with environ(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads):
        yield


def _check_outputs(pipeline_dir: Path, runs: list[RunSpec]) -> None:
    """The run folders can be made: no existing file stands where a folder goes, and the
    nearest existing folder is writable (PipelineError, before anything runs)."""
    for path in [*(pipeline_dir / run.run_name for run in runs), pipeline_dir, *pipeline_dir.parents]:
        if path.exists() and not path.is_dir():
            raise PipelineError(f"cannot write runs under {str(pipeline_dir)!r}: {str(path)!r} is "
                                "an existing file, where a folder is needed; move it or pass "
                                "another runs root (--runs-root)")
    existing = next(p for p in (pipeline_dir, *pipeline_dir.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PipelineError(f"cannot write runs under {str(pipeline_dir)!r}: {str(existing)!r} "
                            "is not writable; pass another runs root (--runs-root)")


def _finished_record(run_dir: Path, run: RunSpec) -> dict | None:
    """The run.json of an earlier ok run with the same parameters, else None."""
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(record, dict) and record.get("status") == "ok" and record.get("param_hash") == run.param_hash:
        return record
    return None


class IPCKernelManager(AsyncKernelManager):
    """A notebook's kernel reached over IPC (Unix sockets), not TCP: nothing listens on a
    port, and the kernel does not print its warning that TCP carries code and outputs
    unencrypted, once per notebook, over every pipeline's output. Real kernel errors still
    show."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("ip")
    def _ip_default(self) -> str:
        # the sockets' path prefix, one per kernel: jupyter_client's default, "kernel-ipc" in
        # the working folder, is shared by kernels started side by side (--jobs), whose
        # messages then cross ("Invalid Signature")
        return os.path.join(tempfile.gettempdir(), f"workbench-kernel-{uuid.uuid4().hex}-ipc")


def _execute(run: RunSpec, run_dir: Path, git: dict | None, versions: dict,
             logged: dict | None = None) -> dict:
    """Execute one run into an emptied run_dir and write its run.json; never raises for
    notebook failures, so one bad run cannot stop the pipeline. ``logged``: the log
    parameter the notebook gets (:func:`_logged`), outside the run's parameters."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    started = datetime.now(timezone.utc)
    clock = time.perf_counter()
    error, metrics = None, {}
    try:
        papermill.execute_notebook(
            str(run.notebook_path), str(run_dir / "notebook.ipynb"),
            parameters={**run.parameters, **(logged or {}), OUT_DIR: str(run_dir)},
            kernel_name="python3", language="python", progress_bar=False, cwd=str(run.root),
            kernel_manager_class=IPCKernelManager)
        metrics = _read_metrics(run_dir / "metrics.json")
    except Exception as exc:  # any failure belongs to this run only
        error = _describe(exc)
    record = {
        "pipeline": run.pipeline,
        "run_name": run.run_name,
        "notebook": run.notebook,
        "notebook_path": str(run.notebook_path),
        "parameters": run.parameters,
        "param_hash": run.param_hash,
        "out_dir": str(run_dir),
        "git": git,
        "versions": versions,
        "started_at": started.isoformat(timespec="seconds"),
        "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.perf_counter() - clock, 3),
        "status": "failed" if error else "ok",
        "error": error,
        "metrics": metrics,
    }
    write_text(run_dir / "run.json", json.dumps(record, indent=2, default=str))
    return record


def _read_metrics(path: Path) -> dict:
    """The notebook's metrics.json as a flat dict of scalars ({} when it wrote none)."""
    if not path.is_file():
        return {}
    metrics = json.loads(path.read_text())
    if not isinstance(metrics, dict):
        raise ValueError(f"metrics.json must hold a JSON object, got {type(metrics).__name__}")
    return _flatten(metrics)


def _flatten(mapping: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            flat[f"{prefix}{key}"] = value
    return flat


def _describe(exc: Exception) -> dict:
    """Type and message of a failure; for a notebook error, the notebook's own exception
    rather than papermill's wrapper (whose text is the whole coloured traceback)."""
    if isinstance(exc, papermill.PapermillExecutionError):
        return {"type": exc.ename, "message": exc.evalue}
    return {"type": type(exc).__name__, "message": str(exc)}


def _git_info(root: Path) -> dict | None:
    """Commit and dirty flag of the git checkout at root; None outside git (or without git)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    return None if commit is None else {"commit": commit, "dirty": bool(git("status", "--porcelain"))}


def _package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


# ----------------------------------------------------------------------------- results

def _row(record: dict, run: RunSpec, skipped: bool) -> dict:
    error = record["error"]
    return {
        "pipeline": run.pipeline,
        "entry": run.entry,
        "notebook": run.notebook,
        "run_name": run.run_name,
        "param_hash": run.param_hash,
        **{f"param.{k}": _cell(v) for k, v in run.parameters.items()},
        "status": record["status"],
        "skipped": skipped,
        "error": f"{error['type']}: {error['message']}" if error else None,
        "duration_s": record["duration_s"],
        **{f"metric.{k}": v for k, v in record["metrics"].items()},
    }


def _cell(value: Any) -> Any:
    """Lists and mappings become JSON text: table cells hold scalars."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def _write_results(table: pd.DataFrame, pipeline_dir: Path) -> None:
    parquet_table = _parquet_safe(table)  # before anything is written
    with atomic_file(pipeline_dir / "results.csv") as tmp:
        table.to_csv(tmp, index=False)
    with atomic_file(pipeline_dir / "results.parquet") as tmp:
        parquet_table.to_parquet(tmp, index=False)


def _parquet_safe(table: pd.DataFrame) -> pd.DataFrame:
    """Parquet columns need one type; a column mixing types (grid [0, "auto"]) becomes text."""
    table = table.copy()
    for column in table.columns[table.dtypes == object]:
        kinds = {type(v) for v in table[column] if v is not None and v == v}
        if len(kinds) > 1:
            table[column] = table[column].map(lambda v: v if v is None or v != v else str(v))
    return table


def load_results(pipeline_dir: str | os.PathLike) -> pd.DataFrame:
    """The results table of a pipeline run folder (``<runs_root>/<pipeline>``)."""
    return pd.read_parquet(Path(pipeline_dir) / "results.parquet")


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per entry, notebook and non-seed parameter combination: ``n_ok``, ``n_failed`` and, for
    each numeric metric, ``<metric>.mean`` and ``<metric>.sd`` (sample sd, NaN for one run)
    over the ok runs, i.e. across seeds."""
    keys = ["entry", "notebook", *[c for c in table.columns
                                   if c.startswith("param.") and c != f"param.{SEED}"]]
    metrics = [c for c in table.columns
               if c.startswith("metric.") and pd.api.types.is_numeric_dtype(table[c])]
    ok = table["status"] == "ok"
    # failed runs count, but their metrics (if any) do not: blank them, and mean/std skip NaN
    counted = pd.concat([table[keys].assign(n_ok=ok, n_failed=~ok),
                         pd.DataFrame({m: table[m].where(ok) for m in metrics})], axis=1)
    grouped = counted.groupby(keys, dropna=False, sort=False)
    parts = [grouped[["n_ok", "n_failed"]].sum(), grouped[metrics].mean().add_suffix(".mean"),
             grouped[metrics].std().add_suffix(".sd")]
    order = ["n_ok", "n_failed", *[f"{m}.{s}" for m in metrics for s in ("mean", "sd")]]
    return pd.concat(parts, axis=1)[order].reset_index()


def summary_view(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`summarize` as people read it: the same rows, one text column per metric holding
    ``mean ± sd`` (the mean alone for one run, ``-`` for none). What the CLI prints and the
    report shows."""
    summary = summarize(table)
    shown = summary.drop(columns=[c for c in summary.columns if c.endswith((".mean", ".sd"))])
    for column in summary.columns:
        if column.endswith(".mean"):
            metric = column[: -len(".mean")]
            shown[metric] = [_mean_sd(m, s) for m, s in zip(summary[column], summary[f"{metric}.sd"])]
    return shown


def _print_report(table: pd.DataFrame, pipeline_dir: Path) -> None:
    """Print counts and the summary, metrics shown as ``mean ± sd``."""
    shown = summary_view(table)
    ok = int((table["status"] == "ok").sum())
    print(f"pipeline {table['pipeline'].iloc[0]}: {ok} ok, {len(table) - ok} failed, "
          f"{int(table['skipped'].sum())} reused -> {pipeline_dir / 'results.parquet'}")
    print(shown.to_string(index=False))


def _mean_sd(mean: float, sd: float) -> str:
    if pd.isna(mean):
        return "-"  # no ok run
    return f"{mean:.4g}" if pd.isna(sd) else f"{mean:.4g} ± {sd:.2g}"
