"""What a staleness run answers once its steps are done: the by-product drafter, and the
flat metrics of its tables.

- :func:`byproduct`: the adaptive drafter after RL against the frozen one, with the final
  policy on held-out prompts (``rl.export.probe_acceptance``: same prompts, engine and
  draws, the rows differ in the drafter only).
- :func:`sibling_speedups`: the sibling drafter's SD speedup at batch 1 and 32 on the next
  step's prompt groups, measured as ``sd_sweep`` measures (``rl.acceptance.group_speedups``).
- :class:`FinalConfig`: the arguments of those end-of-run measures, checked when built (so a
  notebook refuses a bad one before its run starts).
- :func:`tau_change`: how far a drafter's tau moved over the run, against the step-to-step
  noise: the mean of the last ``window`` steps minus the mean of the first ``window``, with
  a 95% interval from each window's spread over its steps (normal approximation).
- :func:`tau_per_step`: every drafter's tau per RL step, with the suffix drafter's lead over
  the sibling drafter's on the same rollouts (:func:`paired_difference`: the mean of per-step
  differences, with a 95% interval from their spread).
- :func:`staleness_metrics`: the flat scalars of ``metrics.json``, from the run's tables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ...checks import check_int, check_non_negative
from ..acceptance import group_speedups
from ..export import probe_acceptance

__all__ = ["FinalConfig", "byproduct", "sibling_speedups", "tau_change", "staleness_metrics",
           "tau_per_step", "paired_difference", "PAIRS"]

PAIRS = (("suffix", "sibling"), ("suffix", "frozen"), ("suffix", "adaptive"))
"""The drafters whose per-step tau the metrics difference (``tau_<a>_minus_<b>``): the suffix
drafter against the sibling drafter and against the EAGLE heads, pre-RL and TLT's."""


@dataclass(frozen=True)
class FinalConfig:
    """The end-of-run measures' arguments.

    Args:
        probe_prompts: held-out prompts of the by-product (the run's first ones; all of them
            when it has fewer).
        temperatures: the by-product's temperatures (None: greedy and the run's).
        max_batch_size: rows decoded together in the by-product.
        speedup_groups: prompt groups (of G samples) of the sibling drafter's speedup.
        speedup_batch_sizes: the batch sizes it is measured at.
        speedup_repeats: its repeats (at least 3: the median of per-repeat ratios).
    """

    probe_prompts: int = 64
    temperatures: tuple | None = None
    max_batch_size: int = 16
    speedup_groups: int = 2
    speedup_batch_sizes: tuple = (1, 32)
    speedup_repeats: int = 3

    def __post_init__(self):
        for name in ("probe_prompts", "max_batch_size", "speedup_groups"):
            check_int(f"FinalConfig.{name}", getattr(self, name), 1)
        check_int("FinalConfig.speedup_repeats", self.speedup_repeats, 3)
        if self.temperatures is not None:
            object.__setattr__(self, "temperatures", tuple(self.temperatures))
            for t in self.temperatures:
                check_non_negative("FinalConfig.temperatures[]", t)
        object.__setattr__(self, "speedup_batch_sizes", tuple(self.speedup_batch_sizes))
        if not self.speedup_batch_sizes:
            raise ValueError("FinalConfig.speedup_batch_sizes is empty; accepted: a list of "
                             "integers >= 1, e.g. [1, 32]")
        for bs in self.speedup_batch_sizes:
            check_int("FinalConfig.speedup_batch_sizes[]", bs, 1)


def byproduct(run, final: FinalConfig | None = None) -> pd.DataFrame:
    """tau of the ``frozen`` and ``adaptive`` drafters of ``run`` (a
    :class:`~workbench.rl.staleness.run.StalenessRun`) with its policy as it is now, on the
    first ``final.probe_prompts`` of its held-out problems, at ``final.temperatures``; one
    row per drafter and temperature (``probe_acceptance``'s columns)."""
    final = final if final is not None else FinalConfig()
    missing = [d for d in ("frozen", "adaptive") if d not in run.drafters]
    if missing:
        raise ValueError(f"the by-product compares the frozen and adaptive drafters; this run "
                         f"measured {list(run.drafters)} (no {missing})")
    if run.held_out is None:
        raise ValueError("the by-product is measured on held-out prompts; this run has none")
    prompts = [p.prompt for p in run.held_out[:final.probe_prompts]]
    rollout = run.config.grpo.rollout
    temperatures = final.temperatures or (0.0, rollout.temperature)
    drafters = {name: run.drafters[name].drafter for name in ("frozen", "adaptive")}
    return probe_acceptance(run.policy, run.tokenizer, drafters, prompts, k=rollout.spec_k,
                            temperatures=tuple(dict.fromkeys(temperatures)),
                            max_new_tokens=rollout.max_new_tokens,
                            max_batch_size=final.max_batch_size, seed=rollout.seed)


def sibling_speedups(run, final: FinalConfig | None = None) -> pd.DataFrame:
    """The ``sibling`` drafter's SD speedup over plain decoding, one row per batch size of
    ``final.speedup_batch_sizes`` (``rl.acceptance.group_speedups``'s columns): the next RL
    step's first ``final.speedup_groups`` prompt groups, G samples each with that step's
    coupled draws, the policy as it is now and the memory of every step run, on one worker
    (so a row's siblings are there)."""
    final = final if final is not None else FinalConfig()
    if "sibling" not in run.drafters:
        raise ValueError(f"this run measured {list(run.drafters)}, not the sibling drafter")
    problems = run.grpo.problems_for(run.rl_step)[:final.speedup_groups]
    return group_speedups(run.measurer, run.drafters["sibling"].drafter,
                          [p.prompt for p in problems], run.config.grpo.rollout,
                          run.config.grpo.rollout.spec_k, final.speedup_batch_sizes,
                          final.speedup_repeats, rl_step=run.rl_step)


def tau_change(tau: pd.Series, window: int | None = None) -> tuple[float, float]:
    """``(change, ci95)``: the mean of the last ``window`` values of ``tau`` (one per RL step)
    minus the mean of the first ``window`` (default: a tenth of the steps, at least 1), and
    the half-width of its 95% interval, ``1.96 * sqrt(s_first^2 / w + s_last^2 / w)`` with
    each window's sample standard deviation (NaN for a window of one step)."""
    tau = pd.Series(tau, dtype=float).reset_index(drop=True)
    window = check_int("window", window, 1, optional=True) or max(1, len(tau) // 10)
    window = min(window, len(tau))
    first, last = tau.iloc[:window], tau.iloc[-window:]
    change = float(last.mean() - first.mean())
    if window < 2:
        return change, float("nan")
    return change, 1.96 * math.sqrt(first.var() / window + last.var() / window)


def paired_difference(a: pd.Series, b: pd.Series) -> tuple[float, float]:
    """``(mean, ci95)`` of ``a - b`` step by step (two drafters' tau on the same rollouts, so
    the prompts' own difficulty cancels): the mean difference and the half-width of its 95%
    interval, ``1.96 * sd / sqrt(steps)`` (NaN for one step)."""
    diff = (pd.Series(a, dtype=float).reset_index(drop=True)
            - pd.Series(b, dtype=float).reset_index(drop=True))
    if len(diff) < 2:
        return float(diff.mean()), float("nan")
    return float(diff.mean()), 1.96 * float(diff.std()) / math.sqrt(len(diff))


def tau_per_step(history: pd.DataFrame) -> pd.DataFrame:
    """``step`` and every drafter's ``tau_<drafter>`` per RL step, and ``<a>_minus_<b>`` for
    each of :data:`PAIRS` the run measured (both on the step's same rollouts)."""
    taus = [c for c in history.columns if c.startswith("tau_")]
    out = history[["step", *taus]].reset_index(drop=True)
    for a, b in PAIRS:
        if f"tau_{a}" in out and f"tau_{b}" in out:
            out[f"{a}_minus_{b}"] = out[f"tau_{a}"] - out[f"tau_{b}"]
    return out


def _pair_metrics(history: pd.DataFrame) -> dict:
    """``tau_<a>_minus_<b>``, its ``_ci95`` and ``tau_<a>_above_<b>_share`` for each pair of
    :data:`PAIRS` in ``history``."""
    out = {}
    for a, b in PAIRS:
        if f"tau_{a}" in history and f"tau_{b}" in history:
            ta, tb = history[f"tau_{a}"], history[f"tau_{b}"]
            diff, ci = paired_difference(ta, tb)
            out.update({f"tau_{a}_minus_{b}": diff, f"tau_{a}_minus_{b}_ci95": ci,
                        f"tau_{a}_above_{b}_share": float((ta > tb).mean())})
    return out


def staleness_metrics(history: pd.DataFrame, evals: pd.DataFrame | None = None,
                      byproduct_table: pd.DataFrame | None = None,
                      speedups: pd.DataFrame | None = None, temperature: float = 1.0) -> dict:
    """The run's flat scalars: ``rl_steps``, ``kl_final``, ``kl_max``; per drafter ``d``
    measured (a ``tau_<d>`` column): ``tau_<d>_first`` and ``_final``, the means of its first
    and last ``tau_window`` steps (:func:`tau_change`'s windows, a tenth of the run: one
    step's tau on a few prompt groups moves by more than the drift, ~0.13 sd against
    0.1-0.2 over 400 steps, so ``_change`` = ``_final`` - ``_first``), ``_mean``,
    ``_change`` and ``_change_ci95`` (:func:`tau_change`) and ``diverged_<d>`` (rows in all); the
    adaptive drafter's ``adaptive_steps_mean``; the ceiling's ``ceiling_steps_mean`` and
    ``ceiling_converged_share``; with ``evals``, ``accuracy_start`` and ``accuracy_final``;
    with the by-product table, ``tau_byproduct_frozen``, ``tau_byproduct_adaptive`` and
    ``byproduct_gain`` (adaptive minus frozen) at ``temperature``; with the sibling drafter's
    speedups (:func:`sibling_speedups`), per batch size ``b``: ``sibling_speedup_bs<b>`` (and
    ``_min``, ``_max``, ``_spread_wide``) and ``sibling_tau_bs<b>``, and
    ``sibling_speedup_disturbed_share`` (their timed repeats other work disturbed); for each
    pair ``(a, b)`` of :data:`PAIRS` measured, ``tau_<a>_minus_<b>`` and ``_ci95``
    (:func:`paired_difference` over every step) and ``tau_<a>_above_<b>_share`` (the share of
    steps where ``a``'s tau is the higher)."""
    if not len(history):
        raise ValueError("the history is empty: run at least one RL step")
    window = max(1, len(history) // 10)
    out = {"rl_steps": len(history), "kl_final": float(history["kl_start"].iloc[-1]),
           "kl_max": float(history["kl_start"].max()), "tau_window": window}
    for column in [c for c in history.columns if c.startswith("tau_")]:
        tau = history[column]
        change, ci = tau_change(tau, window)
        out.update({f"{column}_first": float(tau.iloc[:window].mean()),
                    f"{column}_final": float(tau.iloc[-window:].mean()),
                    f"{column}_mean": float(tau.mean()), f"{column}_change": change,
                    f"{column}_change_ci95": ci})
        diverged = "diverged_" + column.removeprefix("tau_")
        out[diverged] = int(history[diverged].sum()) if diverged in history else 0
    out.update(_pair_metrics(history))
    if "adaptive_steps" in history:
        out["adaptive_steps_mean"] = float(history["adaptive_steps"].mean())
    if "ceiling_steps" in history:
        out["ceiling_steps_mean"] = float(history["ceiling_steps"].mean())
        out["ceiling_converged_share"] = float(history["ceiling_converged"].mean())
    if evals is not None and len(evals):
        out["accuracy_start"] = float(evals["accuracy"].iloc[0])
        out["accuracy_final"] = float(evals["accuracy"].iloc[-1])
    if byproduct_table is not None:
        at = byproduct_table[byproduct_table["temperature"] == temperature]
        tau = at.set_index("drafter")["acceptance_length"]
        if not {"frozen", "adaptive"} <= set(tau.index):
            raise ValueError(f"the by-product table has no frozen and adaptive rows at "
                             f"temperature {temperature}; temperatures: "
                             f"{sorted(byproduct_table['temperature'].unique())}")
        out.update(tau_byproduct_frozen=float(tau["frozen"]),
                   tau_byproduct_adaptive=float(tau["adaptive"]),
                   byproduct_gain=float(tau["adaptive"] - tau["frozen"]))
    for r in (speedups.itertuples() if speedups is not None else ()):
        key = f"sibling_speedup_bs{r.batch_size}"
        out.update({key: r.speedup, f"{key}_min": r.speedup_min, f"{key}_max": r.speedup_max,
                    f"{key}_spread_wide": bool(r.spread_wide),
                    f"sibling_tau_bs{r.batch_size}": r.tau})
    if speedups is not None and "disturbed_share" in speedups and len(speedups):
        out["sibling_speedup_disturbed_share"] = float(speedups["disturbed_share"].mean())
    return out
