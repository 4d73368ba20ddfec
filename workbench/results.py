"""What a notebook writes into its ``out_dir``: checked folder, atomic metrics and tables.

The pipeline gathers every run's ``metrics.json`` into one table, so the file must be a flat
JSON object of scalars and must never be half-written.
"""
from __future__ import annotations

import math
import numbers
import os
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .atomic import atomic_file, write_json
from .machine import machine, run_commit

__all__ = ["prepare_out_dir", "write_metrics", "write_table", "read_table"]

TABLE_SUFFIXES = (".parquet", ".pq", ".csv")
PROVENANCE = "provenance.json"
"""The file :func:`write_metrics` writes beside ``metrics.json``: ``{"git", "machine",
"written_at"}``."""


def prepare_out_dir(out_dir: str | os.PathLike) -> Path:
    """``out_dir`` as a Path, created if missing; an error if it is an existing file. The
    checkout's commit is read here, as a run sets up (:func:`~workbench.machine.run_commit`),
    for :func:`write_metrics` to record."""
    run_commit()
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"out_dir {str(path)!r} is an existing file; pass a folder path "
                              "(it is created if missing)")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _scalar(key: str, value):
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    raise TypeError(f"metric {key!r} is a {type(value).__name__}; metrics.json holds scalars "
                    "only (numbers, booleans, strings)")


def write_metrics(out_dir: str | os.PathLike, metrics: dict) -> Path:
    """Write ``{out_dir}/metrics.json`` atomically; non-finite numbers become null. Beside
    it, ``provenance.json``: the commit the run's code came from (read as it set up), the
    machine and the time of writing, which ``workbench results record`` puts into a result
    of a run made outside a pipeline (a pipeline's ``run.json`` holds its own)."""
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict of scalars, got {type(metrics).__name__}")
    clean = {str(k): _scalar(str(k), v) for k, v in metrics.items()}
    folder = prepare_out_dir(out_dir)
    write_json(folder / PROVENANCE, {
        "git": run_commit(), "machine": machine(),
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return write_json(folder / "metrics.json", clean)


def write_table(table: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a table as parquet (``.parquet``/``.pq``) or CSV (``.csv``), any case, atomically."""
    path = Path(path)
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"write_table writes a pandas DataFrame, got {type(table).__name__}")
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise ValueError(f"write_table cannot tell the format of {str(path)!r}: accepted "
                         f"suffixes {list(TABLE_SUFFIXES)}")
    prepare_out_dir(path.parent)
    with atomic_file(path) as tmp:
        if path.suffix.lower() == ".csv":
            table.to_csv(tmp, index=False)
        else:
            table.to_parquet(tmp, index=False)
    return path


# Figures, explorers and models of recorded runs take either the table a notebook just computed
# or the path write_table wrote it to, and check its columns before using it.
READERS = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".pq": pd.read_parquet}


def read_table(source, columns=(), what: str = "table") -> pd.DataFrame:
    """``source`` (a DataFrame, or a ``.csv``/``.parquet`` path) as a DataFrame that has every
    one of ``columns``; ``what`` names the expected table in errors."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        reader = READERS.get(path.suffix.lower())
        if reader is None:
            raise ValueError(f"cannot read {what} from {str(path)!r}: accepted suffixes "
                             f"{list(READERS)}")
        if not path.is_file():
            raise FileNotFoundError(f"no {what} at {str(path)!r}")
        source = reader(path)
    if not isinstance(source, pd.DataFrame):
        raise TypeError(f"expected {what} as a pandas DataFrame or a CSV/parquet path, got "
                        f"{type(source).__name__}")
    missing = [c for c in columns if c not in source.columns]
    if missing:
        raise ValueError(f"expected {what}; missing columns {missing} "
                         f"(got {list(source.columns)})")
    return source
