"""What a notebook writes into its ``out_dir``: checked folder, atomic metrics and tables.

The pipeline gathers every run's ``metrics.json`` into one table, so the file must be a flat
JSON object of scalars and must never be half-written.
"""
from __future__ import annotations

import json
import math
import numbers
import os
from pathlib import Path

import pandas as pd

__all__ = ["prepare_out_dir", "write_metrics", "write_table"]


def prepare_out_dir(out_dir: str | os.PathLike) -> Path:
    """``out_dir`` as a Path, created if missing; an error if it is an existing file."""
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
    """Write ``{out_dir}/metrics.json`` atomically; non-finite numbers become null."""
    clean = {str(k): _scalar(str(k), v) for k, v in metrics.items()}
    path = prepare_out_dir(out_dir) / "metrics.json"
    tmp = path.with_name(".metrics.json.tmp")
    tmp.write_text(json.dumps(clean, indent=2))
    os.replace(tmp, path)
    return path


def write_table(table: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a table as parquet (or CSV when the name ends in .csv) atomically."""
    path = Path(path)
    prepare_out_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".csv":
        table.to_csv(tmp, index=False)
    else:
        table.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return path
