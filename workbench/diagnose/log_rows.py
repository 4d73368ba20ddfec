"""Per-step rows out of a log file, whatever its container: CSV, JSONL (flat rows, or veRL's
``{"step", "data"}`` lines), or JSON (a list, or ``trainer_state.json``'s ``log_history``).

Why apart from the readers: every format's file goes through the same parsing and the same
refusal (naming the file, the format and where the formats are listed), so a reader only
maps keys to columns.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["bad_logs", "read_rows", "data_lines", "step_column", "numeric_column"]


def bad_logs(path, why: str, fmt: str) -> ValueError:
    return ValueError(f"cannot read {str(path)!r} as {fmt} logs: {why}; accepted: "
                      "docs/diagnose.md lists each format's files and keys")


def read_rows(path: Path, fmt: str) -> pd.DataFrame:
    """A file of per-step rows: CSV, JSONL (flat rows, or veRL's ``{"step", "data"}``
    lines), or a JSON list / ``trainer_state.json`` (its ``log_history``)."""
    if not path.is_file():
        raise bad_logs(path, "no such file", fmt)
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(io.StringIO("\n".join(data_lines(path))))
        if suffix == ".jsonl":
            records = [json.loads(line) for line in data_lines(path)]
        elif suffix == ".json":
            loaded = json.loads(path.read_text())
            records = loaded.get("log_history", loaded) if isinstance(loaded, dict) else loaded
        else:
            raise bad_logs(path, f"suffix {suffix!r} is not one of '.csv', '.jsonl', '.json'", fmt)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        if isinstance(exc, ValueError) and "cannot read" in str(exc):
            raise
        raise bad_logs(path, f"it does not parse ({exc})", fmt) from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise bad_logs(path, "it holds no list of per-step records", fmt)
    flat = [{**{k: v for k, v in r.items() if k != "data"}, **r["data"]}
            if isinstance(r.get("data"), dict) else r for r in records]
    return pd.DataFrame(flat)


def data_lines(path: Path) -> list[str]:
    """The file's lines but blank ones and ``#`` comments (a fixture's header citing where
    its keys come from; no framework writes such a line)."""
    return [line for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def step_column(rows: pd.DataFrame, names: tuple[str, ...], path, fmt: str) -> pd.Series:
    for name in names:
        if name in rows:
            return pd.to_numeric(rows[name], errors="coerce")
    if len(rows):
        return pd.Series(np.arange(len(rows)), index=rows.index, dtype=float)
    raise bad_logs(path, "it holds no rows", fmt)


def numeric_column(rows: pd.DataFrame, key: str) -> pd.Series:
    return pd.to_numeric(rows[key], errors="coerce") if key in rows else pd.Series(
        np.nan, index=rows.index)
