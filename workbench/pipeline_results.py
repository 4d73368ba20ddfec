"""A pipeline's results table: one row per run of its YAML, written to
``<runs_root>/<pipeline>/results.csv`` and ``results.parquet``, read back, and summarised
over seeds.

Columns: ``pipeline``, ``entry`` (the notebook's run-name prefix), ``notebook`` (as written
in the YAML), ``run_name``, ``param_hash``, ``param.<k>`` per parameter, ``status``,
``skipped`` (True when this call reused a finished run), ``error`` (``"Type: message"``),
``duration_s`` (of the execution that produced the run) and ``metric.<k>`` for every scalar
in the run's ``metrics.json`` (nested objects flatten to ``metric.a.b``; lists are left out).
:func:`summarize` gives per entry and non-seed parameter combination the mean and sample
standard deviation of each metric over its ok runs, with counts of ok and failed runs.

Why apart from the runner: the report page and notebooks read the table without running
anything, and the table's shape is one contract, kept in one place.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from .atomic import atomic_file
from .pipeline_spec import SEED, RunSpec

__all__ = ["load_results", "summarize", "summary_view", "result_row", "write_results",
           "print_summary"]


def result_row(record: dict, run: RunSpec, skipped: bool) -> dict:
    """One run's row of the results table, from its run.json record (module docstring)."""
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


def write_results(table: pd.DataFrame, pipeline_dir: Path) -> None:
    """``results.csv`` and ``results.parquet`` in ``pipeline_dir``, each written atomically."""
    parquet_table = _parquet_safe(table)  # before anything is written
    with atomic_file(pipeline_dir / "results.csv") as tmp:
        table.to_csv(tmp, index=False)
    with atomic_file(pipeline_dir / "results.parquet") as tmp:
        parquet_table.to_parquet(tmp, index=False)


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
    counted = pd.concat([table[keys].assign(n_ok=ok, n_failed=~ok),
                         pd.DataFrame({m: table[m].where(ok) for m in metrics})], axis=1)
    grouped = counted.groupby(keys, dropna=False, sort=False)
    parts = [grouped[["n_ok", "n_failed"]].sum(), grouped[metrics].mean().add_suffix(".mean"),
             grouped[metrics].std().add_suffix(".sd")]
    order = ["n_ok", "n_failed", *[f"{m}.{s}" for m in metrics for s in ("mean", "sd")]]
    return pd.concat(parts, axis=1)[order].reset_index()


def summary_view(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`summarize` as people read it: the same rows, one text column per metric holding
    ``mean ± sd`` (the mean alone for one run, ``-`` for none). What the CLI prints and the
    report shows."""
    summary = summarize(table)
    shown = summary.drop(columns=[c for c in summary.columns if c.endswith((".mean", ".sd"))])
    for column in summary.columns:
        if column.endswith(".mean"):
            metric = column[: -len(".mean")]
            shown[metric] = [_mean_sd(m, s) for m, s in zip(summary[column], summary[f"{metric}.sd"])]
    return shown


def print_summary(table: pd.DataFrame, pipeline_dir: Path) -> None:
    """Print counts and the summary, metrics shown as ``mean ± sd``."""
    shown = summary_view(table)
    ok = int((table["status"] == "ok").sum())
    print(f"pipeline {table['pipeline'].iloc[0]}: {ok} ok, {len(table) - ok} failed, "
          f"{int(table['skipped'].sum())} reused -> {pipeline_dir / 'results.parquet'}")
    print(shown.to_string(index=False))


def _mean_sd(mean: float, sd: float) -> str:
    if pd.isna(mean):
        return "-"  # no ok run
    return f"{mean:.4g}" if pd.isna(sd) else f"{mean:.4g} ± {sd:.2g}"
