"""What would SD have saved on a recorded rollout? A makespan model from measured speedups.

The adaptive engine learns per batch-size bucket whether SD pays (docs/design.md, "The
adaptive engine"). Before running it, one can ask what a given threshold, drafter and k would have done
to a rollout already recorded without SD: take its steps table, and divide the duration of
every decode step whose batch size is at or below the threshold by the SD speedup measured
at that batch size (the ``sd_sweep`` table of notebook 02). Every other step (prefill, decode
above the threshold) keeps its recorded duration. A worker's time is the sum of its rollout
steps; the makespan is the largest worker time, before and after.

This is a model, not a measurement. It assumes that a step's speedup depends only on its
batch size, as measured by ``sd_sweep`` on the same engine (its speedup is a ratio of tokens/s
on the wall clock, applied here to the timeline's own clock), and that SD changes how long a
worker takes to emit its tokens, not which tokens or which requests it runs (lossless SD emits
the same tokens, so each worker's batch shrinks through the same sizes).
Between measured batch sizes the speedup is interpolated linearly in log2(batch size); below
the smallest or above the largest measured batch size the nearest measured point is used (no
extrapolation), and :attr:`WhatIf.beyond_measured` counts the steps that needed it.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..results import read_table
from ..rollout.timeline import Timeline

__all__ = ["WhatIf", "measured_speedups", "measured_threshold", "speedup_at", "sd_whatif",
           "SWEEP_COLUMNS"]

SWEEP_COLUMNS = ("temperature", "drafter", "k", "batch_size", "speedup")
SD_KINDS = ("draft", "verify")  # a timeline with these already ran SD
COUNTED_KINDS = ("prefill", "decode")  # the rollout work of a plain rollout


@dataclass(frozen=True)
class WhatIf:
    """A recorded rollout's makespan, and what it would have been with SD at small batches.

    Attributes:
        threshold, drafter, k, temperature: the SD setting modelled.
        workers: one row per worker 0..N-1: ``recorded_s`` (sum of its prefill and decode
            steps as recorded), ``whatif_s`` (the same with SD), ``sd_steps`` (decode steps
            switched to SD), ``decode_steps``.
        clock: the timeline's clock, which every time here is on.
        beyond_measured: SD steps whose batch size lay outside the measured batch sizes (they
            took the nearest measured speedup).
    """

    threshold: int
    drafter: str
    k: int
    temperature: float
    workers: pd.DataFrame
    clock: str
    beyond_measured: int

    @property
    def makespan_recorded_s(self) -> float:
        return float(self.workers["recorded_s"].max()) if len(self.workers) else 0.0

    @property
    def makespan_whatif_s(self) -> float:
        return float(self.workers["whatif_s"].max()) if len(self.workers) else 0.0

    @property
    def speedup(self) -> float:
        """Recorded makespan over what-if makespan (1.0 for an empty rollout)."""
        after = self.makespan_whatif_s
        return self.makespan_recorded_s / after if after > 0 else 1.0

    def summary(self) -> dict:
        """The scalars a notebook reports about this what-if."""
        return {"threshold": self.threshold, "drafter": self.drafter, "k": self.k,
                "temperature": self.temperature, "clock": self.clock,
                "makespan_recorded_s": self.makespan_recorded_s,
                "makespan_whatif_s": self.makespan_whatif_s, "speedup": self.speedup,
                "sd_steps": int(self.workers["sd_steps"].sum()),
                "beyond_measured": self.beyond_measured}


def measured_speedups(sweep, drafter: str, k: int,
                      temperature: float) -> pd.DataFrame:
    """``batch_size, speedup`` measured for one (drafter, k, temperature), by batch size
    (``sweep``: an sd_sweep table, or the CSV/parquet path it was written to).

    Raises ``ValueError`` naming the measured (drafter, k, temperature) when this one is
    absent, and for duplicated batch sizes or speedups that are not positive numbers."""
    sweep = read_table(sweep, SWEEP_COLUMNS, "an sd_sweep table")
    rows = sweep[(sweep["drafter"] == drafter) & (sweep["k"] == k)
                 & (sweep["temperature"] == temperature)]
    if rows.empty:
        present = sorted(set(zip(sweep["drafter"], sweep["k"].astype(int),
                                 sweep["temperature"].astype(float))))
        raise ValueError(f"no measured speedups for drafter={drafter!r}, k={k!r}, "
                         f"temperature={temperature!r}; measured (drafter, k, temperature): "
                         f"{present}")
    rows = rows[["batch_size", "speedup"]].astype(float).sort_values("batch_size")
    twice = rows["batch_size"][rows["batch_size"].duplicated()].tolist()
    if twice:
        raise ValueError(f"batch sizes {twice} are measured more than once for {drafter} k={k} "
                         f"at temperature {temperature}; pass one sd_sweep table per setting")
    bad = rows[~(rows["speedup"] > 0)]
    if len(bad):
        raise ValueError(f"speedups {bad['speedup'].tolist()} at batch sizes "
                         f"{bad['batch_size'].tolist()} ({drafter} k={k}) are not positive "
                         "numbers; a what-if needs every measured speedup > 0")
    return rows.reset_index(drop=True)


def speedup_at(measured: pd.DataFrame, batch_sizes) -> np.ndarray:
    """The speedup at each of ``batch_sizes`` (>= 1) from ``measured`` (``batch_size,
    speedup``, as :func:`measured_speedups` returns): linear in log2(batch size) between
    measured sizes, the nearest measured point outside them."""
    sizes = np.asarray(batch_sizes, dtype=float)
    if np.any(sizes < 1):
        raise ValueError(f"batch sizes must be >= 1, got {sorted(set(sizes[sizes < 1]))}")
    return np.interp(np.log2(sizes), np.log2(measured["batch_size"].to_numpy(float)),
                     measured["speedup"].to_numpy(float))


def measured_threshold(sweep: pd.DataFrame, drafter: str, k: int, temperature: float) -> int:
    """The threshold this machine measured: the largest batch size of ``sweep`` up to which
    SD (``drafter``, ``k``, ``temperature``) beat plain decoding at every measured size; 0
    when it lost already at the smallest. What the adaptive engine learns per bucket, read
    off a sweep, so that a what-if starts where this machine is, not where another was."""
    measured = measured_speedups(sweep, drafter, k, temperature)
    losing = measured["speedup"] <= 1
    last = len(measured) if not losing.any() else int(losing.to_numpy().argmax())
    return int(measured["batch_size"].iloc[last - 1]) if last else 0


def _check_threshold(threshold) -> int:
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Integral) \
            or threshold < 0:
        raise ValueError(f"threshold {threshold!r} is not accepted: an integer >= 0 (SD is "
                         "on at live batch sizes up to it; 0: nowhere)")
    return int(threshold)


def _rollout_steps(timeline: Timeline) -> pd.DataFrame:
    """The prefill and decode steps of a rollout recorded without SD."""
    if not isinstance(timeline, Timeline):
        raise TypeError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    kinds = timeline.steps["kind"]
    if kinds.isin(SD_KINDS).any():
        raise ValueError(f"the timeline already has SD steps ({sorted(set(kinds) & set(SD_KINDS))}"
                         "); a what-if needs a rollout recorded without SD (plain decode steps)")
    return timeline.steps[kinds.isin(COUNTED_KINDS)]


def sd_whatif(timeline: Timeline, sweep: pd.DataFrame, threshold: int, drafter: str, k: int,
              temperature: float) -> WhatIf:
    """What ``timeline`` (a rollout without SD) would have taken with SD (``drafter``, ``k``)
    switched on at live batch <= ``threshold``, from the speedups ``sweep`` measured at
    ``temperature``; see the module's docstring for the model and its assumptions."""
    threshold = _check_threshold(threshold)
    measured = measured_speedups(sweep, drafter, k, temperature)
    steps = _rollout_steps(timeline)
    seconds = (steps["end_s"] - steps["start_s"]).to_numpy(float)
    sizes = steps["batch_size"].to_numpy(float)
    decode = (steps["kind"] == "decode").to_numpy()
    on = decode & (sizes <= threshold)
    factor = np.ones(len(steps))
    factor[on] = speedup_at(measured, sizes[on])
    lo, hi = measured["batch_size"].min(), measured["batch_size"].max()
    per_step = pd.DataFrame({"worker": steps["worker"].to_numpy(), "recorded_s": seconds,
                             "whatif_s": seconds / factor, "sd_steps": on.astype(int),
                             "decode_steps": decode.astype(int)})
    workers = (per_step.groupby("worker").sum()
               .reindex(range(timeline.num_workers), fill_value=0)
               .rename_axis("worker").reset_index())
    return WhatIf(threshold, drafter, k, temperature, workers, timeline.clock,
                  int((on & ((sizes < lo) | (sizes > hi))).sum()))
