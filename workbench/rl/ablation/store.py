"""Where a resumable ablation keeps what it has done, so that a call with the same arguments
and folder picks up where the last one stopped (``run_ablation(checkpoint_dir=...)``).

A long ablation (``pipelines/tlt.yaml``'s ``remedies_long``: hours) outlasts one session.
Each run already checkpoints its whole loop (``TLTTrainer``, ``RemedyTrainer``), so the
ablation only needs to keep what it was asked, what it measured beside its runs, and what no
trainer checkpoint holds. The folder:

- ``ablation.json``: the settings (:func:`ablation_settings`); a call with other settings is
  refused before anything runs: its runs would continue another ablation's;
- ``progress.json``: the RL steps every run has checkpointed (``steps_done``) and the
  held-out evaluations so far (``evals``), which a resumed call does not redo;
- ``<variant>-seed<seed>/state``: the run's trainer checkpoint (a folder of its own: the
  trainer replaces it whole at each save);
- ``<variant>-seed<seed>/timelines/step<NNNN>``: each RL step's timeline (``Timeline.save``),
  so that a resumed ablation's timelines, decisions and bandit choices cover every step.

Every file is written atomically (a temporary sibling, then ``os.replace``): an interruption
leaves the last version whole.

An ablation's seeds may run apart, as processes of their own (one core each, or other
machines), each with its own folder and ``seeds=[s]``: :func:`merge_ablations` joins the
folders into one, with which a call listing every seed returns the whole ablation's tables
(each pair the speedups compare, a variant against the baseline at one seed and step, ran in
one process).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pandas as pd

from ...atomic import atomic_dir, write_json
from ...checks import check_int
from ...clock import sim_seconds_kind
from ...rollout.timeline import Timeline
from ..checkpoint import saved_config
from ..remedies.compare import accuracy_over_seeds
from .runs import steps_done

__all__ = ["AblationStore", "ablation_progress", "ablation_settings", "merge_ablations",
           "saved_sim_seconds"]

SETTINGS_FILE = "ablation.json"
PROGRESS_FILE = "progress.json"


def ablation_settings(variants, seeds, grpo, problems, reward, eval_problems, eval_every,
                      eval_max_new_tokens, backend, tlt_kw: dict) -> dict:
    """What a resumed ablation must share with the one it resumes, as JSON: the variants and
    seeds in run order (the lockstep's rotation follows it), the GRPO config, TLT's
    arguments, a digest of the RL pool and of the held-out problems, the reward's name, the
    held-out evaluation's settings, the backend (its clock), and what a sim second is in
    this scope (``workbench.clock.sim_seconds_kind``: thread CPU time; ``"wall"`` in a folder
    saved before, which resumes on it: :func:`saved_sim_seconds`).
    ``steps`` is not among them: a finished ablation goes on to a larger ``steps``."""
    evaluation = None if eval_problems is None else {
        "problems": _digest(eval_problems), "count": len(eval_problems), "every": eval_every,
        "max_new_tokens": eval_max_new_tokens}
    return {"variants": list(variants), "seeds": [int(s) for s in seeds], "grpo": repr(grpo),
            "tlt": {k: repr(v) for k, v in sorted(tlt_kw.items())}, "pool": _digest(problems),
            "reward": getattr(reward, "__qualname__", type(reward).__qualname__),
            "eval": evaluation,
            "backend": backend if isinstance(backend, str) else type(backend).__name__,
            "sim_seconds": sim_seconds_kind()}


def run_folder(key: tuple) -> str:
    """The folder name of run ``key`` = ``(variant, seed)`` under an ablation's folder (its
    checkpoint, timelines and log)."""
    variant, seed = key
    return f"{variant}-seed{seed}"


def _digest(items) -> str:
    """A short hash of ``items``' reprs (problems are dataclasses: their fields, in order)."""
    return hashlib.sha1(repr(list(items)).encode()).hexdigest()[:16]


class AblationStore:
    """An ablation's folder (module docstring): its settings checked on opening, which writes
    nothing (a call refused after it leaves the folder as it was), and saved by
    :meth:`save_settings` once the runs are built; its runs' checkpoints, timelines and
    evaluations, saved every ``every`` steps (None: only at each evaluation and after the last
    step)."""

    def __init__(self, folder: str | os.PathLike, settings: dict, every: int | None):
        self.folder, self.every = Path(folder), check_int("checkpoint_every", every, 1,
                                                          optional=True)
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(f"checkpoint_dir {str(folder)!r} is an existing file; accepted: a "
                             "folder (created if missing)")
        self.settings = json.loads(json.dumps(settings))  # tuples as lists, as the saved file
        path = self.folder / SETTINGS_FILE
        if path.is_file():
            _check_same(_saved_settings(path), self.settings, path)
        progress = self.folder / PROGRESS_FILE
        saved = json.loads(progress.read_text()) if progress.is_file() else {}
        self.steps_done: int = saved.get("steps_done", 0)
        self.evals: list[dict] = saved.get("evals", [])
        self._saved: dict = {}  # run -> the steps whose timelines are on disk

    def save_settings(self) -> None:
        """Write the settings (the folder made if missing), once every check has passed and
        the runs are built: from here on the folder holds this ablation."""
        path = self.folder / SETTINGS_FILE
        if not path.is_file():
            write_json(path, self.settings)

    def check_steps(self, steps: int) -> None:
        """Refuse ``steps`` fewer than every run has already done here."""
        if steps < self.steps_done:
            raise ValueError(f"steps={steps}, but checkpoint_dir {str(self.folder)!r} already "
                             f"holds {self.steps_done} steps of every run; accepted: steps >= "
                             f"{self.steps_done}, or another folder")

    def run_dir(self, key: tuple) -> Path:
        return self.folder / run_folder(key)

    def state_dir(self, key: tuple) -> Path:
        """The trainer checkpoint's folder of run ``key`` = ``(variant, seed)``."""
        return self.run_dir(key) / "state"

    def restore(self, runs: dict) -> None:
        """Give every run (restored from its checkpoint) the timelines of the steps it has
        done; a timeline saved past its checkpoint (an interrupted save) is left to be
        written again."""
        for key, trainer in runs.items():
            done = steps_done(trainer)
            folders = {int(f.name.removeprefix("step")): f
                       for f in sorted((self.run_dir(key) / "timelines").glob("step*"))}
            trainer.restore_timelines({step: Timeline.load(f) for step, f in folders.items()
                                       if step < done})
            self._saved[key] = set(trainer.record.timelines)

    def due(self, step: int, evaluation: bool, steps: int) -> bool:
        """Whether the runs checkpoint after ``step``: every ``every`` steps, at an
        evaluation (``evaluation``: one was due there) and after the last of ``steps``."""
        return evaluation or step == steps or bool(self.every) and step % self.every == 0

    def save_evals(self) -> None:
        """Write the evaluations so far (:attr:`evals`) beside the checkpoints."""
        write_json(self.folder / PROGRESS_FILE, {"steps_done": self.steps_done,
                                                 "evals": self.evals}, indent=None)

    def checkpoint(self, runs: dict, step: int) -> None:
        """Save every run after ``step`` lockstep steps: its new timelines, then its trainer
        checkpoint, then ``progress.json`` once all are saved."""
        for key, trainer in runs.items():
            saved = self._saved.setdefault(key, set())
            for n, timeline in sorted(trainer.record.timelines.items()):
                if n not in saved:
                    timeline.save(self.run_dir(key) / "timelines" / f"step{n:04d}")
                    saved.add(n)
            trainer.save_checkpoint(self.state_dir(key))
        self.steps_done = step
        self.save_evals()


def saved_sim_seconds(folder) -> str | None:
    """What a sim second was in the ablation saved in ``folder`` (``workbench.clock``): a run
    resumed there goes on measuring the same kind (``clock.sim_seconds``); None where no
    ablation recorded one (no folder yet: a new run measures thread CPU time)."""
    path = None if folder is None else Path(folder) / SETTINGS_FILE
    if path is None or not path.is_file():
        return None
    return json.loads(path.read_text()).get("sim_seconds")


def _check_same(saved: dict, settings: dict, path: Path) -> None:
    """Refuse ``settings`` that differ from the ``saved`` ones, naming each difference."""
    differ = [f"{k}: saved {saved.get(k)!r}, this call {settings.get(k)!r}"
              for k in _differing(saved, settings)]
    if differ:
        raise ValueError(f"checkpoint_dir {str(path.parent)!r} holds an ablation with other "
                         "settings:\n  " + "\n  ".join(differ) + "\naccepted: the settings "
                         f"saved in {str(path)!r} (the same arguments), another folder, or "
                         "delete this one to start over")


def _differing(a: dict, b: dict) -> list[str]:
    """The keys whose values differ between two ablations' settings, in their order."""
    return [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]


def _read_folder(folder: Path) -> tuple[dict, dict]:
    """An ablation folder's settings and progress (empty before its first checkpoint)."""
    if not (folder / SETTINGS_FILE).is_file():
        raise ValueError(f"{str(folder)!r} has no {SETTINGS_FILE}; accepted: the "
                         "checkpoint_dir of a run_ablation call")
    path = folder / PROGRESS_FILE
    return (_saved_settings(folder / SETTINGS_FILE),
            json.loads(path.read_text()) if path.is_file() else {})


def _saved_settings(path: Path) -> dict:
    """The settings in ``path``, their configs' reprs as this version writes them
    (``rl.checkpoint.saved_config``)."""
    saved = json.loads(path.read_text())
    if isinstance(saved.get("grpo"), str):
        saved["grpo"] = saved_config(saved["grpo"])
    if isinstance(saved.get("tlt"), dict):
        saved["tlt"] = {k: saved_config(v) if isinstance(v, str) else v
                        for k, v in saved["tlt"].items()}
    return saved


def ablation_progress(folders) -> tuple[dict[str, int], pd.DataFrame]:
    """How far the ablations in ``folders`` (``run_ablation`` checkpoint folders: one, or the
    folders of one ablation's seeds run apart) have got, from their progress files alone: no
    model is loaded, and the running processes write those files atomically, so a long run
    can be watched while it goes on. Returns each folder's RL steps checkpointed, and the
    held-out accuracy so far per variant (in run order) and evaluated step: ``accuracy`` and
    ``accuracy_sd`` (mean and standard deviation over the seeds evaluated there) and
    ``seeds`` (how many)."""
    folders = [Path(f) for f in folders]
    if not folders:
        raise ValueError("folders []: accepted one or more ablation folders")
    read = [_read_folder(f) for f in folders]
    steps = {str(f): int(p.get("steps_done", 0)) for f, (_, p) in zip(folders, read)}
    evals = pd.DataFrame([e for _, p in read for e in p.get("evals", [])],
                         columns=["variant", "seed", "step", "accuracy"])
    order = list(dict.fromkeys(v for s, _ in read for v in s["variants"]))
    return steps, accuracy_over_seeds(evals, order)


def merge_ablations(sources, target: str | os.PathLike) -> Path:
    """Join the folders of one ablation's seeds run apart (``sources``: each ``run_ablation``'s
    ``checkpoint_dir``, with the same settings but disjoint seeds) into ``target``, a new
    folder: its settings list every seed in the order of ``sources``, every run's folder is
    hard-linked in (copied across file systems; a trainer replaces its checkpoint whole, so
    neither side changes the other's), and the evaluations are joined. ``run_ablation``
    with the joined seeds and ``checkpoint_dir=target`` then goes on from where each run
    stands, or returns the tables of a finished ablation. Everything is checked before
    ``target`` is written, and it appears whole or not at all."""
    folders = [Path(f) for f in sources]
    target = Path(target)
    if len(folders) < 2:
        raise ValueError(f"sources {[str(f) for f in folders]}: accepted two or more ablation "
                         "folders")
    if target.exists():
        raise ValueError(f"target {str(target)!r} exists; accepted: a new folder")
    settings, progress = zip(*(_read_folder(f) for f in folders))
    for folder, other in zip(folders[1:], settings[1:]):
        differ = [k for k in _differing(settings[0], other) if k != "seeds"]
        if differ:
            raise ValueError(f"{str(folder)!r} holds another ablation than {str(folders[0])!r} "
                             f"(they differ in {differ}); accepted: folders of one ablation's "
                             "seeds, whose settings differ in the seeds alone")
    seeds = [seed for s in settings for seed in s["seeds"]]
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"the folders' seeds {[s['seeds'] for s in settings]} overlap; "
                         "accepted: each seed in one folder")
    evals = [e for p in progress for e in p.get("evals", [])]
    with atomic_dir(target) as tmp:
        for folder, s in zip(folders, settings):
            for variant in s["variants"]:
                for seed in s["seeds"]:
                    run = folder / f"{variant}-seed{seed}"
                    if run.is_dir():
                        shutil.copytree(run, tmp / run.name, copy_function=_link_or_copy)
        write_json(tmp / SETTINGS_FILE, {**settings[0], "seeds": seeds})
        write_json(tmp / PROGRESS_FILE, {"steps_done": min(p.get("steps_done", 0)
                                                           for p in progress),
                                         "evals": evals}, indent=None)
    return target


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, destination)
