"""The trace format's rules, cell by cell: every bad row named by where it is (``line 7`` of
a CSV, ``row 3`` of a parquet file or a table in memory) with the value and what is
accepted, all of them at once, before anything runs.

The rules (docs/trace_format.md):

record           ``request`` or ``step`` (a file without the column holds requests only)
request rows     prompt_tokens (integer >= 0), response_tokens (integer >= 1), group (the
                 prompt id: any non-empty text), worker (integer >= 0; optional, but then on
                 every request row or none)
step rows        batch_size (integer >= 1), kind (a strategy name, below), seconds (number
                 > 0), tau (tokens each row emits per step, a number >= 1; optional: 1 when
                 empty, and exactly 1 for ``plain`` and ``prefill``)
kind             ``plain``, ``prefill`` (the seconds a worker spends before its first decode
                 step, for a batch of ``batch_size``), or a speculative strategy in the forms
                 of ``speculative.strategies`` (this layer sits below it, so the forms are
                 matched here by pattern): ``chain:k=K``, ``tree:k=K,b=B[,n=N]``,
                 ``sibling:k=K``
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

__all__ = ["trace_problems"]

RECORDS = ("request", "step")
REQUEST_FIELDS = ("prompt_tokens", "response_tokens", "group")
STEP_FIELDS = ("batch_size", "kind", "seconds")
PLAIN_KINDS = ("plain", "prefill")
SPECULATIVE = re.compile(r"(chain|sibling):k=[1-9]\d*|tree:k=[1-9]\d*,b=[1-9]\d*(,n=[1-9]\d*)?")
KIND_FORMS = ("'plain', 'prefill', 'chain:k=K', 'tree:k=K,b=B[,n=N]' or 'sibling:k=K' "
              "(integers K, B, N >= 1)")
MAX_LISTED = 20  # problems listed in one error; the rest are counted


def _numbers(column: pd.Series) -> np.ndarray:
    """``column`` as float64, NaN where a cell is empty or not a number."""
    text = column.astype("string").str.strip()
    return pd.to_numeric(text.where(text != ""), errors="coerce").to_numpy(dtype=float)


def _show(value) -> str:
    """A cell as the message shows it: text quoted, a number plain (numpy scalars too)."""
    return repr(value) if isinstance(value, str) else str(getattr(value, "item", lambda: value)())


def _empty(column: pd.Series) -> np.ndarray:
    return (column.isna() | (column.astype("string").str.strip() == "")).to_numpy(dtype=bool)


def _integers(table, name, low, where, problems, optional=False):
    if name not in table.columns:
        return
    values, empty = _numbers(table[name]), _empty(table[name])
    bad = ~((values >= low) & (values == np.floor(values)))
    if optional:
        bad &= ~empty
    for i in np.flatnonzero(bad):
        shown = _show(table[name].iloc[i])
        problems.append(f"{where[i]}: {name} {shown} is not an integer >= {low}")


def _reals(table, name, low, low_open, where, problems, optional=False):
    if name not in table.columns:
        return
    values, empty = _numbers(table[name]), _empty(table[name])
    ok = np.isfinite(values) & ((values > low) if low_open else (values >= low))
    bad = ~ok & ~empty if optional else ~ok
    for i in np.flatnonzero(bad):
        problems.append(f"{where[i]}: {name} {_show(table[name].iloc[i])} is not a finite number "
                        f"{'>' if low_open else '>='} {low:g}")


def _request_problems(table: pd.DataFrame, where: list[str]) -> list[str]:
    problems: list[str] = []
    _integers(table, "prompt_tokens", 0, where, problems)
    _integers(table, "response_tokens", 1, where, problems)
    if "group" in table.columns:
        for i in np.flatnonzero(_empty(table["group"])):
            problems.append(f"{where[i]}: group is empty; accepted: the prompt id (any text)")
    if "worker" in table.columns:
        empty = _empty(table["worker"])
        if empty.any() and not empty.all():
            problems += [f"{where[i]}: worker is empty, but other request rows name one; "
                         "accepted: a worker on every request row or on none"
                         for i in np.flatnonzero(empty)]
        _integers(table, "worker", 0, where, problems, optional=True)
    return problems


def _step_problems(table: pd.DataFrame, where: list[str]) -> list[str]:
    problems: list[str] = []
    _integers(table, "batch_size", 1, where, problems)
    _reals(table, "seconds", 0, True, where, problems)
    _reals(table, "tau", 1, False, where, problems, optional=True)
    kinds = table["kind"].astype("string").str.strip().fillna("") if "kind" in table else None
    taus = _numbers(table["tau"]) if "tau" in table.columns else None  # once, not per row
    for i, kind in enumerate([] if kinds is None else kinds):
        if kind not in PLAIN_KINDS and not SPECULATIVE.fullmatch(kind):
            problems.append(f"{where[i]}: kind {kind!r} is unknown; accepted: {KIND_FORMS}")
        elif kind in PLAIN_KINDS and taus is not None:
            tau = taus[i]
            if np.isfinite(tau) and tau != 1:
                problems.append(f"{where[i]}: tau {tau:g} on a {kind!r} row; accepted: 1 or "
                                "empty (a plain step emits one token per row)")
    return problems


def trace_problems(requests: pd.DataFrame, steps: pd.DataFrame | None,
                   where_requests: list[str], where_steps: list[str],
                   need_requests: bool = True) -> list[str]:
    """Every problem of a trace's two tables, each message led by its row's place
    (``where_*[i]`` names row ``i``); missing columns first, then the rows in order
    (``need_requests=False``: a table of step costs alone)."""
    problems = []
    for name, table, fields in (("request", requests, REQUEST_FIELDS),
                                ("step", steps, STEP_FIELDS)):
        if table is None or not len(table):
            continue
        missing = [f for f in fields if f not in table.columns]
        if missing:
            problems.append(f"the {name} rows lack columns {missing}; a {name} row has "
                            f"{list(fields)}")
    if need_requests and (requests is None or not len(requests)):
        problems.append("the trace has no request rows; accepted: at least one")
    problems += _request_problems(requests, where_requests) if requests is not None else []
    problems += _step_problems(steps, where_steps) if steps is not None and len(steps) else []
    return problems


def raise_problems(problems: list[str], source: str) -> None:
    """One ValueError listing ``problems`` (the first MAX_LISTED, then a count), if any."""
    if not problems:
        return
    listed = problems[:MAX_LISTED]
    more = len(problems) - len(listed)
    tail = f"\n  ... and {more} more" if more else ""
    raise ValueError(f"bad trace {source}:\n  " + "\n  ".join(listed) + tail)
