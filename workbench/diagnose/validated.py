"""The simulator's validated error, read from where the validation runs recorded it.

Why: a predicted gain is worth as much as the error of the model that made it. The cluster
simulator was checked on held-out real rollouts (notebook 10, ``cluster.validation``) and on a
whole RL run (notebook 04, ``cluster.run_check``); their figures live in the result files of
``benchmarks/results/`` (schema: ``workbench/provenance.py``). The diagnosis quotes them beside
each prediction rather than a number of its own. The long-tail remedies' model
(``cluster.remedies``) is checked apart, on a notebook 11 run (``cluster.remedy_check``): its
figures are ``remedy_sim_error_<variant>``, one per remedy, and a remedy with none recorded is
reported as not validated, never given another's error. Seer's variants quote the dispatch
model's makespan error (``cluster.seer_check``, ``seer_sim_error_<variant>``); the composed
variants (async, TLT beside a remedy or Seer) quote the diagnosis's own check of that
prediction on runs where they ran (``diagnose_error_<variant>``), or say none is recorded.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

__all__ = ["validated_errors", "headline_error", "recorded_error", "remedy_error",
           "diagnose_error", "figure_name", "RESULTS", "HEADLINE", "REMEDY_ERROR",
           "DIAGNOSE_ERROR", "SEER_ERROR"]

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
HEADLINE = "sim_error_small_n"  # held-out rollouts' makespan error on the sim clock (nb10)
REMEDY_ERROR = "remedy_sim_error_{variant}"
"""The figure name of the remedy model's error for one notebook 11 variant
(``cluster.remedy_check`` on a notebook 11 run)."""
DIAGNOSE_ERROR = "diagnose_error_{variant}"
"""The figure name of the diagnosis's own error for one notebook 11 variant (its prediction
from the baseline against the variant's measured speedup)."""
SEER_ERROR = "seer_sim_error_{variant}"
"""The figure name of the dispatch model's error on one Seer variant's makespans
(``cluster.seer_check`` on a notebook 11 run)."""


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


def recorded_error(figure: str, folder: str | os.PathLike = RESULTS) -> dict | None:
    """The recorded error figure ``figure`` of largest size over the result files in
    ``folder``, with its result file: ``{"error", "figure", "result"}``; None where none is
    recorded."""
    errors = validated_errors(folder)
    errors = errors[errors["figure"] == figure]
    if not len(errors):
        return None
    worst = errors.loc[errors["value"].abs().idxmax()]
    return {"error": float(worst["value"]), "figure": figure, "result": worst["result"]}


def remedy_error(variant: str, folder: str | os.PathLike = RESULTS,
                 padded: bool = False) -> dict | None:
    """The remedy model's validated error for notebook 11's ``variant`` (``overprovision``,
    ``april``, ``partial``, ``tail_batching``): the recorded ``remedy_sim_error_<variant>``
    (``padded``: ``..._padded_update``, the check that charged each update by its padded
    batch, as the diagnosis of a workbench run does) of largest size, with its result file;
    None where none is recorded."""
    name = REMEDY_ERROR.format(variant=variant) + ("_padded_update" if padded else "")
    return recorded_error(name, folder)


def diagnose_error(variant: str, folder: str | os.PathLike = RESULTS) -> dict | None:
    """The diagnosis's own recorded error for notebook 11's ``variant`` (``async``,
    ``tlt+partial``, ...): ``DIAGNOSE_ERROR`` of it, the check of this very prediction on
    runs where the variant ran (``benchmarks/check_remedy_model.py``); None where none is
    recorded."""
    return recorded_error(DIAGNOSE_ERROR.format(variant=figure_name(variant)), folder)


def figure_name(variant: str) -> str:
    """``variant`` as a result's figure names spell it (they take no ``+``:
    ``tlt+partial`` -> ``tlt_partial``)."""
    return variant.replace("+", "_")
