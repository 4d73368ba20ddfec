"""The notebooks' integration tests: every notebook run of the session, started in the
background with the first test and read by tests that run last.

A notebook run costs ~9 s before its first line of work (a kernel, torch, transformers, the
model) and the suite has some twenty of them. They go to the command line as two pipelines, the
quickstart (as the README's main job runs it: :func:`run_quickstart_at_smoke_size`) and then
every other run (:func:`notebook_suite_entries`), each ``--jobs 2``, the longest runs first so
that the last ones to finish are short (two kernels of one thread each finish the lot ~1.6x sooner
than one after another on two cores; two of two threads each would run 4x slower).
:class:`SessionRuns` runs both in processes of their own while the rest of the suite goes on:
the unit tests keep about one core busy, and the kernels take what they leave; every process
of the session has one torch thread (conftest.py), since threads that outnumber free cores
spin. conftest.py starts it with the first test and moves the tests that read the runs to the
end of the session, where they wait for them (``quickstart_runs``, ``notebook_runs``). The tests then read each
run's folder: the executed ``notebook.ipynb``, ``metrics.json``, figures and ``run.json``.

Under pytest-xdist (the README's test command runs two workers) the first worker to claim the
session's shared folder (:func:`claim`) runs them and publishes each pipeline's outcome there
as JSON; a test on the other worker reads them through :class:`PublishedRuns`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from workbench.pipeline import load_results

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
    under ``folder`` through the command line, ``jobs`` at a time, from the project root (as a
    user would), with ``env`` set for the kernels; name -> run."""
    spec = {"name": "tests", "notebooks": [
        {"notebook": str(ROOT / "notebooks" / f"{stem}.ipynb"), "name": name,
         "parameters": params} for name, (stem, params) in entries.items()]}
    path = folder / "tests.yaml"
    path.write_text(yaml.safe_dump(spec))
    ran = workbench_cli("pipeline", "run", str(path), "--runs-root", str(folder / "runs"),
                        "--jobs", str(jobs), cwd=ROOT, env=env)
    assert ran.returncode in (0, 1), ran.stderr[-3000:]  # 1: a run failed (its test says why)
    table = load_results(folder / "runs" / "tests")
    return {entry: NotebookRun(folder / "runs" / "tests" / run_name)
            for entry, run_name in zip(table["entry"], table["run_name"])}


_RUNNING: set[subprocess.Popen] = set()  # workbench_cli's processes still running


def workbench_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m workbench *args`` in a fresh process, as a user types it (``env`` on top of
    this process's environment); :func:`stop_cli` ends it early."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    argv = [sys.executable, "-m", "workbench", *args]
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as process:
        _RUNNING.add(process)
        try:
            # a bound against a hang, not a timing: load stretches the notebooks' pipeline
            # several-fold (beside other work it has passed 10 minutes), so it is generous
            out, err = process.communicate(timeout=3600)
        finally:
            _RUNNING.discard(process)
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def stop_cli() -> None:
    """Kill what :func:`workbench_cli` still runs (a session that ends before its notebook runs
    do, e.g. stopped at its first failure)."""
    for process in list(_RUNNING):
        process.kill()


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
    # a researcher's importance score (tests/plugins/taylor_importance.py) ranked beside the
    # built-ins: tests/test_notebook_importance_plugin.py reads this run
    "05_pruning": {"train_size": 800, "plugins": [str(ROOT / "tests" / "plugins" /
                                                      "taylor_importance.py")],
                   "rankings": ["activation:*", "weight_magnitude", "random", "taylor"]},
    "06_distillation": {"train_size": 800},   # layer_pairs: spread over its 4 layers
    "07_minitron_pipeline": {"train_size": 800, "fit_minutes": 0.02},
}
# notebook 04 with the baseline alone (pipelines/tlt.yaml's long baseline) on the user's model
BASELINE_ALONE = {"variants": ["baseline"], "seeds": [0], "steps": 2, "eval_every": 1,
                  "divergence_steps": 1}
# the order runs start in: the longest first (measured at smoke size, seconds), but notebook 08
# last: it starts a local Ray, whose node has a fixed 30 s to register, which a machine busy
# with two kernels and the unit tests can miss; by the end the unit tests are done
LONGEST_FIRST = ("02_speculative_decoding", "04_tlt_rl", "05_pruning", "03_adaptive_drafter",
                 "09_drafter_staleness", "07_minitron_pipeline", "01_long_tail_rollout",
                 "00_task_and_policy", "06_distillation", "11_long_tail_remedies",
                 "10_cluster_what_if", "12_diagnose", "08_ray_scaling")


# notebooks whose default-model smoke run the session leaves out: 00 and 01 are the
# quickstart's; 03, 05, 06 and 07 run the same code on the default model as on the user's (a
# kernel is ~9 s before its first line of work, and the suite's time is CPU-bound), so their
# smoke checks read the user's run. 02 and 04 keep theirs: on the default model they serve the
# heads shipped in data/, on the user's a head fitted on the spot.
DEFAULT_COVERED_BY_USER = ("00_task_and_policy", "01_long_tail_rollout", "03_adaptive_drafter",
                           "05_pruning", "06_distillation", "07_minitron_pipeline")


@dataclass(frozen=True)
class NotebookSuite:
    """Every notebook run of the session: ``runs[stem]`` on the embedded default model (but
    :data:`DEFAULT_COVERED_BY_USER`), ``runs["user_" + stem]`` on the user's model and task,
    ``runs["user_04_baseline_alone"]``; ``user_task`` is the user's JSONL file."""

    runs: dict[str, NotebookRun]
    user_task: Path


def notebook_suite_entries(folder: Path, smoke: dict) -> tuple[dict, dict, Path]:
    """Build the user's model, task and CLI-fitted head under ``folder``; the pipeline
    entries of the default model's smoke runs and the user's runs (``smoke``: stem ->
    (parameters, metric keys)), the kernels' environment and the task's path."""
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
        if stem in smoke and stem not in DEFAULT_COVERED_BY_USER:
            entries[stem] = (stem, smoke[stem][0])
    entries["user_02_speculative_decoding"][1]["drafter"] = str(head)
    entries["user_04_baseline_alone"] = ("04_tlt_rl", {**smoke["04_tlt_rl"][0],
                                                       **BASELINE_ALONE, **user})
    return entries, env, task


class SessionRuns:
    """The quickstart's runs and every other notebook run (``smoke``: stem -> (parameters,
    metric keys)), under ``root``, from a background thread whose work happens in processes
    of their own (module docstring): the quickstart's pipeline beside the building of the
    user's model and head, then the other pipeline. :meth:`quickstart` and
    :meth:`notebooks` wait for theirs; an error in the background is raised there.
    ``publish_to``: a folder that other processes read them from (:class:`PublishedRuns`)."""

    def __init__(self, root: Path, smoke: dict, publish_to: Path | None = None):
        self.root, self.smoke, self.publish_to = root, smoke, publish_to
        self._quickstart: Path | None = None
        self._suite: NotebookSuite | None = None
        self._error: BaseException | None = None
        self._quickstart_done, self._suite_done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="notebook-runs", daemon=True)

    def start(self) -> "SessionRuns":
        self._thread.start()
        return self

    def _run(self) -> None:
        quickstart = threading.Thread(target=self._run_quickstart, name="quickstart")
        quickstart.start()
        try:
            # the user's model, task and head are built beside the quickstart's two kernels;
            # the other runs wait for them to end: two kernels at a time, not four
            folder = self._folder("notebooks")
            entries, env, task = notebook_suite_entries(folder, self.smoke)
            quickstart.join()
            self._suite = NotebookSuite(run_notebooks(folder, entries, env=env), task)
        except BaseException as exc:  # raised again in the test that waits
            self._error = exc
        finally:
            quickstart.join()
            self._publish("notebooks", None if self._suite is None else {
                "runs": {name: str(run.folder) for name, run in self._suite.runs.items()},
                "user_task": str(self._suite.user_task)})
            self._suite_done.set()

    def _run_quickstart(self) -> None:
        try:
            self._quickstart = run_quickstart_at_smoke_size(self._folder("quickstart"),
                                                            self.smoke)
        except BaseException as exc:
            self._error = exc
        finally:
            self._publish("quickstart", None if self._quickstart is None else
                          {"folder": str(self._quickstart)})
            self._quickstart_done.set()

    def _publish(self, name: str, outcome: dict | None) -> None:
        """Write a pipeline's outcome (None: it failed) where :class:`PublishedRuns` reads it,
        atomically: a reader never sees half a file."""
        if self.publish_to is None:
            return
        outcome = outcome or {"error": repr(self._error)}
        tmp = self.publish_to / f".{name}.json.tmp"
        tmp.write_text(json.dumps(outcome))
        os.replace(tmp, self.publish_to / f"{name}.json")

    def _folder(self, name: str) -> Path:
        folder = self.root / name
        folder.mkdir(parents=True)
        return folder

    def _wait(self, done: threading.Event, value):
        done.wait()
        if value() is None:
            raise RuntimeError("the session's notebook runs failed") from self._error
        return value()

    def quickstart(self) -> Path:
        """The quickstart pipeline's folder of runs, once it has run."""
        return self._wait(self._quickstart_done, lambda: self._quickstart)

    def notebooks(self) -> NotebookSuite:
        """Every other notebook run, once all have run."""
        return self._wait(self._suite_done, lambda: self._suite)

    def wait(self) -> None:
        """Return once every run has ended, failed or not."""
        self._suite_done.wait()


def claim(shared: Path) -> bool:
    """Whether this process is the first of the session's pytest-xdist workers to claim the
    session's notebook runs in ``shared`` (the folder the controller opened for its workers:
    tests/xdist_groups.py): it runs them, the others read them (:class:`PublishedRuns`)."""
    try:
        os.close(os.open(shared / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@dataclass(frozen=True)
class PublishedRuns:
    """The session's notebook runs as a pytest-xdist worker that did not claim them sees
    them: :meth:`quickstart` and :meth:`notebooks` wait for the outcome the claiming worker
    publishes in ``shared`` (:meth:`SessionRuns._publish`)."""

    shared: Path
    poll_s: float = 0.5
    bound_s: float = 3600  # against a hang, as workbench_cli's

    def _outcome(self, name: str) -> dict:
        path, deadline = self.shared / f"{name}.json", time.monotonic() + self.bound_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {path} after {self.bound_s:.0f} s: did the worker "
                                   "running the session's notebook runs die?")
            time.sleep(self.poll_s)
        outcome = json.loads(path.read_text())
        if "error" in outcome:
            raise RuntimeError("the session's notebook runs failed in the worker that ran "
                               f"them: {outcome['error']}")
        return outcome

    def quickstart(self) -> Path:
        return Path(self._outcome("quickstart")["folder"])

    def notebooks(self) -> NotebookSuite:
        outcome = self._outcome("notebooks")
        return NotebookSuite({name: NotebookRun(Path(folder))
                              for name, folder in outcome["runs"].items()},
                             Path(outcome["user_task"]))

    def wait(self) -> None:
        """Return once every run has ended, failed or not."""
        try:
            self._outcome("notebooks")
        except RuntimeError:
            pass
