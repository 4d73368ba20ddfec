"""The notebooks' integration tests run as one pipeline per test module, two runs at a time.

A notebook run costs ~6 s before its first line of work (a kernel, torch, transformers, the
model) and the suite has some twenty of them, so each module hands its runs to
``workbench.pipeline.run_pipeline(jobs=2)`` in one go: on two cores two kernels of one thread
each finish the lot ~1.6x sooner than one after another (two kernels of two threads each would
run 4x slower). The tests then read each run's folder: the executed ``notebook.ipynb``,
``metrics.json``, figures and ``run.json``. Nothing else in the suite runs meanwhile, so the
timing-sensitive tests elsewhere never share the cores with a kernel.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from workbench.pipeline import run_pipeline

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class NotebookRun:
    """One finished run: its folder (``out_dir``), executed notebook and run.json record."""

    folder: Path

    @property
    def executed(self) -> Path:
        return self.folder / "notebook.ipynb"

    @property
    def record(self) -> dict:
        return json.loads((self.folder / "run.json").read_text())

    def metrics(self) -> dict:
        """metrics.json, after checking the run went through (its error shown if not)."""
        record = self.record
        assert record["status"] == "ok", record["error"]
        return json.loads((self.folder / "metrics.json").read_text())


def run_notebooks(folder: Path, entries: dict[str, tuple[str, dict]], *, jobs: int = 2,
                  env: dict[str, str] | None = None) -> dict[str, NotebookRun]:
    """Run ``entries`` (name -> (notebook stem under notebooks/, parameters)) as one pipeline
    under ``folder``, ``jobs`` at a time, with ``env`` set for the kernels; name -> run."""
    spec = {"name": "tests", "notebooks": [
        {"notebook": str(ROOT / "notebooks" / f"{stem}.ipynb"), "name": name,
         "parameters": params} for name, (stem, params) in entries.items()]}
    path = folder / "tests.yaml"
    path.write_text(yaml.safe_dump(spec))
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    here = Path.cwd()
    os.chdir(ROOT)  # the kernels' working directory: the project root, as for a user
    try:
        table = run_pipeline(path, runs_root=folder / "runs", jobs=jobs)
    finally:
        os.chdir(here)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return {entry: NotebookRun(folder / "runs" / "tests" / run_name)
            for entry, run_name in zip(table["entry"], table["run_name"])}


def workbench_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m workbench *args`` in a fresh process, as a user types it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def run_quickstart_at_smoke_size(folder: Path, smoke: dict) -> Path:
    """pipelines/quickstart.yaml with each notebook's parameters replaced by its smoke set
    (``smoke``: stem -> (parameters, metric keys)), run through the command line with
    ``--jobs 2``; the pipeline's folder of runs."""
    spec = yaml.safe_load((ROOT / "pipelines" / "quickstart.yaml").read_text())
    for entry in spec["notebooks"]:
        entry["parameters"] = smoke[Path(entry["notebook"]).stem][0]
        entry["notebook"] = str(ROOT / entry["notebook"])
    path = folder / "quickstart.yaml"
    path.write_text(yaml.safe_dump(spec))
    ran = workbench_cli("pipeline", "run", str(path), "--runs-root", str(folder / "runs"),
                        "--jobs", "2", cwd=ROOT)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return folder / "runs" / spec["name"]
