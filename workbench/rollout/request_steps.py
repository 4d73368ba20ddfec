"""A timeline's optional third table: one row per request per engine step that emitted its tokens.

The steps table says what each engine call did for its whole batch, the requests table what
each request got in all; neither says how many drafts *this row* accepted at *that* verify
step. Recorded only when asked (``RolloutEngine.rollout(..., request_steps=True)``: it costs
a tuple per live row per step, ``benchmarks/bench_request_steps.py``), kept as
``Timeline.request_steps`` and saved beside the other two (``request_steps.parquet``).

Schema (one row per (worker, step, uid)):

request_steps  worker, step (the steps-table row: an engine call of kind prefill, decode or
               verify; a draft call emits nothing and has no rows), uid, kind (the step's),
               tokens (the response tokens the step added to the request), drafted (draft
               tokens fed for the row: the chain's k or the tree's nodes; 0 on prefill and
               decode), accepted (the drafts the policy kept for the row: its accepted length
               at that verify step; 0 elsewhere); then the step's decision columns (the
               bandit's ``bucket``, ``arm``, ``explored``: ``Timeline.decision_columns``),
               copied from the steps table so that a row says which arm drafted for it and
               whether the bandit explored.

What the three tables must agree on (:func:`check_request_steps`, run by ``Timeline``):
every row names a step of the steps table of its kind and a request of the requests table;
a step's rows are its batch (``batch_size`` rows) and add up to its ``tokens``. Summed per
request they give the requests table's ``response_tokens``, ``verify_steps`` (its verify
rows), ``drafted``, ``accepted`` and ``emitted`` (its verify rows' tokens) whenever every
step of the rollout was recorded (``tests/test_request_steps.py``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["REQUEST_STEP_COLUMNS", "REQUEST_STEP_KINDS", "request_steps_table",
           "check_request_steps"]

REQUEST_STEP_COLUMNS = {"worker": "int64", "step": "int64", "uid": "int64", "kind": "str",
                        "tokens": "int64", "drafted": "int64", "accepted": "int64"}
"""The request-steps table's own columns and their dtypes (the decision columns follow)."""
REQUEST_STEP_KINDS = ("prefill", "decode", "verify")
"""The step kinds that emit tokens, hence have request-steps rows."""


def request_steps_table(rows) -> pd.DataFrame:
    """The table of recorded rows: tuples in :data:`REQUEST_STEP_COLUMNS` order (what
    ``BatchDecoder`` appends) or dicts."""
    table = pd.DataFrame(list(rows), columns=list(REQUEST_STEP_COLUMNS))
    return table.astype(REQUEST_STEP_COLUMNS)


def check_request_steps(table: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame,
                        decision_columns: list[str]) -> pd.DataFrame:
    """``table`` checked against a timeline's ``steps`` and ``requests`` tables (module
    docstring) and typed, with the steps' ``decision_columns`` (those it holds must equal
    the steps'; the others are copied in). Raises ValueError naming what disagrees."""
    missing = [c for c in REQUEST_STEP_COLUMNS if c not in table.columns]
    clash = [c for c in decision_columns if c in REQUEST_STEP_COLUMNS]
    if clash:
        raise ValueError(f"decision column(s) {clash} are named like request_steps columns")
    if missing:
        raise ValueError(f"request_steps table lacks columns {missing}")
    unknown = [c for c in table.columns
               if c not in REQUEST_STEP_COLUMNS and c not in decision_columns]
    if unknown:
        raise ValueError(f"request_steps table has columns {unknown} that are neither its own "
                         f"({list(REQUEST_STEP_COLUMNS)}) nor the steps' decision columns "
                         f"({decision_columns})")
    own = table[list(REQUEST_STEP_COLUMNS)].astype(REQUEST_STEP_COLUMNS).reset_index(drop=True)
    bad = sorted(set(own["kind"]) - set(REQUEST_STEP_KINDS))
    if bad:
        raise ValueError(f"request_steps rows of kind(s) {bad}; accepted: {REQUEST_STEP_KINDS}")
    strays = sorted(set(own["uid"]) - set(requests["uid"]))
    if strays:
        raise ValueError(f"request_steps rows of uid(s) {strays[:5]} not in the requests table")
    at = _steps_of(own, steps)  # each row's position in the steps table
    pairs = np.stack([at, own["uid"].to_numpy()], axis=1)
    if len(np.unique(pairs, axis=0)) < len(pairs):
        raise ValueError("request_steps has two rows of one request at one step")
    rows = np.bincount(at, minlength=len(steps))
    added = np.bincount(at, weights=own["tokens"].to_numpy(), minlength=len(steps))
    size, tokens = steps["batch_size"].to_numpy(), steps["tokens"].to_numpy()
    off = np.flatnonzero((rows > 0) & ((rows != size) | (added != tokens)))
    if off.size:
        i = off[0]
        raise ValueError(f"request_steps rows of worker {steps['worker'].iloc[i]}'s step "
                         f"{steps['step'].iloc[i]} are {rows[i]} rows adding {int(added[i])} "
                         f"tokens; the step has batch_size {size[i]} and tokens {tokens[i]}")
    decided = steps[decision_columns].iloc[at].reset_index(drop=True)
    for c in decision_columns:
        if c in table.columns:
            given = table[c].reset_index(drop=True).astype(decided[c].dtype)
            if not given.equals(decided[c]):
                raise ValueError(f"request_steps column {c!r} differs from the steps' {c!r}")
    return pd.concat([own, decided], axis=1)


def _steps_of(own: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray:
    """The position in ``steps`` of each row's (worker, step), refused unless it is there
    with the row's kind."""
    worker, step = steps["worker"].to_numpy(np.int64), steps["step"].to_numpy(np.int64)
    span = int(max(step.max(initial=0), own["step"].max() if len(own) else 0)) + 1
    keys, wanted = worker * span + step, own["worker"].to_numpy() * span + own["step"].to_numpy()
    order = np.argsort(keys, kind="stable")
    at = order[np.clip(np.searchsorted(keys[order], wanted), 0, max(len(keys) - 1, 0))] \
        if len(keys) else np.zeros(len(own), dtype=np.int64)
    if len(own) and (not len(keys) or (keys[at] != wanted).any()
                     or (steps["kind"].to_numpy()[at] != own["kind"].to_numpy()).any()):
        raise ValueError("request_steps rows name steps that are not in the steps table "
                         "with their kind")
    return at
