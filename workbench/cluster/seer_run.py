"""Seer's question asked of one finished notebook 11 run: the simulator's answer to "Seer's
scheduling, TLT, or both?" at larger N from this run's own baseline, and the replay check of
this run's own Seer variants (``seer_check.check_seer``), as metrics and as lines to read.

Why: notebook 10 answers the question from its own calibration runs; notebook 11 *measures*
Seer's variants and TLT beside them on this machine at its N. What the simulator says at N =
64 and 1024 is worth what its replay of the measured Seer runs gets right, so the two go
together, from the same run folder.

The what-if (:func:`run_whatif`): the lengths are the baseline's requests of every seed and
step (one group per prompt of a step), the step costs the baseline's plain steps with TLT's
speculative ones (``tlt``'s timelines, else the first ``tlt+<v>``'s: without them TLT's
settings are plain, and the answer says so), the workers equally fast (no ``spread``: the
workers of a run here are slices of the same cores, so their spread is the machine's load,
as ``check_seer`` replays them too), and the run's shape: its requests per worker, its
batch cap (the rows a worker decoded at once, ``remedies.inferred_max_batch``, else
``max_batch_size`` in ``ablation.json``), its group size, and each step's update the
baseline's mean logged ``update_sim_s`` (the update per worker of ``per_worker`` requests:
the same at every N). Then ``seer_table.seer_whatif`` at the run's N and the asked N.

The check (:func:`seer_checks`): ``check_seer`` of each Seer variant of the run, every seed
whose baseline ran; each figure the median over seeds with its min and max.

A run whose baseline, or whose Seer variants, did not run gives no such metrics and no lines
(:meth:`SeerRun.metrics` is ``{}``): nothing is read that is not there.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..rollout.timeline import Timeline
from .cost import StepCost
from .importers import trace_from_timeline
from .remedies import inferred_max_batch
from .seer_check import SEER_POLICIES, _from_ablation, check_seer, saved_steps
from .seer_table import seer_answer, seer_whatif
from .trace import Trace

__all__ = ["SeerRun", "seer_run", "run_whatif", "seer_checks", "WHATIF_NAMES", "TARGET_ERROR"]

WHATIF_NAMES = {"tlt": "tlt", "seer_schedule": "seer_schedule", "seer_divided": "seer_divided",
                "tlt+seer_divided": "both"}
"""The what-if's settings (``seer_table.SEER_SETTINGS`` but the static plain layout, which
the speedups are over) as the metrics name them: ``both`` is TLT with Seer's divided rollout
(a result's figure names take no ``+``)."""
TARGET_ERROR = 0.10
"""The issue's bound on the simulator's error on the Seer variants' held-out runs (sim clock)."""


def _timelines(folder: Path, variant: str, seeds) -> dict[int, list[Timeline]]:
    """``variant``'s saved step timelines per seed of ``seeds`` that has them."""
    out = {}
    for s in seeds:
        try:
            out[int(s)] = [Timeline.load(p) for p in saved_steps(folder, variant, int(s))]
        except ValueError:
            continue
    return out


def _group_size(timelines: list[Timeline]) -> int:
    """The requests per prompt of a step (the run's G): the most common group size."""
    sizes = pd.concat([t.requests.groupby("prompt_id").size() for t in timelines])
    return int(sizes.mode().iloc[0])


def _update_s(folder: Path, history: pd.DataFrame | None) -> float:
    """The baseline's mean logged update per step on the sim clock, from ``history`` (None:
    the folder's ``history.csv``); 0 where neither holds it."""
    path = folder / "history.csv"
    if history is None and path.is_file():
        history = pd.read_csv(path)
    if history is None or "update_sim_s" not in history or "variant" not in history:
        return 0.0
    base = history.loc[history["variant"] == "baseline", "update_sim_s"]
    return float(base.mean()) if len(base) else 0.0


def run_whatif(folder: str | os.PathLike, variants, seeds=(0,), workers=(64, 1024),
               draws: int = 4, seed: int = 0, predictor: str = "siblings",
               history: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """``seer_whatif`` from the run folder ``folder``'s baseline (module docstring) at the
    run's N and every N of ``workers``; one row per N, with ``per_worker``, ``max_batch``,
    ``samples_per_prompt`` and ``sd_costs`` (whether TLT's speculative steps were measured).
    ``history``: the run's history (None: ``folder/history.csv``), for the baseline's update.
    None where the run's ``variants`` lack the baseline or its timelines are not saved."""
    folder = Path(folder)
    if "baseline" not in variants:
        return None
    base = [t for ts in _timelines(folder, "baseline", seeds).values() for t in ts]
    if not base:
        return None
    tlt = next((v for v in ("tlt", *[v for v in variants if str(v).startswith("tlt+")])
                if v in variants), None)
    sd = [t for ts in _timelines(folder, tlt, seeds).values() for t in ts] if tlt else []
    cost = StepCost.from_timelines(base + sd)
    parts = [trace_from_timeline(t).requests.drop(columns="worker") for t in base]
    lengths = Trace(pd.concat([r.assign(group=f"{i}/" + r["group"]) for i, r in enumerate(parts)],
                              ignore_index=True))
    n = base[0].num_workers
    per_worker = math.ceil(len(base[0].requests) / n)
    caps = {inferred_max_batch(t) for t in base} - {None}
    cap = max(caps) if caps else _from_ablation(folder, "max_batch_size")
    G, update = _group_size(base), _update_s(folder, history)
    table = seer_whatif(lengths, cost, per_worker, cap, sorted({n, *workers}),
                        samples_per_prompt=G, predictor=predictor, update=update,
                        seed=seed, draws=draws)
    return table.assign(per_worker=per_worker, max_batch=cap if cap else np.nan,
                        samples_per_prompt=G, run_workers=n, sd_costs=len(cost.arms) > 1)


def seer_checks(folder: str | os.PathLike, variants, seeds=(0,)) -> pd.DataFrame:
    """``check_seer`` of each Seer variant of the run's ``variants`` for every seed of
    ``seeds`` whose baseline and variant timelines are saved: one row per variant and seed
    (``error``, ``predicted_speedup``, ``measured_speedup``, ``disturbed_share``, ``steps``);
    empty where there is nothing to check."""
    folder = Path(folder)
    rows = []
    if "baseline" in variants:
        for s in seeds:
            try:
                base = [Timeline.load(p) for p in saved_steps(folder, "baseline", int(s))]
            except ValueError:
                continue
            for v in [v for v in SEER_POLICIES if v in variants]:
                try:
                    saved_steps(folder, v, int(s))
                except ValueError:
                    continue
                c = check_seer(folder, v, int(s), samples_per_prompt=_group_size(base))
                rows.append({"variant": v, "seed": int(s), "error": c.error,
                             "predicted_speedup": c.predicted_speedup,
                             "measured_speedup": c.measured_speedup,
                             "disturbed_share": float(c.steps["disturbed_share"].mean()),
                             "steps": len(c.steps)})
    return pd.DataFrame(rows, columns=["variant", "seed", "error", "predicted_speedup",
                                       "measured_speedup", "disturbed_share", "steps"])


@dataclass(frozen=True)
class SeerRun:
    """A run's what-if table (:func:`run_whatif`; None: no baseline to draw from) and its
    replay checks (:func:`seer_checks`: one row per Seer variant and seed; empty: none ran)."""

    whatif: pd.DataFrame | None
    checks: pd.DataFrame

    def metrics(self) -> dict[str, float]:
        """``seer_whatif_speedup_<setting>_n<N>`` (over the static plain step, update
        included; the settings as :data:`WHATIF_NAMES` names them),
        ``seer_whatif_tlt_beside_seer_n<N>`` (both over Seer's divided rollout alone) and
        ``seer_whatif_moves_n<N>`` at the run's N and each asked N; per Seer variant
        ``seer_sim_error_<v>``, ``seer_predicted_rollout_speedup_<v>``,
        ``seer_measured_rollout_speedup_<v>`` and ``seer_check_disturbed_share_<v>``, each
        the median over seeds with ``_min``, ``_max`` and ``_n``."""
        out = {}
        if self.whatif is not None:
            for _, r in self.whatif.iterrows():
                n = int(r["workers"])
                for k, name in WHATIF_NAMES.items():
                    out[f"seer_whatif_speedup_{name}_n{n}"] = float(r[f"speedup_{k}"])
                out[f"seer_whatif_tlt_beside_seer_n{n}"] = float(
                    r["speedup_tlt+seer_divided"] / r["speedup_seer_divided"])
                out[f"seer_whatif_moves_n{n}"] = float(r["moves"])
        names = {"error": "seer_sim_error_{}", "predicted_speedup":
                 "seer_predicted_rollout_speedup_{}", "measured_speedup":
                 "seer_measured_rollout_speedup_{}", "disturbed_share":
                 "seer_check_disturbed_share_{}"}
        for v, g in self.checks.groupby("variant", sort=False):
            for col, name in names.items():
                key = name.format(v)
                out.update({key: float(g[col].median()), f"{key}_min": float(g[col].min()),
                            f"{key}_max": float(g[col].max()), f"{key}_n": int(len(g))})
        return out

    def lines(self) -> list[str]:
        """The reading: the replay check's error against the 10% target, then the
        simulator's answer at the run's N and each asked N (``seer_answer``), from the
        numbers alone; no lines for what did not run."""
        lines = []
        for v, g in self.checks.groupby("variant", sort=False):
            e, p, m = g["error"], g["predicted_speedup"], g["measured_speedup"]
            verdict = "within" if e.abs().max() <= TARGET_ERROR else "beyond"
            lines.append(
                f"The simulator on this run's {v} (replayed from its own lengths, costs from "
                f"the baseline alone): summed makespans {e.median():+.1%} off the measured "
                f"(median over {len(g)} seed(s), {e.min():+.1%} to {e.max():+.1%}: {verdict} "
                f"the {TARGET_ERROR:.0%} target); rollout speedup over the baseline predicted "
                f"{p.median():.2f}x, measured {m.median():.2f}x; "
                f"{g['disturbed_share'].median():.0%} of its steps' seconds disturbed.")
        if self.whatif is None:
            return lines
        r = self.whatif.iloc[0]
        cap = "no cap" if pd.isna(r["max_batch"]) else f"at most {int(r['max_batch'])} rows"
        sd = ("TLT's costs from its own steps here" if r["sd_costs"] else
              "no speculative step measured here, so TLT's settings decode plain")
        lines.append(f"The simulator's answer from this run's baseline ({int(r['per_worker'])} "
                     f"requests per worker, {cap} at once, groups of "
                     f"{int(r['samples_per_prompt'])}; {sd}; speedups of the step, update "
                     "included):")
        lines += ["  " + seer_answer(self.whatif, int(n)) for n in self.whatif["workers"]]
        return lines


def seer_run(folder: str | os.PathLike, variants, seeds=(0,), workers=(64, 1024),
             draws: int = 4, seed: int = 0, history: pd.DataFrame | None = None) -> SeerRun:
    """:func:`run_whatif` and :func:`seer_checks` of the run folder ``folder`` (notebook
    11's ``out_dir``, its ``checkpoint_dir``, or any folder ``seer_check.saved_steps``
    reads); ``history``: the run's history where ``folder`` holds no ``history.csv``."""
    return SeerRun(run_whatif(folder, variants, seeds, workers, draws, seed, history=history),
                   seer_checks(folder, variants, seeds))
