"""The remedy model's check on a real RL run: each long-tail remedy's measured end-to-end
speedup over the baseline in a notebook 11 run folder, predicted from the baseline alone.

Why: ``cluster.remedies`` replays over-provisioning, APRIL, partial rollouts and tail
batching on a plain run's lengths; its predictions are worth what it gets right where the
remedies really ran. A run folder of notebook 11 holds what that takes: the baseline's
rollout timelines of one seed (``timelines/baseline-seed<s>/step<NN>``, ``Ablation.
save_timelines``, or its ``checkpoint/baseline-seed<s>/timelines``) and every variant's step
times (``history.csv``).

Recipe (as ``cluster.run_check`` does for TLT):

1. the step costs are calibrated on the baseline's own steps (plain decode steps and
   prefills, ``StepCost.from_timelines``); the rows a worker decoded at once from its
   timelines (``remedies.inferred_max_batch``);
2. the baseline's groups of each step (their response lengths) are the stream of prompts,
   replayed plain and with each remedy (``remedies.remedy_steps``, P and G as logged, the
   length cap the run's ``max_new_tokens`` where ``checkpoint/ablation.json`` names it);
3. each replayed step gets the baseline's own update time of that step (``update_sim_s``),
   as the diagnosis keeps the rest of a step as logged (``update="logged"``); or
   (``update="padded"``) that update moved by ``slope`` x the change in the padded batch
   (the responses trained x the longest of them, what the workbench's GRPO pays for), the
   slope fitted on the baseline's steps (``remedies.update_fit``), and a step that trains
   on stale tokens (APRIL's, partial rollouts') charged ``composed.STALE_UPDATE`` for its
   old log-probs' forward;
4. predicted: summed plain steps over summed remedy steps; measured: the baseline's summed
   ``step_s`` over the variant's, that seed (``Ablation``'s ``e2e_speedup``). The rollout's
   alone the same way (``rollout_s``): the remedy model's own error, apart from the update.

What it leaves out: the remedy run's own lengths (its policy drifts apart from the
baseline's as it trains on other data), its update times under ``"logged"`` (over-
provisioning trains the groups that finish first, the short ones, so a trainer that pads to
the longest response updates faster; partial rollouts' first steps train fewer groups), and
the machine's noise in the measured times, which is part of the measured speedup and so of
this check's error.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..checks import check_choice
from ..rollout.timeline import Timeline
from .composed import stale_update
from .cost import StepCost
from .remedies import (REMEDY_MODELS, groups_of_timeline, inferred_max_batch, padded_work,
                       remedy_steps, update_fit)

__all__ = ["RemedyCheck", "check_remedies", "remedy_check_metrics", "UPDATES"]

UPDATES = ("logged", "padded")
"""How ``check_remedies`` charges each replayed step's update: the baseline's logged one, or
one fitted to the padded batch trained (module docstring)."""


@dataclass(frozen=True)
class RemedyCheck:
    """``table``: per remedy variant of the run, ``predicted`` and ``measured`` end-to-end
    speedups over the baseline and ``error`` ((predicted - measured) / measured), and the
    same of the rollout alone (``rollout_predicted``, ``rollout_measured``,
    ``rollout_error``); ``steps``: ``remedies.remedy_steps``' per-step replay; ``seed`` the
    run checked; ``update`` how the updates were charged."""

    table: pd.DataFrame
    steps: pd.DataFrame
    seed: int
    update: str = "logged"

    def metrics(self) -> dict[str, float]:
        """The figures of a result file: per variant the predicted and measured speedups and
        the errors, named ``remedy_sim_error_<variant>`` (end to end) and
        ``remedy_rollout_error_<variant>`` (``"padded"`` updates: ``..._padded_update``)."""
        out, tag = {}, "" if self.update == "logged" else f"_{self.update}_update"
        for _, r in self.table.iterrows():
            v = r["variant"]
            out.update({f"remedy_predicted_e2e_speedup_{v}{tag}": r["predicted"],
                        f"remedy_measured_e2e_speedup_{v}_seed{self.seed}": r["measured"],
                        f"remedy_sim_error_{v}{tag}": r["error"],
                        f"remedy_predicted_rollout_speedup_{v}": r["rollout_predicted"],
                        f"remedy_measured_rollout_speedup_{v}_seed{self.seed}": r["rollout_measured"],
                        f"remedy_rollout_error_{v}": r["rollout_error"]})
        return out


def _baseline_steps(folder: Path, seed: int) -> list[Path]:
    for where in (folder / "timelines" / f"baseline-seed{seed}",
                  folder / "checkpoint" / f"baseline-seed{seed}" / "timelines"):
        steps = sorted(where.glob("step*")) if where.is_dir() else []
        if steps:
            return steps
    raise ValueError(f"no saved timelines of 'baseline' seed {seed} under {str(folder)!r} "
                     "(timelines/baseline-seed<s> or checkpoint/baseline-seed<s>/timelines); "
                     "accepted: a run folder of notebook 11 whose variants include the baseline")


def _max_new_tokens(folder: Path) -> int | None:
    """The run's length cap, from ``checkpoint/ablation.json``'s GRPO config, where it is."""
    path = folder / "checkpoint" / "ablation.json"
    found = re.search(r"max_new_tokens=(\d+)", path.read_text()) if path.is_file() else None
    return int(found.group(1)) if found else None


def check_remedies(folder: str | os.PathLike, seed: int = 0,
                   cost: StepCost | None = None, update: str = "logged") -> RemedyCheck:
    """Predict each remedy variant's end-to-end speedup in the notebook 11 run folder
    ``folder`` from its baseline of ``seed`` (module docstring), beside the measured one.
    ``cost``: the step costs (None: calibrated on the baseline's timelines); ``update``:
    ``"logged"`` or ``"padded"`` (module docstring, step 3). Variants the
    model does not hold (``async``, TLT's, Seer's, ``tlt+<remedy>``) are left out of the
    table."""
    folder = Path(folder)
    update = check_choice("update", update, UPDATES)
    base = [Timeline.load(p) for p in _baseline_steps(folder, seed)]
    if not (folder / "history.csv").is_file():
        raise ValueError(f"no history.csv in {str(folder)!r}; accepted: a run folder of "
                         "notebook 11")
    h = pd.read_csv(folder / "history.csv")
    h = h[h["seed"] == seed]
    variants = [v for v in REMEDY_MODELS if v in set(h["variant"])]
    if not variants:
        raise ValueError(f"no remedy variant of {list(REMEDY_MODELS)} in {str(folder)!r}'s "
                         f"history; its variants: {sorted(set(h['variant']))}")
    cost = cost if cost is not None else StepCost.from_timelines(base)    # 1) calibrate
    caps = {inferred_max_batch(t) for t in base} - {None}
    steps = remedy_steps([groups_of_timeline(t) for t in base], base[0].num_workers, cost,
                         _max_new_tokens(folder), max(caps) if caps else None,
                         variants)                                          # 2) replay
    h = h.set_index(["variant", "step"])
    n = len(base)
    logged = h.loc["baseline", "update_sim_s"].to_numpy()[:n]               # 3) the update
    of = {name: r.reset_index(drop=True) for name, r in steps.groupby("remedy")}
    _, slope = update_fit(padded_work(of["plain"]), logged)
    charge = (lambda r: logged) if update == "logged" else (lambda r: stale_update(
        np.maximum(logged + slope * (padded_work(r) - padded_work(of["plain"])), 0.0),
        r["offpolicy_token_share"]))
    plain = of["plain"]["rollout_s"].to_numpy()
    rows = []
    for v in variants:                                                      # 4) the ratios
        mine = of[v]["rollout_s"].to_numpy()
        measured = float(h.loc["baseline", "step_s"].to_numpy()[:n].sum()
                         / h.loc[v, "step_s"].to_numpy()[:n].sum())
        predicted = float((plain + charge(of["plain"])).sum() / (mine + charge(of[v])).sum())
        rollout_measured = float(h.loc["baseline", "rollout_s"].to_numpy()[:n].sum()
                                 / h.loc[v, "rollout_s"].to_numpy()[:n].sum())
        rollout_predicted = float(plain.sum() / mine.sum())
        rows.append({"variant": v, "predicted": predicted, "measured": measured,
                     "error": predicted / measured - 1, "rollout_predicted": rollout_predicted,
                     "rollout_measured": rollout_measured,
                     "rollout_error": rollout_predicted / rollout_measured - 1})
    return RemedyCheck(pd.DataFrame(rows), steps, seed, update)


def remedy_check_metrics(folder: str | os.PathLike, variants, seed: int = 0,
                         update: str = "logged") -> dict[str, float]:
    """:meth:`RemedyCheck.metrics` of :func:`check_remedies` where the run's ``variants``
    hold the baseline and a remedy the model holds; ``{}`` (nothing read) where they do not."""
    if "baseline" not in variants or not set(REMEDY_MODELS) & set(variants):
        return {}
    return check_remedies(folder, seed, update=update).metrics()
