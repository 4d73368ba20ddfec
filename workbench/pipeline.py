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
for more threads than there are cores fight over them and run slower than one after
another, while kernels that share the cores out between them gain from running side by side.
Or they go as Ray tasks (``--ray``), one per run, each holding ``threads`` Ray CPUs and
giving its kernel as many torch threads: on a local Ray (127.0.0.1 only) they run on this
machine, as many at a time as its cores hold; with an address (``--ray-address``, or
``$RAY_ADDRESS``) on the cluster's nodes, which then need the project at the same path and
the runs root on a filesystem they share (a task writes its run folder where the driver
reads it). The results table keeps the YAML's order whatever finishes first.

A failing notebook marks its run ``failed`` and the pipeline goes on. Rerunning a pipeline
skips runs whose folder holds an ``ok`` run.json with the same parameter hash (edit a notebook
and pass ``redo=True`` to rerun them); failed runs are retried. A run that executes starts
from an emptied folder, so its artifacts are all its own.

Results: one row per run of the YAML (older run folders not in it are ignored), written to
``<runs_root>/<pipeline>/results.csv`` and ``results.parquet``; its columns and the printed
summary over seeds are :mod:`workbench.pipeline_results`' (whose readers are re-exported
here). One run's execution and its ``run.json`` are :mod:`workbench.pipeline_execute`'s.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import papermill

from .checks import check_bool, check_choice, check_int
from .environ import environ
from .pipeline_execute import execute_run, git_info, package_versions
from .pipeline_results import (load_results, print_summary, result_row, summarize,
                               summary_view, write_results)
from .pipeline_spec import PipelineError, RunSpec, load_pipeline
from .progress import tqdm
from .scalar_log import REPORT_TO

__all__ = ["run_pipeline", "load_results", "summarize", "summary_view"]


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
    provenance = {root: git_info(root) for root in {run.root for run in pipeline.runs}}
    versions = package_versions()
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
            rows.append(result_row(record, run, skipped=True) if future is None
                        else result_row(future.result(), run, skipped=False))
            progress.update()
    progress.close()

    table = pd.DataFrame(rows)
    write_results(table, pipeline_dir)
    print_summary(table, pipeline_dir)
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
    ``result()``: ``execute_run``'s record): a pool of ``jobs`` threads, or Ray tasks
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
    return ray_tasks(execute_run, ray_address, check_int("threads", threads, 1, optional="1") or 1)


@contextmanager
def _thread_pool(jobs: int):
    with _kernel_threads(jobs), ThreadPoolExecutor(jobs) as pool:
        yield lambda *args: pool.submit(execute_run, *args)


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


