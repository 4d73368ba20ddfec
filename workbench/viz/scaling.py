"""Figures of notebook 08, drawn from its tables: the same RL steps on the local backend (sim
clock) and on Ray (wall clock), and drafter steps per RL step under the two idle-worker rules.

``steps`` is ``rl.scaling.BackendComparison.steps`` (one row per system and RL step);
``rules`` is ``rl.scaling.compare_idle_rules``'s table (one row per step and rule).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .timeline import _axes

__all__ = ["makespans_by_backend", "drafter_steps_by_rule"]

SYSTEM_COLORS = {"local": "#4d4d4d", "ray-1": "#a6cee3", "ray-2": "#1f78b4"}


def makespans_by_backend(steps: pd.DataFrame, ax=None, label: str = ""):
    """Per RL step, each system's makespan (bars: sim clock for the local backend, wall
    clock for Ray) and the driver's time of the local rollout (the dashes: its workers one
    after another), so the sim clock's prediction and the parallel speedup read off one
    figure."""
    fig, ax = _axes(ax, (7, 3.2))
    systems = list(dict.fromkeys(steps["system"]))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        rows = steps[steps["system"] == system].sort_values("step")
        clock = rows["clock"].iloc[0]
        ax.bar(rows["step"] + (i - (len(systems) - 1) / 2) * width, rows["makespan_s"], width,
               label=f"{system} makespan ({clock} clock)",
               color=SYSTEM_COLORS.get(system, f"C{i}"))
    local = steps[steps["system"] == "local"].sort_values("step")
    if len(local):
        ax.hlines(local["wall_s"], local["step"] - 0.4, local["step"] + 0.4, colors="#e31a1c",
                  linestyles="--", label="local: the driver's wall time")
    ax.set_xticks(sorted(steps["step"].unique()))
    ax.set_xlabel("RL step")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(label, fontsize=7, loc="left", color="#555555")
    return fig


def drafter_steps_by_rule(rules: pd.DataFrame, ax=None, label: str = ""):
    """Drafter steps per RL step with every idle worker training against the first finisher
    alone (bars), and tau of the drafter that served each step (line, right axis)."""
    fig, ax = _axes(ax, (7, 3.2))
    wide = rules.pivot(index="step", columns="rule")
    x = np.asarray(wide.index)
    for offset, rule, color in ((-0.2, "first", "#a6cee3"), (0.2, "all", "#1f78b4")):
        ax.bar(x + offset, wide["drafter_steps"][rule], 0.4, color=color,
               label=f"drafter steps: {rule} idle worker{'s' if rule == 'all' else ''}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("drafter steps")
    tau = ax.twinx()
    for rule, style in (("first", ":"), ("all", "-")):
        tau.plot(x, wide["accept_len"][rule], style, color="#e31a1c", marker="o",
                 label=f"tau ({rule})")
    tau.set_ylabel("tau (acceptance length)")
    handles = ax.get_legend_handles_labels()
    more = tau.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper left")
    ax.set_xticks(x)
    ax.set_title(label + ("\n" if label else "") + "sim clock", fontsize=7, loc="left",
                 color="#555555")
    return fig
