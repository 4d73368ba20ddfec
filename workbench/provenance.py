"""Results with their provenance: one JSON file per question in ``benchmarks/results/``,
written, validated and read back here; the table ``RESULTS.md`` is generated from them by
:mod:`workbench.provenance_table` (``workbench results table``).

Every benchmark (``benchmarks/common.py``: ``record``) and every notebook run that a lab
note (``docs/lab-notes/``) quotes (``workbench results record``) writes its figures here, beside what
is needed to trust and reproduce them: the clock they were read on, how much of the run the
machine was busy with something else, the machine, the exact command, the commit and the date.

The file ``<folder>/<name>.json`` (schema 1)::

    {
      "schema": 1,
      "name": "bench_engine",                 # the file's stem: letters, digits, _ . -
      "question": "Rollout engine vs HF generate: greedy tokens/s ratio per batch size",
      "figures": {                            # at least one; names as the result's name
        "ratio_bs1": {"value": 1.54, "min": 1.50, "max": 1.70, "n": 5, "unit": "x"},
        "speedup":   {"value": 1.08, "q25": 1.02, "q75": 1.12, "n": 30}
      },
      "headline": ["ratio_bs1"],              # the figures RESULTS.md shows (default: all)
      "clock": "wall",                        # one of CLOCKS
      "disturbed_share": 0.0,                 # share of repeats/steps disturbed, or null
      "disturbed_bound": 0.8,                 # the CPU share under which one is disturbed
      "machine": {"cpu": "AMD EPYC", "flags": ["avx2", "avx512f"], "cores": 2,
                  "usable_cores": 2, "accelerator": null, "torch": "2.13.0+cpu",
                  "transformers": "5.25.0", "python": "3.11.9", "platform": "Linux-..."},
      "command": ".venv/bin/python benchmarks/bench_engine.py --batch-sizes 1 8 32 ...",
      "git": {"commit": "85262ac...", "dirty": false},   # both null outside a git checkout
      "date": "2025-06-01T12:00:00+00:00"     # UTC, ISO 8601, when the result was written
    }

A **figure** is one number with its spread: ``value`` (required, a finite number: the median,
or the mean where the question says so), then optionally ``q25`` and ``q75`` (quartiles),
``min`` and ``max``, ``n`` (how many repeats, steps or seeds it summarises; an integer >= 1)
and ``unit`` (a short string such as ``"x"``, ``"s"``, ``"tok/s"``). ``min <= q25 <= q75 <=
max`` and ``min <= value <= max`` must hold where given. A ratio from
``workbench.speedup.spread_stats`` maps as ``ratio -> value``, ``ratio_min -> min``,
``ratio_max -> max``, ``repeats -> n`` (:func:`figure_from_stats`).

The **clock** (:data:`CLOCKS`; docs/design.md, "clocks"): ``wall`` (time that passed, one
process or Ray actors), ``sim-thread-cpu`` (the sim clock's seconds read as the working
thread's CPU time), ``sim-wall`` (the sim clock read as wall time: a run resumed from a folder
saved before sim work ran on one thread), or ``none`` (figures that are not times: acceptance
lengths, accuracies, counts).

The **disturbed share**: a repeat or step's *CPU share* is the share of a core its work got,
CPU seconds over wall seconds (``workbench.clock.cpu_share``: the working thread's CPU time
on the sim clock, the process's on the wall clock); on a quiet machine a
CPU-bound run reads close to 1, and beside other work on the same cores it falls. The
disturbed share is the share of repeats or steps whose CPU share fell under
``disturbed_bound`` (``workbench.clock.DISTURBED_BELOW``, 0.8):
``summarize``'s ``disturbed_share`` of ``workbench.speedup``, a run's ``GRPO.usage``, or
:func:`disturbed` of the shares. ``null`` when it was not measured.

Writing validates everything first (an error names the bad value and what is accepted) and
writes atomically (``workbench.atomic``); reading validates each file again and names the
file it refuses. The machine and the commit come from ``workbench.machine``. This module
imports the foundation only (``checks``, ``atomic``, ``clock``, ``machine``) and pandas.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .atomic import write_text
from .checks import check_choice, check_fraction, check_int
from .clock import DISTURBED_BELOW
from .machine import ROOT, commit, machine

__all__ = ["SCHEMA", "CLOCKS", "FIGURE_FIELDS", "RESULT_COLUMNS", "clock_of", "figure_from_stats",
           "figures_from_metrics", "disturbed", "validate_result", "write_result", "read_result",
           "read_results", "result_files", "run_parameters", "KEYS", "OPTIONAL_KEYS"]

SCHEMA = 1
"""The version of the result files' format."""
CLOCKS = {
    "wall": "wall seconds (time that passed: one process, or Ray actors)",
    "sim-thread-cpu": "sim clock read as the working thread's CPU time",
    "sim-wall": "sim clock read as wall time (a run saved before one-thread sim work)",
    "none": "not a time (acceptance lengths, accuracies, counts)",
}
"""The clocks a figure may be measured on, each with what it means."""
FIGURE_FIELDS = ("value", "q25", "q75", "min", "max", "n", "unit")
"""The fields of one figure of a result."""
KEYS = ("schema", "name", "question", "figures", "headline", "clock", "disturbed_share",
        "disturbed_bound", "machine", "command", "git", "date", "parameters")
"""The keys of a result file, in the order it is written."""
OPTIONAL_KEYS = ("headline", "parameters")
"""The keys a result file may leave out: ``headline`` (default: every figure) and ``parameters``
(the notebook run's parameters, which ``workbench results record`` copies beside its metrics)."""
RESULT_COLUMNS = ["name", "question", "figure", "headline", *FIGURE_FIELDS[:-1], "unit",
                  "clock", "disturbed_share", "disturbed_bound", "cpu", "flags", "cores",
                  "accelerator", "torch", "transformers", "python", "command", "commit",
                  "dirty", "date"]
"""The columns of the results table (`results_table`), in order."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_NAMES = "1-100 letters, digits, '_', '.' or '-', starting with a letter or digit"


def figure_from_stats(stats: dict, unit: str | None = None) -> dict:
    """A figure from ``workbench.speedup.spread_stats`` (or a ``summarize`` row): the median
    ratio with its min, max and repeats."""
    out = {"value": float(stats["ratio"]), "min": float(stats["ratio_min"]),
           "max": float(stats["ratio_max"]), "n": int(stats["repeats"])}
    return out if unit is None else {**out, "unit": unit}


SPREAD_FIELDS = ("q25", "q75", "min", "max", "n")


def figures_from_metrics(metrics: dict, keys) -> dict:
    """Figures from a notebook run's flat ``metrics.json``: one per key of ``keys``, its value
    ``metrics[key]`` and its spread from ``<key>_q25``, ``<key>_q75``, ``<key>_min``,
    ``<key>_max``, ``<key>_n`` where present (for a key holding ``_median``, as notebook 04's
    ``e2e_speedup_median_tlt``, also that name with ``median`` replaced:
    ``e2e_speedup_q25_tlt``). A missing key is an error naming it and the keys there are."""
    keys = list(keys)
    if not keys:
        raise ValueError("keys must name at least one metric")
    figures = {}
    for key in keys:
        if key not in metrics:
            raise ValueError(f"metric {key!r} is not in the metrics; there are: "
                             f"{sorted(metrics)}")
        figure = {"value": metrics[key]}
        for field in SPREAD_FIELDS:
            names = [f"{key}_{field}"] + ([key.replace("_median", f"_{field}", 1)]
                                          if "_median" in key else [])
            found = next((n for n in names if metrics.get(n) is not None), None)
            if found is not None:
                figure[field] = metrics[found]
        figures[key] = figure
    return figures


def clock_of(metrics: dict) -> str | None:
    """The result clock (:data:`CLOCKS`) of a run's metrics: its ``clock`` as it is, except
    ``sim``, named by what its sim seconds were (``sim_seconds``: ``thread_cpu`` or ``wall``,
    ``workbench.clock``); None where the metrics cannot say."""
    clock = metrics.get("clock")
    if clock != "sim":
        return clock
    return {"thread_cpu": "sim-thread-cpu", "wall": "sim-wall"}.get(metrics.get("sim_seconds"))


def disturbed(cpu_shares, bound: float = DISTURBED_BELOW) -> float | None:
    """The share of ``cpu_shares`` (one per repeat or step: CPU seconds over wall seconds times
    threads) under ``bound``; None when there are none (not measured)."""
    bound = check_fraction("bound", bound, low_open=True)
    shares = [float(s) for s in cpu_shares]
    if not shares:
        return None
    return sum(s < bound for s in shares) / len(shares)


# ---- validation --------------------------------------------------------------------------

def _check_name(what: str, name) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{what} must be {_NAMES}, got {name!r}")
    return name


def _number(what: str, value) -> float:
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(float(value))):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _check_figure(name: str, figure) -> dict:
    what = f"figure {name!r}"
    if not isinstance(figure, dict):
        raise ValueError(f"{what} must be a dict with a 'value' and optionally "
                         f"{list(FIGURE_FIELDS[1:])}, got {figure!r}")
    unknown = sorted(set(figure) - set(FIGURE_FIELDS))
    if unknown:
        raise ValueError(f"{what} has unknown fields {unknown}; accepted: {list(FIGURE_FIELDS)}")
    if figure.get("value") is None:
        raise ValueError(f"{what} has no value: 'value' must be a finite number, got "
                         f"{figure.get('value')!r}")
    out = {}
    for field in FIGURE_FIELDS[:5]:
        if figure.get(field) is not None:
            out[field] = _number(f"{what}: {field!r}", figure[field])
    if figure.get("n") is not None:
        out["n"] = check_int(f"{what}: 'n'", figure["n"], 1)
    if figure.get("unit") is not None:
        if not isinstance(figure["unit"], str) or len(figure["unit"]) > 20:
            raise ValueError(f"{what}: 'unit' must be a string of at most 20 characters, got "
                             f"{figure['unit']!r}")
        out["unit"] = figure["unit"]
    order = [(a, b) for a, b in (("min", "q25"), ("q25", "q75"), ("q75", "max"), ("min", "max"),
                                 ("min", "value"), ("value", "max")) if a in out and b in out]
    for a, b in order:
        if out[a] > out[b]:
            raise ValueError(f"{what}: {a!r} ({out[a]:g}) must not exceed {b!r} ({out[b]:g}); "
                             "accepted: min <= q25 <= q75 <= max and min <= value <= max")
    return out


def _check_date(date) -> str:
    try:
        parsed = datetime.fromisoformat(date) if isinstance(date, str) else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.utcoffset() is None or parsed.utcoffset().total_seconds():
        raise ValueError(f"date must be a UTC ISO 8601 time such as "
                         f"'2025-06-01T12:00:00+00:00', got {date!r}")
    return date


def validate_result(result) -> dict:
    """``result`` (a result file's object) checked against schema 1 and normalised; a
    ``ValueError`` names the first bad value and what is accepted."""
    if not isinstance(result, dict):
        raise ValueError(f"a result must be a JSON object, got {type(result).__name__}")
    unknown = sorted(set(result) - set(KEYS))
    missing = [k for k in KEYS if k not in result and k not in OPTIONAL_KEYS]
    if unknown or missing:
        raise ValueError(f"a result holds exactly the keys {list(KEYS)} "
                         f"({list(OPTIONAL_KEYS)} optional); unknown {unknown}, missing {missing}")
    if result["schema"] != SCHEMA:
        raise ValueError(f"schema must be {SCHEMA}, got {result['schema']!r}")
    name = _check_name("name", result["name"])
    question = result["question"]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {question!r}")
    figures = result["figures"]
    if not isinstance(figures, dict) or not figures:
        raise ValueError(f"figures must be a non-empty dict of figure name -> figure, got "
                         f"{figures!r}")
    figures = {_check_name("a figure name", k): _check_figure(k, v) for k, v in figures.items()}
    headline = result.get("headline")
    if headline is None:
        headline = list(figures)
    if (not isinstance(headline, list) or not headline
            or any(h not in figures for h in headline)):
        raise ValueError(f"headline must be a non-empty list of figure names out of "
                         f"{list(figures)}, got {headline!r}")
    check_choice("clock", result["clock"], list(CLOCKS))
    share = check_fraction("disturbed_share", result["disturbed_share"],
                           optional="not measured")
    bound = check_fraction("disturbed_bound", result["disturbed_bound"], low_open=True)
    box = result["machine"]
    if not isinstance(box, dict) or not box.get("cpu") or not isinstance(box.get("flags"), list):
        raise ValueError("machine must be a dict with at least 'cpu' (a model name) and "
                         f"'flags' (a list), as machine() gives, got {box!r}")
    command = result["command"]
    if not isinstance(command, str) or not command.strip():
        raise ValueError(f"command must be the non-empty command that produced the result, "
                         f"got {command!r}")
    parameters = result.get("parameters")
    if parameters is not None and (not isinstance(parameters, dict)
                                   or not all(isinstance(k, str) for k in parameters)):
        raise ValueError(f"parameters must be a dict of parameter name -> value (the run's "
                         f"notebook parameters), got {parameters!r}")
    git = result["git"]
    if not isinstance(git, dict) or set(git) != {"commit", "dirty"}:
        raise ValueError(f"git must be {{'commit': ..., 'dirty': ...}} as commit() gives, "
                         f"got {git!r}")
    out = {"schema": SCHEMA, "name": name, "question": question.strip(), "figures": figures,
           "headline": list(headline), "clock": result["clock"], "disturbed_share": share,
           "disturbed_bound": bound, "machine": box, "command": command.strip(),
           "git": {"commit": git["commit"], "dirty": git["dirty"]},
           "date": _check_date(result["date"])}
    if parameters is not None:
        out["parameters"] = dict(parameters)
    return out


# ---- writing and reading -----------------------------------------------------------------

def default_folder() -> Path:
    """``benchmarks/results`` of this checkout."""
    return ROOT / "benchmarks" / "results"


def write_result(name: str, question: str, figures: dict, *, clock: str,
                 disturbed_share: float | None, command: str,
                 folder: str | os.PathLike | None = None, headline: list | None = None,
                 disturbed_bound: float = DISTURBED_BELOW, machine_info: dict | None = None,
                 git: dict | None = None, date: str | None = None,
                 parameters: dict | None = None) -> Path:
    """Validate and write ``<folder>/<name>.json`` atomically (default folder:
    ``benchmarks/results`` of this checkout); return its path. ``machine_info``, ``git`` and
    ``date`` default to this machine, this checkout's commit and now (UTC); a recorded
    notebook run passes its own, and its ``parameters``. Nothing is written when a value is
    refused."""
    _check_name("name", name)  # before the machine is read and git asked
    result = validate_result({
        "schema": SCHEMA, "name": name, "question": question, "figures": figures,
        "headline": headline, "clock": clock, "disturbed_share": disturbed_share,
        "disturbed_bound": disturbed_bound,
        "machine": machine() if machine_info is None else machine_info,
        "command": command, "git": commit() if git is None else git,
        "date": date or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **({} if parameters is None else {"parameters": parameters})})
    folder = Path(folder) if folder is not None else default_folder()
    return write_text(folder / f"{name}.json", json.dumps(result, indent=2) + "\n")


def read_result(path: str | os.PathLike) -> dict:
    """One result file, validated; a ``ValueError`` names the file and what is wrong."""
    path = Path(path)
    try:
        result = validate_result(json.loads(path.read_text(encoding="utf-8")))
        if result["name"] != path.stem:
            raise ValueError(f"its name {result['name']!r} is not the file's stem")
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"result file {str(path)!r}: {exc}") from exc
    return result


def result_files(folder: str | os.PathLike | None = None) -> list[Path]:
    """The result files of ``folder`` (default: :func:`default_folder`), by name."""
    folder = Path(folder) if folder is not None else default_folder()
    if not folder.is_dir():
        raise FileNotFoundError(f"no results folder {str(folder)!r} (the JSON files that "
                                "write_result writes, e.g. benchmarks/results)")
    return sorted(folder.glob("*.json"))


def read_results(folder: str | os.PathLike | None = None) -> pd.DataFrame:
    """Every result of ``folder`` as one row per figure (columns :data:`RESULT_COLUMNS`),
    ordered by result name, then figure as written; empty with those columns when the
    folder holds none."""
    rows = []
    for path in result_files(folder):
        r = read_result(path)
        box = r["machine"]
        for fig, values in r["figures"].items():
            rows.append({"name": r["name"], "question": r["question"], "figure": fig,
                         "headline": fig in r["headline"],
                         **{f: values.get(f) for f in FIGURE_FIELDS},
                         "clock": r["clock"], "disturbed_share": r["disturbed_share"],
                         "disturbed_bound": r["disturbed_bound"], "cpu": box.get("cpu"),
                         "flags": ",".join(box.get("flags", [])), "cores": box.get("cores"),
                         "accelerator": box.get("accelerator"), "torch": box.get("torch"),
                         "transformers": box.get("transformers"), "python": box.get("python"),
                         "command": r["command"], "commit": r["git"]["commit"],
                         "dirty": r["git"]["dirty"], "date": r["date"]})
    table = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    table[list(FIGURE_FIELDS[:5])] = table[list(FIGURE_FIELDS[:5])].astype(float)
    table["n"] = table["n"].astype("Int64")
    return table


def run_parameters(metrics: str | os.PathLike, notebook: str | os.PathLike | None = None) -> dict | None:
    """The parameters of the notebook run that wrote ``metrics`` (its ``metrics.json``): from
    the ``run.json`` beside it (a pipeline run), else from the executed notebook's papermill
    metadata: ``notebook`` when given, else ``notebook.ipynb`` beside the metrics or
    ``<run folder>.ipynb`` beside the run folder (``papermill NB runs/x.ipynb -p out_dir runs/x``).
    None when none of these exists; a ``ValueError`` when ``notebook`` is given and holds none."""
    metrics = Path(metrics)
    run = metrics.with_name("run.json")
    if notebook is None and run.is_file():
        return json.loads(run.read_text(encoding="utf-8")).get("parameters")
    candidates = ([Path(notebook)] if notebook is not None else
                  [metrics.with_name("notebook.ipynb"), metrics.parent.with_suffix(".ipynb")])
    for path in candidates:
        if path.is_file():
            meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
            parameters = meta.get("papermill", {}).get("parameters")
            if parameters is None and notebook is not None:
                raise ValueError(f"{str(path)!r} holds no papermill parameters (metadata."
                                 "papermill.parameters): pass the notebook papermill executed")
            return parameters
    if notebook is not None:
        raise ValueError(f"no notebook {str(notebook)!r}")
    return None
