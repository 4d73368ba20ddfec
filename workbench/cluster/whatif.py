"""What-ifs at cluster scale: one RL step predicted at every N of a sweep, and at one setting
of notebook 10's explorer (length tail, N, threshold, drafter tau).

Why: the step costs come from a few workers here; the question is what TLT buys at 8 to 1024
workers. The lengths come from a recorded trace (whole groups drawn with replacement) or a
fitted ``LengthModel``; the costs, update and stragglers from the calibration.
"""
from __future__ import annotations

import time

import pandas as pd

from ..checks import check_int, check_positive
from .cost import StepCost, UpdateCost
from .fit import LengthModel, layout_from_model
from .simulate import Layout, Prediction, layout, simulate
from .trace import Trace

__all__ = ["SCALING_WORKERS", "with_tau", "lengths_layout", "scaling_table", "scaling_metrics",
           "simulate_seconds", "whatif_prediction"]

SCALING_WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
"""The worker counts N of the scaling sweep (`scaling_table`)."""


def with_tau(cost: StepCost, strategy: str, tau: float) -> StepCost:
    """``cost`` with ``strategy``'s tokens per row per step set to ``tau`` at every batch
    size (a better or worse drafter at the same step time)."""
    tau = check_positive("tau", tau)
    cost.seconds(strategy, [1])  # names an unmeasured strategy
    table = cost.table.copy()
    table.loc[table["kind"] == strategy, "tau"] = tau
    return StepCost(table)


def lengths_layout(source: Trace | LengthModel, workers: int, per_worker: int,
                   seed: int = 0) -> Layout:
    """``workers`` x ``per_worker`` requests: whole groups of a recorded trace (``layout``) or
    draws of a fitted model (``layout_from_model``), seeded."""
    if isinstance(source, LengthModel):
        return layout_from_model(source, workers, per_worker, seed=seed)
    return layout(source, workers, per_worker, seed)


def scaling_table(source: Trace | LengthModel, cost: StepCost, per_worker: int,
                  workers=SCALING_WORKERS, threshold: int = 0, strategy: str | None = None,
                  update: float | UpdateCost = 0.0, drafter_step_s: float | None = None,
                  spread: float = 0.0, seed: int = 0, draws: int = 1) -> pd.DataFrame:
    """One row per N of ``workers``: ``Prediction.summary()`` of the step (plain, threshold
    rule, bandit's limit), each figure the mean over ``draws`` steps (seeds ``seed``,
    ``seed + 1``, ...: their layouts and workers' speeds), and ``sim_seconds``, the mean
    seconds one step took to simulate. One draw is one step's luck: which long requests it
    drew and where the slow workers fell."""
    draws = check_int("draws", draws, 1)
    rows = []
    for n in workers:
        n = check_int("workers", n, 1)
        summaries = []
        for s in range(seed, seed + draws):
            started = time.perf_counter()
            p = simulate(lengths_layout(source, n, per_worker, s), cost, threshold=threshold,
                         strategy=strategy, update_s=update, drafter_step_s=drafter_step_s,
                         seed=s, bandit=True, spread=spread)
            summaries.append({**p.summary(), "sim_seconds": time.perf_counter() - started})
        mean = pd.DataFrame(summaries).mean()
        rows.append({**mean.to_dict(), "workers": n, "requests": n * per_worker,
                     "draws": draws, **_speedups(mean)})
    return pd.DataFrame(rows)


def _speedups(mean: pd.Series) -> dict[str, float]:
    """The speedups of mean times (docs/design.md: a sum of step times over another), not
    the mean of each draw's ratio."""
    return {"sd_speedup": mean["makespan_plain_s"] / mean["makespan_tlt_s"],
            "e2e_speedup": mean["step_s_plain"] / mean["step_s_tlt"],
            "sd_speedup_bandit": mean["makespan_plain_s"] / mean["makespan_bandit_s"]}


def scaling_metrics(scaling: pd.DataFrame, workers: int = 64) -> dict[str, float]:
    """notebook 10's figures at ``workers`` (a row of ``scaling``): TLT's predicted end-to-end
    and rollout speedups (threshold rule and bandit's limit) and the plain idle fraction,
    keyed ``..._{workers}``."""
    rows = scaling[scaling["workers"] == workers]
    if len(rows) != 1:
        raise ValueError(f"the sweep has no row at N={workers}; its N: "
                         f"{scaling['workers'].tolist()}")
    r = rows.iloc[0]
    bandit_e2e = r["step_s_plain"] / (r["makespan_bandit_s"] + r["update_s"])
    return {f"predicted_speedup_{workers}": float(r["e2e_speedup"]),
            f"predicted_rollout_speedup_{workers}": float(r["sd_speedup"]),
            f"predicted_speedup_bandit_{workers}": float(bandit_e2e),
            f"predicted_idle_fraction_{workers}": float(r["idle_fraction_plain"]),
            f"predicted_step_s_{workers}": float(r["step_s_plain"])}


def simulate_seconds(source: Trace | LengthModel, cost: StepCost, workers: int = 1024,
                     per_worker: int = 64, **settings) -> float:
    """Seconds to lay out and simulate one step of ``workers`` x ``per_worker`` (plain,
    threshold rule and bandit), ``settings`` as ``scaling_table``'s."""
    return float(scaling_table(source, cost, per_worker, [workers], **settings)
                 ["sim_seconds"].iloc[0])


def whatif_prediction(model: LengthModel, cost: StepCost, strategy: str, tail: float,
                      workers: int, per_worker: int, threshold: int, tau: float,
                      update: float | UpdateCost = 0.0, drafter_step_s: float | None = None,
                      spread: float = 0.0, seed: int = 0) -> Prediction:
    """One step at one setting: lengths from ``model`` with its tail parameter at ``tail``
    (``LengthModel.with_tail``), ``workers`` x ``per_worker``, ``strategy`` below batch
    ``threshold`` with ``tau`` tokens per row per step (the bandit's limit at that tau too)."""
    lay = layout_from_model(model.with_tail(tail), workers, per_worker, seed=seed)
    return simulate(lay, with_tau(cost, strategy, tau), threshold=threshold, strategy=strategy,
                    update_s=update, drafter_step_s=drafter_step_s, seed=seed, bandit=True,
                    spread=spread)
