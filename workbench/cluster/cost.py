"""StepCost: the seconds of one decode step against the live batch size, per step kind
(``plain``, ``prefill``, or a speculative strategy with its tau), from measured rows.

A kind's curve is the mean of its rows at each measured batch size, linearly interpolated
between them and extrapolated along the end segments beyond them (one measured size: a flat
curve), never below the cheapest measured step. tau (tokens each row emits per step, 1 for
plain) is interpolated the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .trace import Trace, _typed_steps
from .validate import raise_problems, trace_problems

__all__ = ["StepCost"]


def _curve(sizes: np.ndarray, values: np.ndarray, batch) -> np.ndarray:
    """``values`` (measured at ``sizes``, ascending) at ``batch``: interpolated inside,
    extended along the end segments outside, floored at the smallest value."""
    b = np.asarray(batch, dtype=float)
    if len(sizes) == 1:
        return np.full_like(b, values[0])
    out = np.interp(b, sizes, values)
    lo, hi = b < sizes[0], b > sizes[-1]
    out[lo] = values[0] + (b[lo] - sizes[0]) * (values[1] - values[0]) / (sizes[1] - sizes[0])
    out[hi] = values[-1] + (b[hi] - sizes[-1]) * (values[-1] - values[-2]) / (sizes[-1] - sizes[-2])
    return np.maximum(out, values.min())


@dataclass
class StepCost:
    """Measured step costs: a table of ``batch_size, kind, seconds, tau`` (a trace's step
    rows, checked by the same rules)."""

    table: pd.DataFrame

    def __post_init__(self):
        where = [f"cost row {i}" for i in range(len(self.table))]
        raise_problems(trace_problems(None, self.table, [], where, need_requests=False),
                       "step costs")
        if not len(self.table):
            raise ValueError("StepCost needs at least one row; accepted: rows of batch_size, "
                             "kind, seconds (and tau for a speculative kind)")
        self.table = _typed_steps(self.table)
        means = self.table.groupby(["kind", "batch_size"])[["seconds", "tau"]].mean()
        self._curves = {str(kind): (g.index.get_level_values("batch_size").to_numpy(float),
                                    g["seconds"].to_numpy(), g["tau"].to_numpy())
                        for kind, g in means.groupby(level="kind")}

    @classmethod
    def from_trace(cls, trace: Trace) -> "StepCost":
        """The costs a trace's step rows measured."""
        return cls(trace.steps)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._curves)

    def has(self, kind: str) -> bool:
        return kind in self._curves

    def _of(self, kind: str):
        if kind not in self._curves:
            raise ValueError(f"no step costs for kind {kind!r}; measured kinds: {self.kinds}")
        return self._curves[kind]

    def seconds(self, kind: str, batch) -> np.ndarray:
        """Seconds of one ``kind`` step at each live batch size in ``batch`` (any shape)."""
        sizes, seconds, _ = self._of(kind)
        return _curve(sizes, seconds, batch)

    def tau(self, kind: str, batch) -> np.ndarray:
        """Tokens each row emits in one ``kind`` step at each batch size in ``batch``."""
        sizes, _, tau = self._of(kind)
        return _curve(sizes, tau, batch)
