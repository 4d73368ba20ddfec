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

:func:`sd_whatif` models one setting; :func:`whatif_table` every setting an explorer can show
(each measured drafter and k, each threshold up to the rollout's largest live batch), as one
table that ``viz.SDWhatIf`` reads, so the figures need neither the timeline nor this model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..checks import check_int
from ..results import read_table
from ..rollout.timeline import Timeline

__all__ = ["WhatIf", "measured_threshold", "sd_whatif", "whatif_table", "WHATIF_COLUMNS"]

SWEEP_COLUMNS = ("temperature", "drafter", "k", "batch_size", "speedup")
# whatif_table: one row per (drafter, k, threshold, worker); the setting's scalars (the first
# ten) repeat on every worker's row
WHATIF_COLUMNS = ("temperature", "drafter", "k", "threshold", "clock", "beyond_measured",
                  "measured_threshold", "makespan_recorded_s", "makespan_whatif_s", "speedup",
                  "worker", "recorded_s", "whatif_s", "sd_steps", "decode_steps")
"""The columns of `whatif_table`: one row per (drafter, k, threshold, worker); the setting's
scalars (the first ten) repeat on every worker's row."""
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


def _pick_temperature(sweep, temperature: float | None) -> float:
    """``temperature`` if ``sweep`` measured it; the only one when None and there is one."""
    present = sorted(float(t) for t in sweep["temperature"].unique())
    if temperature is None and len(present) == 1:
        return present[0]
    if temperature is None or float(temperature) not in present:
        raise ValueError(f"temperature {temperature!r}: the sweep measured temperatures "
                         f"{present}; pass temperature=one of them")
    return float(temperature)


def _threshold_of(measured: pd.DataFrame) -> int:
    """The largest measured batch size up to which every measured speedup exceeds 1; 0 when
    the first one does not."""
    losing = measured["speedup"] <= 1
    last = len(measured) if not losing.any() else int(losing.to_numpy().argmax())
    return int(measured["batch_size"].iloc[last - 1]) if last else 0


def measured_threshold(sweep: pd.DataFrame, drafter: str, k: int, temperature: float) -> int:
    """The threshold this machine measured: the largest batch size of ``sweep`` up to which
    SD (``drafter``, ``k``, ``temperature``) beat plain decoding at every measured size; 0
    when it lost already at the smallest. What the adaptive engine learns per bucket, read
    off a sweep, so that a what-if starts where this machine is, not where another was."""
    return _threshold_of(measured_speedups(sweep, drafter, k, temperature))


@dataclass(frozen=True)
class _Recorded:
    """The prefill and decode steps of a rollout recorded without SD, as arrays."""

    worker: np.ndarray   # (steps,) int
    seconds: np.ndarray  # (steps,) float
    sizes: np.ndarray    # (steps,) float, the live batch of each step
    decode: np.ndarray   # (steps,) bool
    num_workers: int
    clock: str

    @property
    def max_decode_batch(self) -> int:
        if not self.decode.any():
            raise ValueError("the timeline has no decode steps: nothing for SD to speed up "
                             "(pass a recorded rollout, e.g. a run folder of notebook 01)")
        return int(self.sizes[self.decode].max())


def _recorded(timeline: Timeline) -> _Recorded:
    """A rollout recorded without SD (a ``Timeline``); one that ran SD is refused."""
    if not isinstance(timeline, Timeline):
        raise TypeError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    kinds = timeline.steps["kind"]
    if kinds.isin(SD_KINDS).any():
        raise ValueError(f"the timeline already has SD steps ({sorted(set(kinds) & set(SD_KINDS))}"
                         "); a what-if needs a rollout recorded without SD (plain decode steps)")
    steps = timeline.steps[kinds.isin(COUNTED_KINDS)]
    seconds = (steps["end_s"] - steps["start_s"]).to_numpy(float)
    return _Recorded(steps["worker"].to_numpy(int), seconds, steps["batch_size"].to_numpy(float),
                     (steps["kind"] == "decode").to_numpy(), timeline.num_workers,
                     timeline.clock)


def _per_worker(rec: _Recorded, measured: pd.DataFrame,
                threshold: int) -> tuple[pd.DataFrame, int]:
    """Each worker's time recorded and with SD on at live batch <= ``threshold``, and how many
    SD steps lay outside the measured batch sizes."""
    on = rec.decode & (rec.sizes <= threshold)
    factor = np.ones(len(rec.seconds))
    factor[on] = speedup_at(measured, rec.sizes[on])
    n = rec.num_workers

    def per_worker(values) -> np.ndarray:
        return np.bincount(rec.worker, weights=values, minlength=n)[:n]

    workers = pd.DataFrame({"worker": np.arange(n), "recorded_s": per_worker(rec.seconds),
                            "whatif_s": per_worker(rec.seconds / factor),
                            "sd_steps": per_worker(on).astype(int),
                            "decode_steps": per_worker(rec.decode).astype(int)})
    lo, hi = measured["batch_size"].min(), measured["batch_size"].max()
    return workers, int((on & ((rec.sizes < lo) | (rec.sizes > hi))).sum())


def sd_whatif(timeline: Timeline, sweep: pd.DataFrame, threshold: int, drafter: str, k: int,
              temperature: float) -> WhatIf:
    """What ``timeline`` (a rollout without SD) would have taken with SD (``drafter``, ``k``)
    switched on at live batch <= ``threshold``, from the speedups ``sweep`` measured at
    ``temperature``; see the module's docstring for the model and its assumptions."""
    threshold = check_int("threshold (SD on at live batch sizes up to it; 0: nowhere)",
                          threshold, 0)
    measured = measured_speedups(sweep, drafter, k, temperature)
    rec = _recorded(timeline)
    workers, beyond = _per_worker(rec, measured, threshold)
    return WhatIf(threshold, drafter, k, temperature, workers, rec.clock, beyond)


def whatif_table(timeline: Timeline | str | os.PathLike, sweep,
                 temperature: float | None = None) -> pd.DataFrame:
    """Every what-if of ``timeline`` (a rollout recorded without SD, or the run folder it was
    saved in) that ``sweep`` (an sd_sweep table or its CSV/parquet path) allows at
    ``temperature`` (needed when the sweep measured several): one row per measured (drafter,
    k), threshold from 0 to the rollout's largest live decode batch, and worker, with the
    columns of :data:`WHATIF_COLUMNS` (``measured_threshold``: that of the row's drafter and
    k, :func:`measured_threshold`). The rows of one (drafter, k, threshold) are
    :func:`sd_whatif`'s ``workers``; what ``viz.SDWhatIf`` reads."""
    sweep = read_table(sweep, SWEEP_COLUMNS, "an sd_sweep table")
    temperature = _pick_temperature(sweep, temperature)
    if isinstance(timeline, (str, os.PathLike)):
        timeline = Timeline.load(timeline)
    rec = _recorded(timeline)
    thresholds = range(rec.max_decode_batch + 1)
    at = sweep[sweep["temperature"] == temperature]
    frames = []
    for drafter, k in sorted(set(zip(at["drafter"], at["k"].astype(int)))):
        measured = measured_speedups(at, drafter, k, temperature)
        for threshold in thresholds:
            workers, beyond = _per_worker(rec, measured, threshold)
            w = WhatIf(threshold, drafter, k, temperature, workers, rec.clock, beyond)
            setting = {c: v for c, v in w.summary().items() if c != "sd_steps"}
            frames.append(workers.assign(**setting, measured_threshold=_threshold_of(measured)))
    return pd.concat(frames, ignore_index=True)[list(WHATIF_COLUMNS)]
