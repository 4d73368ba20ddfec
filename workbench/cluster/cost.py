"""StepCost: the seconds of one decode step against the live batch size, per step kind
(``plain``, ``prefill``, or a speculative strategy with its tau), from measured rows; and
UpdateCost: the policy update's seconds against the number of workers N.

A kind's curve is the mean of its rows at each measured batch size, linearly interpolated
between them and extrapolated along the end segments beyond them (one measured size: a flat
curve), never below the cheapest measured step. tau (tokens each row emits per step, 1 for
plain) is interpolated the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..checks import check_choice, check_int, check_non_negative
from ..rollout.timeline import Timeline
from .importers import trace_from_timeline
from .trace import Trace, _typed_steps
from .validate import raise_problems, trace_problems

__all__ = ["StepCost", "UpdateCost", "UPDATE_SCALINGS"]

UPDATE_SCALINGS = ("constant", "log", "linear")
NOT_DECODE = ("prefill",)  # kinds that are no decode step, never an arm


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

    @classmethod
    def from_timelines(cls, timelines: list[Timeline]) -> "StepCost":
        """The costs real rollouts measured (the simulator's *calibration*): every decided
        decode step and each worker's prefill (``trace_from_timeline``'s step rows), pooled."""
        return cls(pd.concat([trace_from_timeline(t).steps for t in timelines],
                             ignore_index=True))

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

    @property
    def arms(self) -> list[str]:
        """The decode kinds a bandit chooses among: ``plain`` first, then every speculative
        kind measured."""
        return ["plain", *[k for k in self.kinds if k not in ("plain", *NOT_DECODE)]]

    def best_arm(self, batch) -> np.ndarray:
        """The kind with the fewest seconds per emitted token at each live batch size in
        ``batch`` (1-D): plain or a speculative kind (ties go to plain, then the first in
        ``arms``). What TLT's adaptive engine converges to once every bucket's arms are
        measured: the limit of its bandit, not its exploration (exploring costs at most its
        ``explore_budget``, 2% of decode time, which this leaves out)."""
        self._of("plain")
        b = np.asarray(batch, dtype=float)
        per_token = np.stack([self.seconds(k, b) / self.tau(k, b) for k in self.arms])
        return np.asarray(self.arms, dtype=object)[per_token.argmin(0)]


@dataclass(frozen=True)
class UpdateCost:
    """The policy update's seconds on N data-parallel workers: ``compute_s + sync_s x g(N)``.

    ``compute_s``: one worker's forward and backward over its own requests. Data parallel with
    a fixed number of requests per worker, it does not change with N. ``sync_s``: the gradient
    all-reduce's cost per unit of ``g``, which ``scaling`` names (g(1) = 0: one worker
    exchanges nothing):

    - ``"log"`` (the default): g = log2 N, a tree or hierarchical all-reduce (NCCL's across
      nodes), whose latency grows with the tree's depth. This is the usual case at 8 to 1024
      GPUs, where the bandwidth term of a ring is nearly flat and the latency term grows.
    - ``"constant"``: g = 1 for N > 1, a bandwidth-bound ring all-reduce
      (2 (N - 1) / N of the gradient through each link, about one gradient for any N).
    - ``"linear"``: g = N - 1, a parameter server or a gather to one rank.
    """

    compute_s: float
    sync_s: float = 0.0
    scaling: str = "log"

    def __post_init__(self):
        check_non_negative("UpdateCost.compute_s", self.compute_s)
        check_non_negative("UpdateCost.sync_s", self.sync_s)
        check_choice("UpdateCost.scaling", self.scaling, UPDATE_SCALINGS)

    def seconds(self, workers: int) -> float:
        """The update's seconds on ``workers`` workers."""
        n = check_int("workers", workers, 1)
        g = {"constant": float(n > 1), "log": float(np.log2(n)), "linear": float(n - 1)}
        return float(self.compute_s + self.sync_s * g[self.scaling])
