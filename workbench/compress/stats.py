"""Error bars for the compression comparisons: mean ± sd over seeds, a bootstrap 95% interval,
and whether a paired difference is larger than its noise.

A method's result is a ``[seeds, items]`` array: one row per seed (the seed draws the
distillation batch order and every initialisation), one column per scored item (a held-out
problem's 0/1 reward) or a single column (a per-seed figure such as an LM loss). The noise has
two sources, the seed and the finite set of items, so the interval is a *two-level bootstrap*:
every draw resamples the seeds (rows) and the items (columns) with replacement and takes the
mean. Two methods run on the same seeds and scored on the same items are compared *paired*:
the bootstrap resamples their per-(seed, item) differences, and the difference is called
significant when its 95% percentile interval excludes 0 (a paired two-level bootstrap test at
the 5% level, two-sided). With 2-3 seeds the seed level is coarse; the interval says so by
being wide, not by pretending.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..checks import check_fraction, check_int

__all__ = ["summarize", "paired_difference", "summarize_column", "TEST"]

TEST = ("paired two-level bootstrap (seeds and items resampled): the 95% interval of the "
        "difference excludes 0")
"""The statistical test behind a significant difference, in words."""


def _matrix(name: str, values) -> np.ndarray:
    """``values`` as a float ``[seeds, items]`` array: a 1-d sequence is one figure per seed."""
    x = np.asarray(values, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.size == 0:
        raise ValueError(f"{name} has shape {np.shape(values)}; accepted: a non-empty [seeds] "
                         "or [seeds, items] array")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} holds a non-finite value; accepted: finite numbers only")
    return x


def _bootstrap_means(x: np.ndarray, draws: int, seed: int) -> np.ndarray:
    """``[draws]`` means of ``x`` ``[seeds, items]`` with rows and columns resampled."""
    rng = np.random.default_rng(seed)
    s, n = x.shape
    rows = rng.integers(0, s, size=(draws, s))
    cols = rng.integers(0, n, size=(draws, n))
    # mean over the resampled rows of each resampled column set: E[x[r, c]] over r, c
    col_sums = np.stack([x[r].mean(axis=0) for r in rows])       # [draws, items]
    return np.take_along_axis(col_sums, cols, axis=1).mean(axis=1)


def _interval(means: np.ndarray, level: float) -> tuple[float, float]:
    check_fraction("level", level, low_open=True, high_open=True)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def summarize(values, draws: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """``{mean, sd, lo, hi, seeds, items}`` of ``values`` ``[seeds]`` or ``[seeds, items]``:
    the grand mean, the sd over seeds of the per-seed means (0 with one seed), and the
    two-level bootstrap ``level`` interval of the mean (``draws`` draws from ``seed``)."""
    x = _matrix("values", values)
    check_int("draws", draws, 100)
    per_seed = x.mean(axis=1)
    lo, hi = _interval(_bootstrap_means(x, draws, seed), level)
    return {"mean": float(x.mean()), "sd": float(per_seed.std(ddof=1)) if len(x) > 1 else 0.0,
            "lo": lo, "hi": hi, "seeds": int(x.shape[0]), "items": int(x.shape[1])}


def paired_difference(a, b, draws: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """``{diff, lo, hi, significant}``: the mean of ``a - b`` (both ``[seeds, items]`` on the
    same seeds and items), its paired two-level bootstrap interval, and whether the interval
    excludes 0 (:data:`TEST`)."""
    x, y = _matrix("a", a), _matrix("b", b)
    if x.shape != y.shape:
        raise ValueError(f"a has shape {x.shape} and b {y.shape}; a paired difference needs "
                         "the same seeds and items")
    d = x - y
    lo, hi = _interval(_bootstrap_means(d, check_int("draws", draws, 100), seed), level)
    return {"diff": float(d.mean()), "lo": lo, "hi": hi, "significant": bool(lo > 0 or hi < 0)}


def summarize_column(table: pd.DataFrame, by, column: str, **kwargs) -> pd.DataFrame:
    """One row per group of ``by`` (a column name or a list) in ``table`` (one row per seed):
    ``column`` as its mean, with ``<column>_sd``, ``<column>_lo`` and ``<column>_hi``
    (:func:`summarize` over the group's seeds) and ``seeds``; groups in their first order."""
    keys = [by] if isinstance(by, str) else list(by)
    missing = [c for c in [*keys, column] if c not in table]
    if missing:
        raise ValueError(f"table has no column {missing[0]!r}; it has {list(table.columns)}")
    rows = []
    for key, part in table.groupby(keys, sort=False):
        s = summarize(part[column].to_numpy(), **kwargs)
        rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                     column: s["mean"], f"{column}_sd": s["sd"], f"{column}_lo": s["lo"],
                     f"{column}_hi": s["hi"], "seeds": s["seeds"]})
    return pd.DataFrame(rows)
