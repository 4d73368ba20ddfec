"""The pipeline YAML: its format, and its parsing and validation into runs.

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
error. A value must also have the kind of the parameter's default in the notebook (a number, a
string, a list...; null always passes), so that a value the notebook could not take is refused
here rather than by the notebook after its run folder is written. All checks happen before
anything runs or is written: a bad pipeline leaves no trace.

:func:`load_pipeline` turns a YAML into its validated :class:`RunSpec` list; they run in
:mod:`workbench.pipeline`.
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import papermill
import yaml

from .checks import check_int

__all__ = ["PipelineError", "RunSpec", "Pipeline", "load_pipeline", "TOP_KEYS", "ENTRY_KEYS",
           "OUT_DIR", "SEED"]

TOP_KEYS = ("name", "notebooks")
ENTRY_KEYS = ("notebook", "name", "parameters", "grid", "seeds")
OUT_DIR = "out_dir"
SEED = "seed"


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
    if path.is_dir():
        raise PipelineError(f"{path} is a folder, not a pipeline YAML file (e.g. pipelines/quickstart.yaml)")
    if not path.is_file():
        raise PipelineError(f"pipeline file not found: {path}")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise PipelineError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path}: not valid YAML{_yaml_where(exc)}") from exc
    if not isinstance(config, dict):
        raise PipelineError(f"{path}: expected a mapping with keys {list(TOP_KEYS)}")
    return config


def _yaml_where(exc: yaml.YAMLError) -> str:
    """Where and what a YAML error is, on one line (PyYAML's own text spans several)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    what = " ".join(str(part) for part in (getattr(exc, "context", None),
                                           getattr(exc, "problem", None)) if part)
    return f"{where}: {what or exc}".replace("\n", " ")


def _suggest(unknown: list, accepted) -> str:
    """`` (did you mean 'x'?)`` for near misses of the accepted names, else empty."""
    close = [m for name in unknown for m in difflib.get_close_matches(str(name), list(accepted), 1)]
    return f" (did you mean {', '.join(repr(m) for m in close)}?)" if close else ""


def _check_keys(mapping: dict, accepted: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(mapping) - set(accepted), key=str)
    if unknown:
        raise PipelineError(f"{where}: unknown key(s) {unknown}; accepted: {list(accepted)}"
                            f"{_suggest(unknown, accepted)}")


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
        grid = {**grid, SEED: _seeds(entry["seeds"], where)}
    _check_overlaps(fixed, grid, where)

    notebook_path, root = _resolve_notebook(notebook, yaml_path)
    declared = _check_declared(notebook_path, [*fixed, *grid, OUT_DIR], where)
    _check_kinds(declared, {**{k: [v] for k, v in fixed.items()}, **grid}, where)
    prefix = _slug(str(entry.get("name", notebook_path.stem)))
    combos = itertools.product(*grid.values())
    return [RunSpec(pipeline=pipeline, entry=prefix, notebook=notebook, notebook_path=notebook_path,
                    root=root, parameters={**fixed, **dict(zip(grid, combo))}, varied=tuple(grid))
            for combo in combos]


def _mapping(value: Any, key: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise PipelineError(f"{where}: `{key}` must be a mapping of parameter names, got {value!r}")
    return value


def _seeds(seeds: Any, where: str) -> list[int]:
    """A non-empty list of seeds, each an integer >= 0 (what every notebook's ``seed`` takes)."""
    if not isinstance(seeds, list) or not seeds:
        raise PipelineError(f"{where}: `seeds` must be a non-empty list of integers, got {seeds!r}")
    try:
        return [check_int(f"{where}: `seeds` item {i}", seed, 0) for i, seed in enumerate(seeds)]
    except ValueError as exc:
        raise PipelineError(str(exc)) from None


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


def _check_declared(notebook_path: Path, names: list[str], where: str) -> dict:
    """Every parameter must be declared in the notebook's parameters cell (papermill only warns);
    the declared parameters, as papermill inspects them."""
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
                            f"parameters cell; declared: {sorted(declared)}"
                            f"{_suggest(missing, sorted(declared))}")
    return declared


# What a value may be, by the kind of the notebook's default: a pipeline value of another kind
# (a list for a number, a number in quotes) is a mistake the notebook would find only once it
# runs, after its folder is written. None is always let through (many parameters read it as
# "off"), and a default that is not a literal tells nothing.
KINDS = ((bool, (bool,), "true or false"), (int, (int,), "an integer"),
         (float, (int, float), "a number"), (str, (str,), "a string"),
         ((list, tuple), (list,), "a list"), (dict, (dict,), "a mapping"))


def _check_kinds(declared: dict, values: dict[str, list], where: str) -> None:
    """Each value given for a parameter has the kind of the notebook's default (:data:`KINDS`)."""
    for name, given in values.items():
        try:
            default = ast.literal_eval(declared[name]["default"])
        except (ValueError, SyntaxError, TypeError):
            continue
        match = next(((accepted, words) for kind, accepted, words in KINDS
                      if isinstance(default, kind)), None)
        if match is None:  # a None default, or one of no listed kind: anything goes
            continue
        accepted, words = match
        bad = [v for v in given if v is not None and (
            not isinstance(v, accepted) or (isinstance(v, bool) and bool not in accepted))]
        if bad:
            raise PipelineError(f"{where}: parameter {name!r} = {bad[0]!r}; the notebook "
                                f"takes {words} there (its default: {default!r}) or null")


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
