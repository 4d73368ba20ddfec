"""Tables for figures and explorers: a DataFrame as is, or the one a run saved as CSV or parquet.

Why: explorers and figures are redrawn from a run's files alone (DESIGN.md, "Timelines are
data"), so every one of them takes either the table a notebook just computed or the path that
``results.write_table`` wrote it to, and checks its columns before drawing anything.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

__all__ = ["as_table"]

READERS = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".pq": pd.read_parquet}


def as_table(source, columns=(), what: str = "table") -> pd.DataFrame:
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
