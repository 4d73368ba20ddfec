"""The workbench's own runs, read into a ``StepLog``: a run folder of notebook 04 or 11, or an
ablation's checkpoint folder.

- ``workbench``: a run folder of notebook 04 or 11 (``history.csv``: ``rollout_s``,
  ``update_sim_s``, ``step_s``, ``response_len``, ``response_len_max`` per variant, seed and
  step; the rollouts' saved timelines under ``timelines/<variant>-seed<seed>/step<NN>``).
An ablation's ``checkpoint_dir`` (``ablation.json``) holds each run's saved timelines under
``<variant>-seed<seed>/timelines/step<NNNN>`` alone.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from ..rollout.timeline import Timeline
from .log_rows import bad_logs
from .steplog import StepLog, finish_steps

__all__ = ["read_workbench", "RUN_TIMELINES", "CHECKPOINT_TIMELINES", "RUN_CHECKPOINT_TIMELINES"]

RUN_TIMELINES = "timelines/{variant}-seed{seed}"         # a run folder's saved timelines
CHECKPOINT_TIMELINES = "{variant}-seed{seed}/timelines"  # an ablation checkpoint_dir's
RUN_CHECKPOINT_TIMELINES = "checkpoint/" + CHECKPOINT_TIMELINES  # a run folder's checkpoint's


def read_workbench(folder: str | os.PathLike, variant: str = "baseline",
                   seed: int | None = None) -> StepLog:
    """A run folder of notebook 04 or 11 (``history.csv``; the saved timelines where there
    are some): ``variant``'s steps of ``seed`` (default: the first seed whose timelines are
    saved, else the first in the history). Its ``extra`` holds the whole history, so the
    diagnosis can set each variant's measured speedup beside its prediction."""
    folder = Path(folder)
    history = folder / "history.csv"
    if not history.is_file():
        if (folder / "ablation.json").is_file():
            return _read_checkpoint(folder, variant, seed)
        raise bad_logs(folder, "no history.csv in it (notebook 04 or 11 writes one into "
                       "out_dir) and no ablation.json (an ablation's checkpoint_dir)", "workbench")
    h = pd.read_csv(history)
    if variant not in set(h.get("variant", [])):
        raise ValueError(f"variant {variant!r} is not in {str(history)!r}; its variants: "
                         f"{sorted(set(h.get('variant', [])))}")
    saved = (sorted(folder.glob(f"timelines/{variant}-seed*"))
             or [p.parent for p in sorted(folder.glob(f"checkpoint/{variant}-seed*/timelines"))])
    if seed is None:
        seeds = [int(p.name.rsplit("seed", 1)[1]) for p in saved] or sorted(h["seed"].unique())
        seed = int(seeds[0])
    mine = h[(h["variant"] == variant) & (h["seed"] == seed)]
    if not len(mine):
        raise ValueError(f"no steps of {variant!r} seed {seed} in {str(history)!r}; its seeds: "
                         f"{sorted(h.loc[h['variant'] == variant, 'seed'].unique().tolist())}")
    update = mine["update_sim_s"] if "update_sim_s" in mine else mine["update_s"]
    steps = pd.DataFrame({"step": mine["step"].to_numpy(), "rollout_s": mine["rollout_s"].to_numpy(),
                          "reward_s": np.nan, "logprob_s": np.nan,
                          "update_s": update.to_numpy(), "step_s": mine["step_s"].to_numpy(),
                          "response_mean": _column(mine, "response_len"),
                          "response_max": _column(mine, "response_len_max"),
                          "response_min": np.nan})
    missing = {"reward_s": "the workbench's history counts the reward inside the rollout",
               "logprob_s": "the workbench's history counts log-probs inside the update",
               "response_min": "response_len_min (not in history.csv)"}
    where_to = RUN_TIMELINES
    if not (folder / RUN_TIMELINES.format(variant=variant, seed=seed)).is_dir():
        where_to = RUN_CHECKPOINT_TIMELINES  # a run that saved them in its checkpoint alone
    log = StepLog(finish_steps(steps), "workbench", f"run folder {str(folder)!r}", missing=missing,
                  extra={"history": h, "variant": variant, "seed": seed, "folder": folder,
                         "timeline_dir": where_to})
    if {"drafter_train_s", "drafter_steps"} <= set(h) and h["drafter_steps"].sum() > 0:
        log.extra["drafter_step_s"] = float(h["drafter_train_s"].sum() / h["drafter_steps"].sum())
        log.notes.append(f"a drafter step takes {log.extra['drafter_step_s']:.4g} s "
                         "(drafter_train_s / drafter_steps of the history)")
    where = folder / where_to.format(variant=variant, seed=seed)
    if where.is_dir():
        log.timelines = sorted(where.glob("step*"))
        log.notes.append(f"per-request lengths and workers from {len(log.timelines)} saved "
                         f"timelines under {str(where)!r}")
    else:
        missing["requests"] = f"saved timelines under {str(where)!r}"
    return log


def _read_checkpoint(folder: Path, variant: str, seed: int | None) -> StepLog:
    """An ablation's ``checkpoint_dir`` (``ablation.json``; each run's saved timelines under
    ``<variant>-seed<seed>/timelines/step<NNNN>``): the rollouts alone, each step's makespan
    its rollout time; the update's time is in the run folder's history.csv, not here."""
    saved = sorted(folder.glob(f"{variant}-seed*/timelines"))
    if not saved:
        raise ValueError(f"no saved timelines of {variant!r} in the checkpoint folder "
                         f"{str(folder)!r}; its runs: {sorted(p.name for p in folder.glob('*-seed*'))}")
    seed = int(saved[0].parent.name.rsplit("seed", 1)[1]) if seed is None else seed
    where = folder / CHECKPOINT_TIMELINES.format(variant=variant, seed=seed)
    paths = sorted(where.glob("step*"))
    if not paths:
        raise ValueError(f"no saved timelines of {variant!r} seed {seed} under {str(where)!r}")
    rows = []
    for p in paths:
        t = Timeline.load(p)
        lengths = t.requests["response_tokens"]
        rows.append({"step": int(p.name.removeprefix("step")), "rollout_s": t.makespan_s,
                     "reward_s": np.nan, "logprob_s": np.nan, "update_s": np.nan,
                     "step_s": np.nan, "response_mean": float(lengths.mean()),
                     "response_max": float(lengths.max()), "response_min": float(lengths.min())})
    why = "the checkpoint folder holds the rollouts' timelines alone (the run folder's history.csv holds the step times)"
    missing = {"reward_s": why, "logprob_s": why, "update_s": why, "step_s": why}
    return StepLog(finish_steps(pd.DataFrame(rows)), "workbench", f"checkpoint folder {str(folder)!r}",
                   missing=missing, timelines=paths,
                   extra={"variant": variant, "seed": seed, "folder": folder,
                          "timeline_dir": CHECKPOINT_TIMELINES},
                   notes=[f"rollout times and lengths from {len(paths)} saved timelines"])


def _column(rows: pd.DataFrame, name: str):
    return rows[name].to_numpy(float) if name in rows else np.nan
