"""A trace: what the cluster simulator replays. Per-request lengths (prompt, response, the
group = prompt id, optionally the worker) and, optionally, per-step costs (batch size, step
kind, seconds, tokens per row), in one CSV or parquet file (docs/trace_format.md).

One file, one table: a ``record`` column says whether a row is a ``request`` or a ``step``,
so a CSV's line numbers name its rows and a veRL/OpenRLHF export of lengths alone is a trace
as it stands (no ``record`` column: every row a request). Every row is checked before
anything runs (``cluster.validate``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..atomic import atomic_file
from .validate import RECORDS, raise_problems, trace_problems

__all__ = ["Trace", "load_trace"]

REQUEST_DTYPES = {"prompt_tokens": "int64", "response_tokens": "int64", "group": "string"}
STEP_DTYPES = {"batch_size": "int64", "kind": "string", "seconds": "float64", "tau": "float64"}
FORMATS = (".csv", ".parquet")


def _format_of(path: Path) -> str:
    if path.suffix not in FORMATS:
        raise ValueError(f"trace file {str(path)!r} has suffix {path.suffix!r}; accepted: "
                         f"{FORMATS}")
    return path.suffix


def _typed_requests(table: pd.DataFrame) -> pd.DataFrame:
    dtypes = dict(REQUEST_DTYPES)
    if "worker" in table.columns and table["worker"].notna().all() and len(table):
        dtypes["worker"] = "int64"
    cols = [c for c in (*REQUEST_DTYPES, "worker") if c in dtypes]
    typed = table[cols].copy()
    for c in ("prompt_tokens", "response_tokens", "worker"):
        if c in dtypes:
            typed[c] = pd.to_numeric(typed[c].astype("string").str.strip())
    typed["group"] = typed["group"].astype("string").str.strip()
    return typed.astype(dtypes).reset_index(drop=True)


def _typed_steps(table: pd.DataFrame | None) -> pd.DataFrame:
    if table is None or not len(table):
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in STEP_DTYPES.items()})
    typed = table[[c for c in STEP_DTYPES if c in table.columns]].copy()
    for c in ("batch_size", "seconds", "tau"):
        if c in typed.columns:
            typed[c] = pd.to_numeric(typed[c].astype("string").str.strip().replace("", pd.NA))
    typed["kind"] = typed["kind"].astype("string").str.strip()
    tau = typed["tau"] if "tau" in typed.columns else pd.Series(1.0, index=typed.index)
    return typed.assign(tau=tau.fillna(1.0)).astype(STEP_DTYPES).reset_index(drop=True)


@dataclass
class Trace:
    """``requests``: prompt_tokens, response_tokens, group (string), worker (optional);
    ``steps``: batch_size, kind, seconds, tau (empty when the trace has no costs). Checked
    and typed on construction; ``source`` names where it came from (in error messages)."""

    requests: pd.DataFrame
    steps: pd.DataFrame | None = None
    source: str = field(default="in memory", compare=False)

    def __post_init__(self):
        steps = self.steps
        raise_problems(trace_problems(
            self.requests, steps, [f"request row {i}" for i in range(len(self.requests))],
            [f"step row {i}" for i in range(0 if steps is None else len(steps))]), self.source)
        self.requests = _typed_requests(self.requests)
        self.steps = _typed_steps(steps)

    @property
    def has_workers(self) -> bool:
        return "worker" in self.requests.columns

    def save(self, path: str | os.PathLike) -> Path:
        """Write the trace to ``path`` (``.csv`` or ``.parquet``) atomically: request rows
        first, then step rows, one ``record`` column telling them apart."""
        path = Path(path)
        fmt = _format_of(path)
        table = pd.concat([self.requests.assign(record="request"),
                           self.steps.assign(record="step")], ignore_index=True)
        table = table[["record", *[c for c in table.columns if c != "record"]]]
        with atomic_file(path) as tmp:
            if fmt == ".csv":
                table.to_csv(tmp, index=False)
            else:
                table.to_parquet(tmp, index=False)
        return path


def load_trace(path: str | os.PathLike) -> Trace:
    """The trace in ``path`` (CSV or parquet), every row checked first: a ValueError lists
    each bad row by its line in a CSV (the header is line 1) or its row in a parquet file,
    with what is accepted."""
    path = Path(path)
    fmt = _format_of(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace file {str(path)!r}")
    if fmt == ".csv":
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
        where = [f"line {i + 2}" for i in range(len(raw))]
    else:
        raw = pd.read_parquet(path)
        where = [f"row {i}" for i in range(len(raw))]
    record = (raw["record"].astype("string").str.strip() if "record" in raw.columns
              else pd.Series("request", index=raw.index, dtype="string"))
    bad = [f"{where[i]}: record {record.iloc[i]!r} is unknown; accepted: {RECORDS}"
           for i in range(len(raw)) if record.iloc[i] not in RECORDS]
    is_req, is_step = (record == "request").to_numpy(), (record == "step").to_numpy()
    requests, steps = raw[is_req].reset_index(drop=True), raw[is_step].reset_index(drop=True)
    steps = steps if len(steps) else None
    if "worker" in requests.columns and (requests["worker"].astype("string").str.strip()
                                         .fillna("") == "").all():
        requests = requests.drop(columns="worker")  # a combined file's step-only column
    if steps is not None and "tau" not in steps.columns:
        steps = steps.assign(tau="")
    problems = bad + trace_problems(
        requests, steps, [w for w, r in zip(where, is_req) if r],
        [w for w, s in zip(where, is_step) if s])
    raise_problems(problems, f"file {str(path)!r}")
    return Trace(requests, steps, source=f"file {str(path)!r}")
