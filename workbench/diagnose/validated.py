"""The simulator's validated error, read from where the validation runs recorded it.

Why: a predicted gain is worth as much as the error of the model that made it. The cluster
simulator was checked on held-out real rollouts (notebook 10, ``cluster.validation``) and on a
whole RL run (notebook 04, ``cluster.run_check``); their figures live in the result files of
``benchmarks/results/`` (schema: ``workbench/provenance.py``). The diagnosis quotes them beside
each prediction rather than a number of its own. The long-tail remedies' model
(``cluster.remedies``) is checked apart, on a notebook 11 run (``cluster.remedy_check``): its
figures are ``remedy_sim_error_<variant>``, one per remedy, and a remedy with none recorded is
reported as not validated, never given another's error.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

__all__ = ["validated_errors", "headline_error", "remedy_error", "RESULTS", "HEADLINE",
           "REMEDY_ERROR"]

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
HEADLINE = "sim_error_small_n"  # held-out rollouts' makespan error on the sim clock (nb10)
REMEDY_ERROR = "remedy_sim_error_{variant}"
"""The figure name of the remedy model's error for one notebook 11 variant
(``cluster.remedy_check`` on a notebook 11 run)."""


def validated_errors(folder: str | os.PathLike = RESULTS) -> pd.DataFrame:
    """Every simulator-error figure of the result files in ``folder``: ``figure``, ``value``
    (a relative error), ``result`` (its file's name), ``question`` and ``clock``. Empty where
    the folder holds none (a package installed without the repository)."""
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            figures = record["figures"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for name, figure in figures.items():
            if "error" in name and isinstance(figure, dict) and "value" in figure:
                rows.append({"figure": name, "value": float(figure["value"]),
                             "result": path.stem, "question": record.get("question", ""),
                             "clock": record.get("clock", "")})
    return pd.DataFrame(rows, columns=["figure", "value", "result", "question", "clock"])


def headline_error(folder: str | os.PathLike = RESULTS) -> dict | None:
    """The error quoted beside each simulated prediction: the largest recorded
    ``sim_error_small_n`` (held-out rollouts on the sim clock, notebook 10) with its result
    file; None where none is recorded."""
    errors = validated_errors(folder)
    errors = errors[errors["figure"] == HEADLINE]
    if not len(errors):
        return None
    worst = errors.loc[errors["value"].idxmax()]
    return {"error": float(worst["value"]), "figure": HEADLINE, "result": worst["result"]}


def remedy_error(variant: str, folder: str | os.PathLike = RESULTS,
                 padded: bool = False) -> dict | None:
    """The remedy model's validated error for notebook 11's ``variant`` (``overprovision``,
    ``april``, ``partial``, ``tail_batching``): the recorded ``remedy_sim_error_<variant>``
    (``padded``: ``..._padded_update``, the check that charged each update by its padded
    batch, as the diagnosis of a workbench run does) of largest size, with its result file;
    None where none is recorded."""
    name = REMEDY_ERROR.format(variant=variant) + ("_padded_update" if padded else "")
    errors = validated_errors(folder)
    errors = errors[errors["figure"] == name]
    if not len(errors):
        return None
    worst = errors.loc[errors["value"].abs().idxmax()]
    return {"error": float(worst["value"]), "figure": name, "result": worst["result"]}
