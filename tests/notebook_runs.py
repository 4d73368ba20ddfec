"""The notebooks' integration tests run as one pipeline for the session, two runs at a time.

A notebook run costs ~6 s before its first line of work (a kernel, torch, transformers, the
model) and the suite has some twenty of them, so they are handed to
``workbench.pipeline.run_pipeline(jobs=2)`` in one go (:func:`run_all_notebooks`, the
``notebook_runs`` fixture of conftest.py), the longest first so that the last ones to finish
are short: on two cores two kernels of one thread each finish the lot ~1.6x sooner than one
after another (two kernels of two threads each would run 4x slower). The tests then read each
run's folder: the executed ``notebook.ipynb``, ``metrics.json``, figures and ``run.json``.
Nothing else in the suite runs meanwhile, so the timing-sensitive tests elsewhere never share
the cores with a kernel. The quickstart pipeline runs apart, through the command line, as the
README's main job does (:func:`run_quickstart_at_smoke_size`).
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


def workbench_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m workbench *args`` in a fresh process, as a user types it (``env`` on top of
    this process's environment)."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
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


# the user's runs (tests/test_user_model_notebooks.py): each notebook at its smoke parameters
# with these on top, on a user's 4-layer Qwen2 with its own BPE tokenizer and a JSONL task of
# word problems without references. Answers of word problems are 2-4 tokens, so 05-07 need
# ~700 of them to reach the 2,000 scored tokens below which compression data is refused.
USER_PARAMS = {
    "00_task_and_policy": {},
    "01_long_tail_rollout": {},
    "02_speculative_decoding": {"fit_minutes": 0.02},  # drafter: the CLI's head
    "03_adaptive_drafter": {"drafter": "auto", "fit_minutes": 0.02},
    "04_tlt_rl": {"drafter": "auto", "fit_minutes": 0.02, "seeds": [0]},
    "05_pruning": {"train_size": 800},
    "06_distillation": {"train_size": 800},   # layer_pairs: spread over its 4 layers
    "07_minitron_pipeline": {"train_size": 800, "fit_minutes": 0.02},
}
# notebook 04 with the baseline alone (pipelines/tlt.yaml's long baseline) on the user's model
BASELINE_ALONE = {"variants": ["baseline"], "seeds": [0], "steps": 2, "eval_every": 1,
                  "divergence_steps": 1}
# the order runs start in: the longest first (measured at smoke size, seconds)
LONGEST_FIRST = ("08_ray_scaling", "02_speculative_decoding", "04_tlt_rl", "05_pruning", "03_adaptive_drafter",
                 "09_drafter_staleness",
                 "07_minitron_pipeline", "01_long_tail_rollout", "00_task_and_policy",
                 "06_distillation")


@dataclass(frozen=True)
class NotebookSuite:
    """Every notebook run of the session: ``runs[stem]`` on the embedded default model (02-07;
    00 and 01 are the quickstart's), ``runs["user_" + stem]`` on the user's model and task,
    ``runs["user_04_baseline_alone"]``; ``user_task`` is the user's JSONL file."""

    runs: dict[str, NotebookRun]
    user_task: Path


def run_all_notebooks(folder: Path, smoke: dict) -> NotebookSuite:
    """Build the user's model, task and CLI-fitted head under ``folder``, then run the default
    model's smoke runs and the user's runs as one pipeline (``smoke``: stem -> (parameters,
    metric keys))."""
    from .user_model import save_user_model, word_problems
    model = save_user_model(folder / "model", "qwen2", num_hidden_layers=4)
    task = folder / "word_problems.jsonl"
    task.write_text("".join(json.dumps(p) + "\n" for p in word_problems(1200, seed=3)))
    cache, head = folder / "cache", folder / "eagle"
    env = {"WORKBENCH_CACHE": str(cache)}  # the kernels' drafters are fitted into it
    cli = workbench_cli("drafter", "train", "--model", str(model), "--task", str(task),
                        "--out", str(head), "--minutes", "0.02", cwd=ROOT, env=env)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "tau" in cli.stdout and (head / "provenance.json").is_file(), cli.stdout[-2000:]
    user = {"model": str(model), "task": str(task)}
    entries = {}
    for stem in LONGEST_FIRST:
        if stem in USER_PARAMS:
            entries[f"user_{stem}"] = (stem, {**smoke[stem][0], **USER_PARAMS[stem], **user})
        if stem in smoke and stem not in ("00_task_and_policy", "01_long_tail_rollout"):
            entries[stem] = (stem, smoke[stem][0])
    entries["user_02_speculative_decoding"][1]["drafter"] = str(head)
    entries["user_04_baseline_alone"] = ("04_tlt_rl", {**smoke["04_tlt_rl"][0],
                                                       **BASELINE_ALONE, **user})
    return NotebookSuite(run_notebooks(folder, entries, env=env), task)
