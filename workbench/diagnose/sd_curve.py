"""SD's speedup per live batch size on the user's hardware: the one fact the logs never hold.

Why: whether speculative decoding pays depends on the batch it runs at (a verify forward of
k drafts costs little more than a plain one while decoding is memory-bound, much more once it
is compute-bound), and where it stops paying differs by GPU and model. The user gives it: a
small table (``batch_size`` and ``speedup``, or ``batch_size`` with the plain and SD times of
one forward, ``plain_ms``/``sd_ms`` or ``plain_s``/``sd_s``, and optionally the tokens ``tau``
an SD forward emits per row), or notebook 02's measured sweep (its ``curve.csv``: the
highest temperature measured, RL samples, and at each batch size the best drafter and k).
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from .log_rows import data_lines

__all__ = ["read_sd_curve", "sd_speedup", "crossover"]


def _refuse(what, why: str) -> ValueError:
    return ValueError(f"SD curve {what}: {why}; accepted: columns batch_size and speedup, or "
                      "batch_size with plain_ms and sd_ms (or plain_s and sd_s; optional tau), "
                      "or notebook 02's curve.csv")


def read_sd_curve(curve: str | os.PathLike | pd.DataFrame | dict) -> pd.DataFrame:
    """The curve as a table ``batch_size, speedup`` (ascending, one row per size): SD's
    tokens per second over plain decoding's at that live batch. ``curve``: a CSV path, a
    table, or a dict ``{batch_size: speedup}``."""
    what = repr(str(curve)) if isinstance(curve, (str, os.PathLike)) else "table"
    if isinstance(curve, dict):
        curve = pd.DataFrame({"batch_size": list(curve), "speedup": list(curve.values())})
    elif isinstance(curve, (str, os.PathLike)):
        if not Path(curve).is_file():
            raise _refuse(what, "no such file")
        curve = pd.read_csv(io.StringIO("\n".join(data_lines(Path(curve)))))
    t = curve.copy()
    if "batch_size" not in t:
        raise _refuse(what, f"no batch_size column (its columns: {list(t.columns)})")
    if "speedup" not in t:
        for unit, scale in (("ms", 1e-3), ("s", 1.0)):
            if {f"plain_{unit}", f"sd_{unit}"} <= set(t):
                tau = t["tau"] if "tau" in t else 1.0
                t["speedup"] = t[f"plain_{unit}"] / t[f"sd_{unit}"] * tau
                break
        else:
            raise _refuse(what, f"no speedup and no plain/SD times (its columns: {list(t.columns)})")
    if "temperature" in t:
        t = t[t["temperature"] == t["temperature"].max()]
    t = t[["batch_size", "speedup"]].apply(pd.to_numeric, errors="coerce")
    bad = t[(t["batch_size"] < 1) | ~(t["speedup"] > 0) | t.isna().any(axis=1)]
    if len(bad):
        row = bad.iloc[0]
        raise _refuse(what, f"row {int(bad.index[0])} has batch_size {row['batch_size']!r} and "
                      f"speedup {row['speedup']!r} (need an integer >= 1 and a number > 0)")
    if not len(t):
        raise _refuse(what, "no rows")
    return (t.groupby("batch_size", as_index=False)["speedup"].max()
            .astype({"batch_size": int}).sort_values("batch_size").reset_index(drop=True))


def sd_speedup(curve: pd.DataFrame, batch) -> np.ndarray:
    """The speedup at each live batch: linear in log batch size between measured sizes, the
    nearest measured one outside them (``speculative.whatif``'s rule)."""
    b = np.log(np.maximum(np.asarray(batch, dtype=float), 1))
    return np.interp(b, np.log(curve["batch_size"].to_numpy(float)), curve["speedup"].to_numpy())


def crossover(curve: pd.DataFrame) -> int:
    """The threshold rule's B: the smallest measured batch at which SD no longer beats plain
    decoding (SD runs below it); 0 where it loses already at the smallest; one past the
    largest measured where it never loses."""
    for b, s in zip(curve["batch_size"], curve["speedup"]):
        if s <= 1.0:
            return int(b) if b > curve["batch_size"].iloc[0] else 0
    return int(curve["batch_size"].iloc[-1]) + 1
