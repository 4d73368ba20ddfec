"""The dispatch model's check on a real RL run: a Seer variant's rollouts (``seer_schedule``,
``seer_divided``) replayed through ``cluster.dispatch`` from their own requests' lengths,
beside the makespans they measured on the sim clock.

Why: ``dispatch.seer_whatif`` answers "Seer's scheduling, TLT, or both?" at N workers from a
model of placement; what that answer is worth is what the model gets right where the
harness's Seer variants really ran (``rl.remedies.seer_schedule``, ``seer_divided``).

Recipe (as ``run_check`` and ``remedy_check`` do for the other variants):

1. the step costs are calibrated on the *baseline*'s timelines of the same seed (held out:
   nothing of the Seer run goes into them), the re-prefill's seconds per context token on
   its prefills (their seconds over the prompt tokens they read);
2. each saved step of the Seer variant is replayed: its requests as drawn (``prompt_id``
   order, groups of ``samples_per_prompt``), their response and prompt tokens, on its
   workers at its batch cap (``remedies.inferred_max_batch``, else the run's
   ``max_batch_size`` where ``checkpoint/ablation.json`` names it), under the variant's
   policy (``seer_schedule``: longest first, per-worker queues; ``seer_divided``: divided);
   the same requests under the static layout give the baseline's counterpart;
3. the error on the sim clock: summed predicted makespans over summed measured ones, minus
   1; and the predicted rollout speedup of the variant over the static layout of its own
   requests beside the measured one over the baseline's steps (the baseline drew the same
   prompts in the same order: coupled, the same lengths while the policies agree).

What it leaves out: the harness's online predictor (the siblings as they finish, the
prompt's history, a line on its size; here ``predictor``'s static stand-in), the noise of
each measured step (the model charges a step its curve's mean), and the first token a
re-prefill may emit.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..checks import check_choice, check_int
from ..rollout.timeline import Timeline, usage_shares
from .cost import StepCost
from .dispatch import predicted_lengths, simulate_dispatch
from .remedies import inferred_max_batch

__all__ = ["SEER_POLICIES", "SeerCheck", "check_seer", "seer_check_metrics", "saved_steps",
           "prefill_seconds_per_token"]

SEER_POLICIES = {"seer_schedule": "longest_first", "seer_divided": "divided"}
"""The Seer variants ``check_seer`` replays, each with its ``dispatch`` policy."""


@dataclass(frozen=True)
class SeerCheck:
    """``steps``: per replayed step of ``variant`` (``seed``), the measured makespan, the
    predicted one, the static layout's predicted and the baseline's measured makespans, and
    the moves measured (``moved_from`` rows) and predicted, and the share of the step's
    measured seconds that other work on the machine disturbed (``Timeline.usage_s``: a
    disturbed step's sim seconds grow, which no replay predicts)."""

    steps: pd.DataFrame
    variant: str
    seed: int

    @property
    def error(self) -> float:
        """(predicted - measured) / measured of the summed makespans on the sim clock."""
        s = self.steps
        return float(s["predicted_s"].sum() / s["measured_s"].sum() - 1)

    @property
    def predicted_speedup(self) -> float:
        """The static layout's summed predicted makespans over the variant's."""
        return float(self.steps["static_s"].sum() / self.steps["predicted_s"].sum())

    @property
    def measured_speedup(self) -> float:
        """The baseline's summed measured makespans over the variant's."""
        return float(self.steps["baseline_s"].sum() / self.steps["measured_s"].sum())

    def metrics(self) -> dict[str, float]:
        """The figures of a result file: ``seer_sim_error_<variant>`` (the makespans'), the
        predicted and measured rollout speedups over the baseline, and the replayed steps'
        mean disturbed share."""
        v = self.variant
        return {f"seer_sim_error_{v}": self.error,
                f"seer_check_disturbed_share_{v}": float(self.steps["disturbed_share"].mean()),
                f"seer_predicted_rollout_speedup_{v}": self.predicted_speedup,
                f"seer_measured_rollout_speedup_{v}_seed{self.seed}": self.measured_speedup}


def saved_steps(folder: str | os.PathLike, variant: str, seed: int) -> list[Path]:
    """The folders of ``variant``'s saved step timelines of ``seed`` in the run folder
    ``folder`` (``timelines/<variant>-seed<s>`` or ``checkpoint/<variant>-seed<s>/
    timelines``, or ``<variant>-seed<s>/timelines`` where ``folder`` is the checkpoint
    folder itself), in step order."""
    folder = Path(folder)
    for where in (folder / "timelines" / f"{variant}-seed{seed}",
                  folder / "checkpoint" / f"{variant}-seed{seed}" / "timelines",
                  folder / f"{variant}-seed{seed}" / "timelines"):
        steps = sorted(where.glob("step*")) if where.is_dir() else []
        if steps:
            return steps
    raise ValueError(f"no saved timelines of {variant!r} seed {seed} under {str(folder)!r} "
                     f"(timelines/{variant}-seed<s> or checkpoint/{variant}-seed<s>/timelines); "
                     "accepted: a run folder of notebook 11 with the baseline and the variant")


def _from_ablation(folder: Path, name: str) -> int | None:
    """``name``'s value in the run's ``ablation.json`` (the run folder's ``checkpoint/``, or
    ``folder`` itself a checkpoint folder); None where it is not there."""
    for path in (folder / "checkpoint" / "ablation.json", folder / "ablation.json"):
        if path.is_file():
            found = re.search(rf"{name}=(\d+)", path.read_text())
            return int(found.group(1)) if found else None
    return None


def prefill_seconds_per_token(timelines) -> float:
    """Prefill seconds per prompt token over ``timelines`` (fresh prefills only, not a moved
    row's re-prefill): what a re-prefill of a moved row is charged per context token."""
    seconds = tokens = 0.0
    for t in timelines:
        s = t.steps
        fresh = s[(s["kind"] == "prefill") & (s["moved_from"].isna() if "moved_from" in s
                                              else True)]
        seconds += float((fresh["end_s"] - fresh["start_s"]).sum())
        tokens += float(t.requests["prompt_tokens"].sum())
    if seconds <= 0 or tokens <= 0:
        raise ValueError("the baseline's timelines hold no prefill to charge a re-prefill by")
    return seconds / tokens


def check_seer(folder: str | os.PathLike, variant: str = "seer_divided", seed: int = 0,
               samples_per_prompt: int | None = None, predictor: str = "siblings",
               cost: StepCost | None = None) -> SeerCheck:
    """Replay ``variant``'s saved rollouts in the run folder ``folder`` (notebook 11's
    ``out_dir``, or any folder ``saved_steps`` reads) under its dispatch policy and set the
    predicted makespans beside the measured ones (module docstring). ``samples_per_prompt``:
    the group size (None: the run's, from ``checkpoint/ablation.json``, else 1); ``cost``:
    the step costs (None: calibrated on the baseline's timelines)."""
    variant = check_choice("variant", variant, tuple(SEER_POLICIES))
    folder = Path(folder)
    base = [Timeline.load(p) for p in saved_steps(folder, "baseline", seed)]
    mine = [Timeline.load(p) for p in saved_steps(folder, variant, seed)]
    G = (check_int("samples_per_prompt", samples_per_prompt, 1) if samples_per_prompt
         else _from_ablation(folder, "samples_per_prompt") or 1)
    cost = cost if cost is not None else StepCost.from_timelines(base)       # 1) calibrate
    per_token = prefill_seconds_per_token(base)
    policy = SEER_POLICIES[variant]
    rows = []
    for step, t in enumerate(mine):                                          # 2) replay
        r = t.requests.sort_values(["prompt_id", "sample_idx"], kind="stable")
        tokens = r["response_tokens"].to_numpy(np.int64)
        prompts = r["prompt_tokens"].to_numpy(float)
        groups = np.arange(len(tokens)) // G
        cap = inferred_max_batch(t) or _from_ablation(folder, "max_batch_size")
        guess = predicted_lengths(tokens, groups, predictor)
        run = simulate_dispatch(tokens, t.num_workers, cost, cap, policy, guess, prompts,
                                prefill_per_token=per_token,
                                schedule_queues=variant == "seer_schedule")
        static = simulate_dispatch(tokens, t.num_workers, cost, cap)
        moved = int(t.steps["moved_from"].notna().sum()) if "moved_from" in t.steps else 0
        rows.append({"step": step, "measured_s": t.makespan_s, "predicted_s": run.makespan,
                     "static_s": static.makespan,
                     "baseline_s": base[step].makespan_s if step < len(base) else np.nan,
                     "moves_measured": moved, "moves_predicted": run.moves,
                     "disturbed_share": usage_shares([t.usage_s()])["disturbed_share"]})
    steps = pd.DataFrame(rows)
    return SeerCheck(steps[steps["baseline_s"].notna()].reset_index(drop=True), variant, seed)


def seer_check_metrics(folder: str | os.PathLike, variants, seed: int = 0) -> dict[str, float]:
    """:meth:`SeerCheck.metrics` of :func:`check_seer` for each Seer variant among the run's
    ``variants`` where the baseline is there too; ``{}`` (nothing read) otherwise."""
    if "baseline" not in variants:
        return {}
    out = {}
    for v in SEER_POLICIES:
        if v in variants:
            out.update(check_seer(folder, v, seed).metrics())
    return out
