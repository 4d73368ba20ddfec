"""Run notebooks through papermill as a pipeline: ``workbench pipeline run pipelines/x.yaml``.

A pipeline YAML lists notebooks, each with fixed parameters, an optional grid and an optional
list of seeds; every combination becomes one *run*, executed by papermill into its own folder
``<runs_root>/<pipeline>/<run_name>/``::

    name: quickstart                  # optional; default: the YAML file's stem
    notebooks:
      - notebook: notebooks/00_task_and_policy.ipynb
        name: task_and_policy         # optional run-name prefix; default: the notebook's stem
        parameters: {num_problems: 200}   # optional fixed parameters
        grid: {temperature: [0.0, 1.0]}   # optional; the cartesian product of the lists
        seeds: [0, 1, 2]                  # optional; each value becomes the parameter `seed`

Accepted keys are exactly these (top level: ``name``, ``notebooks``; per notebook:
``notebook``, ``name``, ``parameters``, ``grid``, ``seeds``); anything else is an error, so a
typo cannot silently drop a setting.

Notebook paths are resolved against the current directory, and if the file is not there,
against the YAML file's grandparent (the project root for ``pipelines/x.yaml``), so a pipeline
works from the project root and from anywhere else. The notebook's kernel runs in that same
directory, so notebooks can use project-relative paths.

Every parameter a pipeline sets, ``seed`` included, must be declared in the notebook's
``parameters``-tagged cell, and so must ``out_dir``: the runner injects the absolute run folder
there (users never set it) and the notebook writes its artifacts into it. papermill only warns
about undeclared parameters; a misspelt one would silently run the default, so here it is an
error. All checks happen before anything runs or is written: a bad pipeline leaves no trace.

Each run folder holds the executed ``notebook.ipynb``, whatever the notebook writes (figures,
``metrics.json``), and ``run.json``: parameters, their hash, notebook path, git commit and
dirty flag, package versions, start/end time, duration, status (``ok`` or ``failed``), error,
and the metrics. A run name is readable and unique: prefix, the values that vary (grid, seed),
and a hash of all parameters, e.g. ``task_and_policy-temperature1.0-seed0-3f9a1c2b``.

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

import hashlib
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import nbformat
import pandas as pd
import papermill
import yaml
from tqdm.auto import tqdm

TOP_KEYS = ("name", "notebooks")
ENTRY_KEYS = ("notebook", "name", "parameters", "grid", "seeds")
OUT_DIR = "out_dir"
SEED = "seed"
VERSIONED_PACKAGES = ("torch", "transformers", "papermill", "pandas", "workbench")


class PipelineError(ValueError):
    """A pipeline YAML that cannot run as written; raised before anything runs."""


@dataclass(frozen=True)
class RunSpec:
    """One notebook execution with one parameter set, fully resolved and validated."""

    pipeline: str
    entry: str           # run-name prefix
    notebook: str        # as written in the YAML, for the results table
    notebook_path: Path  # absolute
    root: Path           # the kernel's working directory
    parameters: dict[str, Any]  # everything but out_dir
    varied: tuple[str, ...]     # keys that vary within the entry, shown in the run name

    @property
    def param_hash(self) -> str:
        blob = json.dumps(self.parameters, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:8]

    @property
    def run_name(self) -> str:
        readable = "-".join(_slug(f"{k}{self.parameters[k]}") for k in self.varied)[:80]
        return "-".join(part for part in (self.entry, readable, self.param_hash) if part)


@dataclass(frozen=True)
class Pipeline:
    name: str
    runs: list[RunSpec]


# ----------------------------------------------------------------------------- loading

def load_pipeline(yaml_path: str | os.PathLike) -> Pipeline:
    """Parse and validate a pipeline YAML into its runs; raise PipelineError on any problem."""
    yaml_path = Path(yaml_path)
    config = _read_yaml(yaml_path)
    _check_keys(config, TOP_KEYS, f"pipeline {yaml_path}")
    name = _slug(str(config.get("name", yaml_path.stem)))
    if not name:
        raise PipelineError(f"{yaml_path}: pipeline name {config.get('name')!r} is not usable as a folder name")
    entries = config.get("notebooks")
    if not isinstance(entries, list) or not entries:
        raise PipelineError(f"{yaml_path}: `notebooks` must be a non-empty list of notebook entries")
    runs = [run for entry in entries for run in _entry_runs(entry, name, yaml_path)]
    _check_unique(runs, yaml_path)
    return Pipeline(name=name, runs=runs)


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise PipelineError(f"pipeline file not found: {path}")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise PipelineError(f"{path}: expected a mapping with keys {list(TOP_KEYS)}")
    return config


def _check_keys(mapping: dict, accepted: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(mapping) - set(accepted))
    if unknown:
        raise PipelineError(f"{where}: unknown key(s) {unknown}; accepted: {list(accepted)}")


def _entry_runs(entry: Any, pipeline: str, yaml_path: Path) -> list[RunSpec]:
    """Expand one notebook entry into its runs: fixed parameters x grid x seeds."""
    if not isinstance(entry, dict) or "notebook" not in entry:
        raise PipelineError(f"{yaml_path}: each `notebooks` item needs a `notebook` path, got {entry!r}")
    notebook = str(entry["notebook"])
    where = f"{yaml_path}: notebook {notebook}"
    _check_keys(entry, ENTRY_KEYS, where)
    fixed = _mapping(entry.get("parameters", {}), "parameters", where)
    grid = _mapping(entry.get("grid", {}), "grid", where)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise PipelineError(f"{where}: grid values for {key!r} must be a non-empty list, got {values!r}")
    if "seeds" in entry:
        seeds = entry["seeds"]
        if not isinstance(seeds, list) or not seeds or not all(_is_int(s) for s in seeds):
            raise PipelineError(f"{where}: `seeds` must be a non-empty list of integers, got {seeds!r}")
        grid = {**grid, SEED: seeds}
    _check_overlaps(fixed, grid, where)

    notebook_path, root = _resolve_notebook(notebook, yaml_path)
    _check_declared(notebook_path, [*fixed, *grid, OUT_DIR], where)
    prefix = _slug(str(entry.get("name", notebook_path.stem)))
    combos = itertools.product(*grid.values())
    return [RunSpec(pipeline=pipeline, entry=prefix, notebook=notebook, notebook_path=notebook_path,
                    root=root, parameters={**fixed, **dict(zip(grid, combo))}, varied=tuple(grid))
            for combo in combos]


def _mapping(value: Any, key: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise PipelineError(f"{where}: `{key}` must be a mapping of parameter names, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_overlaps(fixed: dict, grid: dict, where: str) -> None:
    both = sorted(set(fixed) & set(grid))
    if both:
        raise PipelineError(f"{where}: parameter(s) {both} set both as fixed and varied "
                            f"(grid/seeds); keep one")
    if OUT_DIR in fixed or OUT_DIR in grid:
        raise PipelineError(f"{where}: `{OUT_DIR}` is set by the runner (the run folder); remove it")


def _resolve_notebook(notebook: str, yaml_path: Path) -> tuple[Path, Path]:
    """Return the notebook's absolute path and the directory it resolved against."""
    for root in (Path.cwd(), yaml_path.resolve().parent.parent):
        candidate = root / notebook
        if candidate.is_file():
            return candidate.resolve(), root
    raise PipelineError(f"{yaml_path}: notebook not found: {notebook} (looked relative to "
                        f"{Path.cwd()} and {yaml_path.resolve().parent.parent})")


def _check_declared(notebook_path: Path, names: list[str], where: str) -> None:
    """Every parameter must be declared in the notebook's parameters cell (papermill only warns)."""
    try:
        nb = nbformat.read(notebook_path, as_version=4)
    except Exception as exc:  # nbformat raises several types for unreadable files
        raise PipelineError(f"{where}: cannot read notebook: {exc}") from exc
    if not any("parameters" in cell.metadata.get("tags", []) for cell in nb.cells):
        raise PipelineError(f"{where}: the notebook has no cell tagged `parameters`; papermill "
                            f"needs one to know where to inject values (declare at least {OUT_DIR})")
    declared = papermill.inspect_notebook(str(notebook_path))
    missing = [name for name in names if name not in declared]
    if missing:
        raise PipelineError(f"{where}: parameter(s) {missing} not declared in the notebook's "
                            f"parameters cell; declared: {sorted(declared)}")


def _check_unique(runs: list[RunSpec], yaml_path: Path) -> None:
    seen: set[str] = set()
    for run in runs:
        if run.run_name in seen:
            raise PipelineError(f"{yaml_path}: two runs would share the folder {run.run_name}; give "
                                f"entries of the same notebook distinct `name`s or parameters")
        seen.add(run.run_name)


def _slug(text: str) -> str:
    """A folder-name-safe version of text (no separators, no leading dots)."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("._")


# ----------------------------------------------------------------------------- running

def run_pipeline(yaml_path: str | os.PathLike, *, redo: bool = False,
                 runs_root: str | os.PathLike = "runs") -> pd.DataFrame:
    """Run every run of a pipeline YAML, write and print its results, and return the table.

    Validation happens first (PipelineError, nothing written). Runs that already finished with
    the same parameters are reused unless ``redo``; failed runs do not stop the others.
    """
    pipeline = load_pipeline(yaml_path)
    pipeline_dir = Path(runs_root) / pipeline.name
    provenance = {root: _git_info(root) for root in {run.root for run in pipeline.runs}}
    versions = _package_versions()

    rows = []
    progress = tqdm(pipeline.runs, desc=pipeline.name, unit="run")
    for run in progress:
        progress.set_postfix_str(run.run_name)
        run_dir = (pipeline_dir / run.run_name).resolve()
        record = None if redo else _finished_record(run_dir, run)
        skipped = record is not None
        if record is None:
            record = _execute(run, run_dir, provenance[run.root], versions)
        rows.append(_row(record, run, skipped))

    table = pd.DataFrame(rows)
    _write_results(table, pipeline_dir)
    _print_report(table, pipeline_dir)
    return table


def _finished_record(run_dir: Path, run: RunSpec) -> dict | None:
    """The run.json of an earlier ok run with the same parameters, else None."""
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if record.get("status") == "ok" and record.get("param_hash") == run.param_hash:
        return record
    return None


def _execute(run: RunSpec, run_dir: Path, git: dict | None, versions: dict) -> dict:
    """Execute one run into an emptied run_dir and write its run.json; never raises for
    notebook failures, so one bad run cannot stop the pipeline."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    started = datetime.now(timezone.utc)
    clock = time.perf_counter()
    error, metrics = None, {}
    try:
        papermill.execute_notebook(
            str(run.notebook_path), str(run_dir / "notebook.ipynb"),
            parameters={**run.parameters, OUT_DIR: str(run_dir)},
            kernel_name="python3", language="python", progress_bar=False, cwd=str(run.root))
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
    _atomic_write(run_dir / "run.json",
                  lambda tmp: tmp.write_text(json.dumps(record, indent=2, default=str)))
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


def _atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """Write via a temp file in the same folder and os.replace, so readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    pipeline_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(pipeline_dir / "results.csv", lambda tmp: table.to_csv(tmp, index=False))
    parquet_table = _parquet_safe(table)
    _atomic_write(pipeline_dir / "results.parquet",
                  lambda tmp: parquet_table.to_parquet(tmp, index=False))


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
    counted = table[keys].assign(n_ok=ok, n_failed=~ok, **{m: table[m].where(ok) for m in metrics})
    aggregations = {"n_ok": ("n_ok", "sum"), "n_failed": ("n_failed", "sum")}
    for metric in metrics:
        aggregations[f"{metric}.mean"] = (metric, "mean")
        aggregations[f"{metric}.sd"] = (metric, "std")
    return counted.groupby(keys, dropna=False, sort=False).agg(**aggregations).reset_index()


def _print_report(table: pd.DataFrame, pipeline_dir: Path) -> None:
    """Print counts and the summary, metrics shown as ``mean ± sd``."""
    summary = summarize(table)
    shown = summary.drop(columns=[c for c in summary.columns if c.endswith((".mean", ".sd"))])
    for column in summary.columns:
        if column.endswith(".mean"):
            metric = column[: -len(".mean")]
            shown[metric] = [_mean_sd(m, s) for m, s in zip(summary[column], summary[f"{metric}.sd"])]
    ok = int((table["status"] == "ok").sum())
    print(f"pipeline {table['pipeline'].iloc[0]}: {ok} ok, {len(table) - ok} failed, "
          f"{int(table['skipped'].sum())} reused -> {pipeline_dir / 'results.parquet'}")
    print(shown.to_string(index=False))


def _mean_sd(mean: float, sd: float) -> str:
    if pd.isna(mean):
        return "-"  # no ok run
    return f"{mean:.4g}" if pd.isna(sd) else f"{mean:.4g} ± {sd:.2g}"
