"""SD what-if explorer: how a threshold, k and drafter would have changed a recorded rollout.

Why: the adaptive engine's threshold is chosen from a measured speedup-against-batch curve;
this explorer puts that curve beside what it implies for a real rollout (recorded without SD),
so one sees how much of the makespan lies at small batches, where SD pays. It reads two tables
and computes nothing but maxima and sums of them (viz reads tables only): the sd_sweep table,
and :func:`workbench.speculative.whatif.whatif_table` of the rollout (a model from measured
speedups, not a run: each decode step at live batch <= threshold takes its recorded time over
the speedup measured at its batch size).
"""
from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

from ..checks import check_choice, check_int
from ..results import read_table
from .explorer import Explorer, legend_beside
from .speculative import _batch_axis, _styles, _temperature_title

__all__ = ["SDWhatIf"]

SWEEP_CLOCK = "wall"  # sd_sweep's speedups are ratios of tokens/s on one process's wall clock
RECORDED_COLOR = "#bdbdbd"
SAME_MAKESPAN = 5e-3  # relative: closer than this, the two makespan lines are drawn as one
SWEEP_COLUMNS = ("temperature", "drafter", "k", "batch_size", "speedup")
# what the explorer reads of speculative.whatif.whatif_table: per (drafter, k, threshold) the
# setting's scalars, repeated on each worker's row, and each worker's times and steps
SETTING_COLUMNS = ("temperature", "drafter", "k", "threshold", "clock", "beyond_measured",
                   "measured_threshold", "makespan_recorded_s", "makespan_whatif_s", "speedup")
WHATIF_COLUMNS = (*SETTING_COLUMNS, "worker", "recorded_s", "whatif_s", "sd_steps",
                  "decode_steps")


def _read_whatif(whatif) -> pd.DataFrame:
    table = read_table(whatif, WHATIF_COLUMNS, "a what-if table (speculative.whatif.whatif_table)")
    if table.empty:
        raise ValueError("the what-if table has no rows; build it with "
                         "speculative.whatif.whatif_table(timeline, sweep, temperature)")
    temperatures = sorted(table["temperature"].unique().tolist())
    if len(temperatures) != 1:
        raise ValueError(f"the what-if table mixes temperatures {temperatures}; "
                         "whatif_table builds one per temperature")
    return table


class SDWhatIf(Explorer):
    """Sliders for the SD threshold, k and drafter over a recorded rollout without SD.

    Left: the measured speedup against batch size of every (drafter, k) at the what-if's
    temperature (the selected one bold; log2 batch axis; the threshold as a vertical line and
    the SD region shaded; plain decoding at 1, dotted). Right: each worker's busy time recorded
    and under the what-if, with both makespans (told apart by style, and by label when they
    coincide). Legends sit beside the axes, never over the data. The panel states the makespans
    and the speedup, and why a control offers so little choice when it does (one k or one
    drafter measured, a rollout whose live batch never exceeded 1 or 2); so do the controls'
    tooltips.

    Args:
        sweep: an ``sd_sweep`` table (notebook 02's ``curve.csv``), DataFrame or CSV/parquet path.
        whatif: ``speculative.whatif.whatif_table(timeline, sweep, temperature)`` of the
            recorded rollout (notebook 02's ``whatif.csv``), DataFrame or CSV/parquet path.
        threshold: the slider's first value (default: the threshold this machine measured for
            the opening drafter and k, the table's ``measured_threshold``, capped at the
            largest live batch of the rollout).
        k: the k it opens at (default: the largest measured for the opening drafter).
    """

    figsize = (12.5, 4.6)

    def __init__(self, sweep, whatif, threshold: int | None = None, k: int | None = None):
        import ipywidgets as widgets
        self.table = _read_whatif(whatif)
        self.temperature = float(self.table["temperature"].iloc[0])
        sweep = read_table(sweep, SWEEP_COLUMNS, "an sd_sweep table")
        self.sweep = sweep[sweep["temperature"] == self.temperature]
        if self.sweep.empty:
            measured = sorted(sweep["temperature"].unique().tolist())
            raise ValueError(f"the sweep has no rows at temperature {self.temperature:g}, the "
                             f"what-if's; it measured {measured}")
        self.max_batch = int(self.table["threshold"].max())
        self.pairs = sorted(set(zip(self.table["drafter"], self.table["k"].astype(int))))
        self.styles = _styles(sweep)
        drafters = sorted({d for d, _ in self.pairs})
        drafter = "eagle" if "eagle" in drafters else drafters[0]
        ks = sorted({kk for _, kk in self.pairs})
        k = max(kk for d, kk in self.pairs if d == drafter) if k is None else k
        k = check_choice("k (a measured one)", k, ks)
        start = (self._slice(drafter, k, 0)["measured_threshold"].iloc[0] if threshold is None
                 else check_int("threshold (above the rollout's largest live decode batch, "
                                f"{self.max_batch}, SD everywhere)", threshold, 0))
        controls = {
            "threshold": widgets.IntSlider(value=min(int(start), self.max_batch), min=0,
                                           max=self.max_batch, description="threshold"),
            "k": widgets.Dropdown(options=ks, value=k, description="k"),
            "drafter": widgets.Dropdown(options=drafters, value=drafter, description="drafter")}
        self.notes = self._explain(controls)
        super().__init__(controls)

    def _slice(self, drafter, k, threshold) -> pd.DataFrame:
        t = self.table
        return t[(t["drafter"] == drafter) & (t["k"] == k) & (t["threshold"] == threshold)]

    def _shown(self, drafter, k, threshold) -> tuple[pd.DataFrame, dict]:
        """The workers' rows of one what-if, and its scalars (the table repeats them on every
        row; steps are summed over workers)."""
        rows = self._slice(drafter, k, threshold).sort_values("worker")
        first = rows.iloc[0]
        setting = {c: first[c] for c in SETTING_COLUMNS}
        setting.update(sd_steps=int(rows["sd_steps"].sum()),
                       decode_steps=int(rows["decode_steps"].sum()))
        return rows, setting

    def _explain(self, controls) -> list[str]:
        """Tooltips that say what each control ranges over, and the reasons (also shown in
        the panel) why one offers a single choice, or a slider only two positions."""
        at = _temperature_title(self.temperature)
        slider = controls["threshold"]
        slider.tooltip = (f"SD on at live batch ≤ threshold (0: nowhere); it ends at "
                          f"{self.max_batch}, the recorded rollout's largest live decode batch")
        notes = []
        if self.max_batch <= 2:
            notes.append(f"the threshold has {self.max_batch + 1} positions (0 = SD nowhere, "
                         f"up to {self.max_batch}): the recorded rollout's live decode batch "
                         f"never exceeded {self.max_batch}")
        for name, what in (("k", "k={}"), ("drafter", "{}")):
            options = controls[name].options
            if len(options) == 1:
                notes.append(f"only {what.format(options[0])} was measured at {at}")
                controls[name].tooltip = notes[-1]
            else:
                controls[name].tooltip = f"measured at {at}: " + ", ".join(
                    what.format(o) for o in options)
        return notes

    def draw(self, fig, threshold, k, drafter) -> str:
        left, right = fig.subplots(1, 2)
        self._curves(left, threshold, drafter, k)
        if (drafter, k) not in self.pairs:
            right.set_axis_off()
            right.text(0.5, 0.5, f"{drafter} k={k} was not measured", ha="center",
                       transform=right.transAxes, gid="not-measured")
            measured = ", ".join(f"{d} k={kk}" for d, kk in self.pairs)
            return (f"<b>{html.escape(str(drafter))} k={k}</b> was not measured at "
                    f"{_temperature_title(self.temperature)}; measured: "
                    f"{html.escape(measured)}" + _notes(self.notes))
        workers, setting = self._shown(drafter, k, threshold)
        self._workers(right, workers, setting)
        return _panel(setting) + _notes(self.notes)

    def _curves(self, ax, threshold, drafter, k) -> None:
        """Every measured (drafter, k) curve, the selected one bold, threshold and SD region."""
        for (d, kk), rows in self.sweep.groupby(["drafter", "k"], sort=True):
            rows = rows.sort_values("batch_size")
            chosen = (d, int(kk)) == (drafter, k)
            ax.plot(rows["batch_size"], rows["speedup"], "-", markersize=7 if chosen else 4,
                    linewidth=3.0 if chosen else 1.2, alpha=1.0 if chosen else 0.45,
                    zorder=3 if chosen else 2, gid=f"curve-{d}-k{kk}", label=f"{d} k={kk}",
                    **self.styles[(d, int(kk))])
        sizes = sorted(self.sweep["batch_size"].unique())
        _batch_axis(ax, sizes)
        lo, hi = min(1, sizes[0]) / 1.3, max(sizes[-1], self.max_batch) * 1.3
        ax.set_xlim(lo, hi)
        if threshold >= 1:  # 0: SD nowhere, no region to shade
            ax.axvspan(lo, threshold, color="#33a02c", alpha=0.1, gid="sd-region",
                       label=f"SD on: live batch ≤ {threshold}")
            ax.axvline(threshold, color="#33a02c", linewidth=1.5, gid="threshold")
        # dotted and on top: a curve at 1 (SD no faster) still leaves it visible
        ax.axhline(1.0, color="black", linestyle=":", linewidth=1.6, zorder=4,
                   gid="plain-decoding", label="plain decoding (speedup 1)")
        speedups = [1.0, *self.sweep["speedup"].dropna()]
        low, high = min(speedups), max(speedups)
        pad = max(high - low, 0.05) * 0.08
        ax.set_ylim(low - pad, high + pad)
        ax.set_ylabel(f"measured SD speedup ({SWEEP_CLOCK} clock)")
        ax.set_title(f"Measured SD speedup by batch size, {_temperature_title(self.temperature)}",
                     fontsize=10)
        ax.grid(alpha=0.3)
        legend_beside(ax)

    def _workers(self, ax, w: pd.DataFrame, setting: dict) -> None:
        """Per worker: busy time recorded and under the what-if, and both makespans."""
        x = np.arange(len(w))
        color = self.styles[(setting["drafter"], int(setting["k"]))]["color"]
        for gid, xs, col, c, label in (
                ("recorded-bar", x - 0.2, "recorded_s", RECORDED_COLOR, "recorded (no SD)"),
                ("whatif-bar", x + 0.2, "whatif_s", color, "what-if")):
            for bar in ax.bar(xs, w[col], 0.4, color=c, label=label):
                bar.set_gid(gid)
        recorded, whatif = setting["makespan_recorded_s"], setting["makespan_whatif_s"]
        same = math.isclose(recorded, whatif, rel_tol=SAME_MAKESPAN)
        # the what-if wide and pale underneath, the recorded dashed on top: both show when equal
        ax.axhline(whatif, color=color, linewidth=4.0, alpha=0.5, zorder=3,
                   gid="makespan-whatif", label=f"what-if makespan {whatif:.2f} s"
                   + (" (= recorded)" if same else ""))
        ax.axhline(recorded, color="#424242", linestyle="--", linewidth=1.4, zorder=4,
                   gid="makespan-recorded", label=f"recorded makespan {recorded:.2f} s")
        ax.set_ylim(0, max(recorded, whatif, 1e-9) * 1.15)
        ax.set_xticks(x, [str(i) for i in w["worker"]])
        ax.set_xlabel("worker")
        ax.set_ylabel(f"busy time (s, {setting['clock']} clock)")
        ax.set_title(_workers_title(setting), fontsize=10)
        legend_beside(ax)


def _workers_title(s: dict) -> str:
    """The right panel's title in words: the SD setting modelled and what it did."""
    if s["threshold"] == 0:
        return "What-if with SD nowhere (threshold 0): the recorded makespan"
    return (f"What-if with {s['drafter']} k={s['k']} at live batch ≤ {s['threshold']}: "
            f"makespan speedup {s['speedup']:.2f}×")


def _notes(notes: list[str]) -> str:
    """Why a control offers so little choice, one line each (empty when it offers enough)."""
    return "".join(f"<br><i>{html.escape(n)}</i>" for n in notes)


def _panel(s: dict) -> str:
    """The side panel: makespans, speedup, and how many steps the what-if switched to SD."""
    beyond = (f"<br>{s['beyond_measured']} SD steps lie outside the measured batch sizes and "
              "take the nearest measured speedup." if s["beyond_measured"] else "")
    return (f"<b>makespan</b> recorded {s['makespan_recorded_s']:.3f} s, what-if "
            f"{s['makespan_whatif_s']:.3f} s ({s['clock']} clock)<br>"
            f"<b>speedup</b> {s['speedup']:.2f}×<br>"
            f"SD on for {s['sd_steps']} of {s['decode_steps']} decode steps "
            f"({html.escape(str(s['drafter']))} k={s['k']}, live batch ≤ {s['threshold']}, "
            f"temperature {s['temperature']:g})<br>"
            "<i>a model from measured speedups, interpolated in log batch size; not a run</i>"
            + beyond)
