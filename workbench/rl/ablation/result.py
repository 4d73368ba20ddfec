"""The result of a TLT ablation (``rl.ablation.runner.run_ablation``): every run's step rows,
held-out accuracies and timelines (:class:`Ablation`), and the measures on them.

All measures follow docs/design.md: step times on the sim clock (rollout makespan of N workers,
the policy update charged as its measured time / N; drafter work runs only inside idle windows
and is preempted at their end, so it never adds to a step),
rollout fraction, end-to-end speedup (sum of baseline step times over the variant's) and its
Amdahl prediction ``1 / ((1 - f) + f / s)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ...speculative.decisions import (BANDIT_CHOICE_COLUMNS, DECIDED_COLUMNS, bandit_choices,
                                    bandit_decisions, explore_cost, plain_share)
from ..grpo import GRPO
from ..tlt import first_divergence
from ..remedies.compare import remedy_metrics

__all__ = ["Ablation", "amdahl"]


def amdahl(fraction: float, speedup: float) -> float:
    """The end-to-end speedup when a ``fraction`` of the time runs ``speedup`` times faster."""
    return 1.0 / ((1.0 - fraction) + fraction / speedup)


@dataclass
class Ablation:
    """Histories of every (variant, seed), their step timelines, and held-out accuracies."""

    history: pd.DataFrame                   # one row per variant, seed, RL step
    evals: pd.DataFrame                     # variant, seed, step, accuracy (held-out, greedy)
    trainers: dict = field(default_factory=dict)   # (variant, seed) -> its RLLoop trainer
    sim_seconds: str = "thread_cpu"         # what its sim seconds are (workbench.clock)

    def timeline(self, variant: str, seed: int, step: int):
        """The timeline of one RL step of one run."""
        return self.trainers[(variant, seed)].record.timelines[step]

    def save_timelines(self, folder, seeds=None) -> list[Path]:
        """Save every RL step's timeline of ``seeds`` (default: all) of every variant as
        ``folder/<variant>-seed<seed>/step<NN>``, so a timeline explorer can read them back
        from the run's files alone. Returns the folders written."""
        known = sorted({seed for _, seed in self.trainers})
        seeds = known if seeds is None else list(seeds)
        unknown = [s for s in seeds if s not in known]
        if unknown:
            raise ValueError(f"no runs of seed(s) {unknown}; accepted: {known}")
        records = {key: tr.record for key, tr in self.trainers.items()}
        last = max((step for r in records.values() for step in r.timelines), default=0)
        width = max(2, len(str(last)))
        return [tl.save(Path(folder) / f"{v}-seed{seed}" / f"step{step:0{width}d}")
                for (v, seed), r in records.items() if seed in seeds
                for step, tl in sorted(r.timelines.items())]

    def per_variant(self) -> pd.DataFrame:
        """Per variant: summed sim step and rollout times (over seeds and steps), final reward
        (mean and standard deviation over seeds), idle fractions, acceptance length, and the
        share of its measured seconds that other work disturbed (``GRPO.usage``)."""
        h = self.history
        last = h[h["step"] == h["step"].max()]
        g = h.groupby("variant", sort=False)
        out = pd.DataFrame({
            "step_s": g["step_s"].sum(), "rollout_s": g["rollout_s"].sum(),
            "update_sim_s": g["update_sim_s"].sum(),
            "rollout_fraction": g["rollout_s"].sum() / g["step_s"].sum(),
            "idle_fraction": g["idle_fraction"].mean(),
            "wasted_fraction": g["wasted_fraction"].mean(),
            "accept_len": g["accept_len"].mean() if "accept_len" in h else np.nan,
            "reward_final": last.groupby("variant")["reward"].mean(),
            "reward_final_sd": last.groupby("variant")["reward"].std(ddof=1),
        })
        usage = self._usage_by_variant()
        out = out.join(usage)  # disturbed_share, cpu_share (workbench.clock)
        base = out.loc["baseline"] if "baseline" in out.index else None
        if base is not None:
            out["e2e_speedup"] = base["step_s"] / out["step_s"]
            out["rollout_speedup"] = base["rollout_s"] / out["rollout_s"]
            out["amdahl_prediction"] = [amdahl(base["rollout_fraction"], s)
                                        for s in out["rollout_speedup"]]
        return out.rename_axis("variant").reset_index()

    @property
    def variants(self) -> list[str]:
        """The variants that ran, in run order."""
        return list(dict.fromkeys(v for v, _ in self.trainers)) or \
            list(self.history["variant"].unique())

    def bandit_choices(self, variant: str = "tlt") -> pd.DataFrame:
        """The bandit's choices per batch-size bucket (``speculative.decisions.bandit_choices``)
        of every step and seed of ``variant``; empty (same columns) when it did not run."""
        tables = [bandit_choices(tl) for (v, _), tr in self.trainers.items() if v == variant
                  for tl in tr.record.timelines.values()]
        if not tables:
            return pd.DataFrame({c: pd.Series(dtype=t)
                                 for c, t in BANDIT_CHOICE_COLUMNS.items()})
        return pd.concat(tables, ignore_index=True)

    def decisions(self, variant: str = "tlt") -> pd.DataFrame:
        """Every decided decode step of every step and seed of ``variant``
        (``speculative.decisions.bandit_decisions`` with a ``seed`` and an RL ``step``
        column; empty when none)."""
        tables = [bandit_decisions(tl).assign(seed=seed, step=step)
                  for (v, seed), tr in self.trainers.items() if v == variant
                  for step, tl in tr.record.timelines.items()]
        return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(
            columns=[*DECIDED_COLUMNS, "seed", "step"])

    def learned(self, variant: str = "tlt") -> pd.DataFrame:
        """What the adaptive engine of each seed of ``variant`` learned of this machine by
        the end of its run (``AdaptiveSchedule.learned``, with a ``seed`` column): per bucket,
        plain's tokens/s, the best SD arm's, their ratio and the arm it now chooses."""
        tables = [learned.assign(seed=seed) for (v, seed), tr in self.trainers.items()
                  if v == variant and (learned := tr.record.learned) is not None]
        return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()

    def paired_speedups(self, variant: str) -> pd.Series:
        """Per (seed, RL step): the baseline's step time over ``variant``'s. The variants ran
        that step side by side, so the median of these ratios shrugs off a stall of the
        machine in one of them, which the ratio of summed times (``e2e_speedup``) carries:
        one worker stalled for 0.3 s sets a 16-worker makespan of 0.2 s."""
        steps = self.history.pivot_table(index=["seed", "step"], columns="variant",
                                         values="step_s")
        return (steps["baseline"] / steps[variant]).dropna().rename("e2e_speedup")

    def first_divergence(self, a: str, b: str) -> int:
        """The first RL step whose tokens differ between variants ``a`` and ``b``
        (``tokens_digest``) over every seed both ran; -1 when every common step matches.
        With coupled sampling two variants that change only when and where requests run (a
        Seer dispatch against another) draw the same tokens, unless float32 arithmetic rounds
        a near-tie differently (a re-prefill in one pass where the tokens were decoded step by
        step)."""
        h = self.history
        steps = [first_divergence(h[(h["variant"] == a) & (h["seed"] == seed)],
                                  h[(h["variant"] == b) & (h["seed"] == seed)])
                 for seed in sorted(set(h["seed"]))]
        return min((d for d in steps if d >= 0), default=-1)

    def _usage_by_variant(self) -> pd.DataFrame:
        """Per variant (the index, in run order): ``disturbed_share`` and ``cpu_share`` of
        its steps and updates (``GRPO.usage``; NaN for a history without usage columns)."""
        g = self.history.groupby("variant", sort=False)
        return pd.DataFrame({v: GRPO.usage(rows) for v, rows in g}).T

    def remedy_metrics(self) -> dict:
        """Notebook 11's scalars (``rl.remedies.compare.remedy_metrics``): every variant's
        speedup (the median of :meth:`paired_speedups`), off-policy share, final held-out
        accuracy and time to the baseline's final accuracy, and the variant that got there
        first; each variant's speedup quartiles (``e2e_speedup_q25_<v>``, ``_q75_<v>``, as
        the IQR of the paired ratios) and mean idle fraction (``idle_fraction_<v>``); and, as
        :meth:`metrics` gives them, each variant's disturbed share, the whole run's disturbed
        and CPU shares, and its clock."""
        paired = {v: self.paired_speedups(v) for v in self.variants}
        speedups = {v: float(p.median()) for v, p in paired.items()}
        h = self.history
        spread = {f"e2e_speedup_{q}_{v}": float(p.quantile(at)) for v, p in paired.items()
                  for q, at in (("q25", 0.25), ("q75", 0.75))}
        idle = {f"idle_fraction_{v}": float(h.loc[h["variant"] == v, "idle_fraction"].mean())
                for v in self.variants}
        return {**remedy_metrics(h, self.evals, speedups), **spread, **idle,
                **{f"disturbed_share_{v}": float(share) for v, share
                   in self._usage_by_variant()["disturbed_share"].items()},
                **GRPO.usage(self.history),  # the whole run's disturbed_share and cpu_share
                "clock": _first(self.history, "clock"), "sim_seconds": self.sim_seconds}

    def metrics(self, variant: str | None = None) -> dict:
        """The flat scalars notebook 04 reports: ``variant`` (default: ``tlt`` when it ran,
        else the last variant that did) against the baseline, which must have run. Every key
        of one variant's figures ends with that variant's name (``reward_final_baseline``,
        ``e2e_speedup_tlt``: the variant's speedup over the baseline); ``compared_variant``
        names it too. A baseline-only ablation compares the baseline with itself (speedups
        1, and the ``_baseline`` keys once)."""
        ran = self.variants
        v = variant or ("tlt" if "tlt" in ran else ran[-1])
        for name in ("baseline", v):
            if name not in ran:
                raise ValueError(f"variant {name!r} did not run; ran: {ran}")
        pv = self.per_variant().set_index("variant")
        b, t = pv.loc["baseline"], pv.loc[v]
        ev = self.evals if len(self.evals) else pd.DataFrame(
            columns=["variant", "seed", "step", "accuracy"], dtype=float)  # none measured
        h = self.history[self.history["variant"] == v]
        decisions = self.decisions(v)
        base_ev = ev[ev["variant"] == "baseline"]
        final = base_ev[base_ev["step"] == base_ev["step"].max()]
        paired = self.paired_speedups(v)
        return {"compared_variant": v,
                f"e2e_speedup_{v}": float(t["e2e_speedup"]),
                f"e2e_speedup_median_{v}": float(paired.median()),
                f"e2e_speedup_q25_{v}": float(paired.quantile(0.25)),
                f"e2e_speedup_q75_{v}": float(paired.quantile(0.75)),
                f"amdahl_prediction_{v}": float(t["amdahl_prediction"]),
                f"e2e_over_amdahl_{v}": float(t["e2e_speedup"] / t["amdahl_prediction"]),
                f"rollout_speedup_{v}": float(t["rollout_speedup"]),
                "rollout_fraction_baseline": float(b["rollout_fraction"]),
                "accuracy_start": float(ev[ev["step"] == 0]["accuracy"].mean()),
                "accuracy_final_baseline": float(final["accuracy"].mean()),
                "accuracy_best_baseline": float(base_ev.groupby("step")["accuracy"].mean().max()),
                "reward_final_baseline": float(b["reward_final"]),
                f"reward_final_{v}": float(t["reward_final"]),
                "reward_final_sd_baseline": float(b["reward_final_sd"]),
                f"reward_final_sd_{v}": float(t["reward_final_sd"]),
                "idle_fraction_baseline": float(b["idle_fraction"]),
                f"idle_fraction_{v}": float(t["idle_fraction"]),
                f"wasted_fraction_{v}": float(t["wasted_fraction"]),
                "drafter_overrun_s_max": _max_or_zero(self.history, "drafter_overrun_s"),
                f"drafter_preempted_{v}": int(h.get("drafter_preempted", pd.Series([0])).sum()),
                f"drafter_wasted_s_{v}": float(h.get("drafter_wasted_s", pd.Series([0.0])).sum()),
                f"explore_cost_{v}": explore_cost(decisions),
                f"plain_share_{v}": plain_share(decisions),
                "disturbed_share_baseline": float(b["disturbed_share"]),
                f"disturbed_share_{v}": float(t["disturbed_share"]),
                **GRPO.usage(self.history),  # the whole run's disturbed_share and cpu_share
                "clock": _first(self.history, "clock"), "sim_seconds": self.sim_seconds,
                "rl_steps": int(self.history["step"].max() + 1),
                "seeds": int(self.history["seed"].nunique())}


def _first(history: pd.DataFrame, column: str) -> str | None:
    """The first value of ``column`` over every run (None when no run has it)."""
    values = history[column].dropna() if column in history else []
    return str(values.iloc[0]) if len(values) else None


def _max_or_zero(history: pd.DataFrame, column: str) -> float:
    """The largest value of ``column`` over every run (0 when no run has it)."""
    return float(history[column].max()) if column in history and history[column].notna().any() \
        else 0.0
