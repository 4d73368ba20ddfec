"""One run of a pipeline: its notebook executed by papermill into an emptied run folder, and
its ``run.json`` (parameters, their hash, notebook path, git commit and dirty flag, package
versions, start/end time, duration, status, error and the notebook's metrics).

Why apart from the pipeline: this is the unit a Ray task runs (:mod:`workbench.pipeline_ray`)
as well as a local thread, so it takes everything it needs as arguments and returns the
record; what runs, in what order and where, is :mod:`workbench.pipeline`'s.
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
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import papermill
from jupyter_client.manager import AsyncKernelManager
from traitlets import default

from .atomic import write_text
from .pipeline_spec import OUT_DIR, RunSpec

__all__ = ["execute_run", "git_info", "package_versions", "IPCKernelManager",
           "VERSIONED_PACKAGES"]

VERSIONED_PACKAGES = ("torch", "transformers", "papermill", "pandas", "workbench")


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


def execute_run(run: RunSpec, run_dir: Path, git: dict | None, versions: dict,
                logged: dict | None = None) -> dict:
    """Execute one run into an emptied run_dir, write its run.json and return that record;
    never raises for notebook failures, so one bad run cannot stop the pipeline. ``logged``:
    the log parameter the notebook gets (``report_to``), outside the run's parameters."""
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


def git_info(root: Path) -> dict | None:
    """Commit and dirty flag of the git checkout at root; None outside git (or without git)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    return None if commit is None else {"commit": commit, "dirty": bool(git("status", "--porcelain"))}


def package_versions() -> dict:
    """Python's version and each of ``VERSIONED_PACKAGES``' (None where not installed)."""
    versions = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions
