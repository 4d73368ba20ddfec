"""The simulator's check on a real RL run: an ablation's measured end-to-end speedup of TLT
over the baseline, predicted from the baseline alone (notebook 04's own setting).

Why: notebook 10 predicts single rollouts; the figure a researcher acts on is TLT's speedup
over whole RL steps. A run folder of notebook 04 holds what that takes: every step's timeline
of one seed per variant (``timelines/<variant>-seed<seed>/step<NN>``, ``Ablation.
save_timelines``) and the step times of every variant (``history.csv``).

Recipe:

1. the step costs are calibrated on the variants that are *not* predicted: the baseline's
   plain steps and static SD's chain steps (its strategy's seconds and tau per live batch);
2. each of the baseline's RL steps is replayed, its requests' lengths on the workers that
   held them, plain and under the bandit's limit (``StepCost.best_arm``: the arm with the
   fewest seconds per token at each live batch, which TLT's adaptive engine converges to);
3. each replay gets the baseline's own update time of that step (``update_sim_s``): the
   update does not depend on how the rollout decoded;
4. predicted speedup: summed plain steps over summed bandit steps; measured: the baseline's
   summed ``step_s`` over the variant's, that seed, the same ratio ``Ablation``'s
   ``e2e_speedup`` takes.

What it leaves out: the bandit's exploration (at most its ``explore_budget``), the spot-trained
drafter getting better over the run (static SD's frozen tau stands in for it), arms other
than the static chain, and the variant's own update times (measured apart, they differ from
the baseline's by the machine's noise alone: that noise is part of the measured speedup and
of this check's error).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..rollout.timeline import Timeline
from .cost import StepCost
from .importers import trace_from_timeline
from .simulate import layout, simulate_rollout

__all__ = ["RunCheck", "check_run", "run_check_metrics", "CALIBRATION_VARIANTS"]

CALIBRATION_VARIANTS = ("baseline", "static_sd")
"""The variants of a notebook-04 run that `check_run` calibrates the simulator on: the baseline
and static SD."""


@dataclass(frozen=True)
class RunCheck:
    """``steps``: per RL step of the seed, the measured ``step_s`` of the baseline and of
    the variant, the baseline's ``update_s``, and its simulated rollout ``plain_s`` and
    ``bandit_s``; ``variant`` and ``seed`` the run checked."""

    steps: pd.DataFrame
    variant: str
    seed: int

    @property
    def measured(self) -> float:
        return float(self.steps["baseline_step_s"].sum() / self.steps["variant_step_s"].sum())

    @property
    def predicted(self) -> float:
        s = self.steps
        return float((s["plain_s"] + s["update_s"]).sum() / (s["bandit_s"] + s["update_s"]).sum())

    @property
    def error(self) -> float:
        """(predicted - measured) / measured of the end-to-end speedup."""
        return (self.predicted - self.measured) / self.measured

    def metrics(self) -> dict[str, float]:
        v = self.variant
        return {f"predicted_e2e_speedup_{v}": self.predicted,
                f"measured_e2e_speedup_{v}_seed{self.seed}": self.measured,
                f"simulator_error_{v}": self.error}


def _saved_steps(folder: Path, variant: str, seed: int) -> list[Path]:
    """The folders of ``variant``'s saved step timelines of ``seed``, in step order."""
    where = folder / "timelines" / f"{variant}-seed{seed}"
    steps = sorted(where.glob("step*")) if where.is_dir() else []
    if not steps:
        raise ValueError(f"no saved timelines of {variant!r} seed {seed} under {str(where)!r}; "
                         "accepted: a run folder of notebook 04 whose variants include "
                         f"{[*CALIBRATION_VARIANTS]} and the one checked, with that seed saved")
    return steps


def check_run(folder: str | os.PathLike, variant: str = "tlt", seed: int = 0) -> RunCheck:
    """Predict ``variant``'s end-to-end speedup in the run folder ``folder`` (notebook 04's
    ``out_dir``) from its baseline and static SD runs of ``seed`` (module docstring), beside
    the measured one. Every input is read and checked before anything is simulated."""
    folder = Path(folder)
    base, static = ([Timeline.load(p) for p in _saved_steps(folder, v, seed)]
                    for v in CALIBRATION_VARIANTS)
    _saved_steps(folder, variant, seed)  # checked to be there; its steps are never read
    if not (folder / "history.csv").is_file():
        raise ValueError(f"no history.csv in {str(folder)!r}; accepted: a run folder of "
                         "notebook 04")
    h = pd.read_csv(folder / "history.csv")
    h = h[h["seed"] == seed].set_index(["variant", "step"])
    cost = StepCost.from_timelines(base + static)                          # 1) calibrate
    rows = []
    for step, timeline in enumerate(base):
        lay = layout(trace_from_timeline(timeline))                          # 2) replay
        rows.append({"step": step, "baseline_step_s": h.loc[("baseline", step), "step_s"],
                     "variant_step_s": h.loc[(variant, step), "step_s"],
                     "update_s": h.loc[("baseline", step), "update_sim_s"],  # 3) its update
                     "plain_s": simulate_rollout(lay, cost).makespan_s,
                     "bandit_s": simulate_rollout(lay, cost, rule="bandit").makespan_s})
    return RunCheck(pd.DataFrame(rows), variant, seed)                       # 4) the ratios


def run_check_metrics(folder: str | os.PathLike, variants, variant: str = "tlt",
                      seed: int = 0) -> dict[str, float]:
    """:meth:`RunCheck.metrics` of :func:`check_run` on ``folder`` where the run's
    ``variants`` hold the :data:`CALIBRATION_VARIANTS` and ``variant``; ``{}`` (nothing read)
    where they do not, e.g. a baseline-only run."""
    if not {*CALIBRATION_VARIANTS, variant} <= set(variants):
        return {}
    return check_run(folder, variant, seed).metrics()
