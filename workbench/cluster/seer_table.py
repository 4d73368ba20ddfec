"""The what-if of notebook 10: Seer's scheduling, TLT, or both at every N. Each N's one RL
step replayed through ``cluster.dispatch`` under each of :data:`SEER_SETTINGS`, the table
(:func:`seer_whatif`), its figures (:func:`seer_metrics`) and its answer in words
(:func:`seer_answer`).

Why its own module: it is a question asked of the dispatch simulator, not a part of it; the
simulator (``cluster.dispatch_loop``, ``cluster.placement``) knows nothing of Seer's or TLT's
settings."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..checks import check_int
from .cost import StepCost, UpdateCost
from .dispatch_loop import simulate_dispatch
from .placement import predicted_lengths

__all__ = ["SEER_SETTINGS", "seer_whatif", "seer_answer", "seer_metrics"]

SEER_SETTINGS = {"static": ("static", "plain"), "tlt": ("static", "bandit"),
                 "seer_schedule": ("longest_first", "plain"),
                 "seer_divided": ("divided", "plain"), "tlt+seer_divided": ("divided", "bandit")}
"""The settings :func:`seer_whatif` compares, each ``(policy, rule)``: today's static layout
plain, TLT (the bandit's limit) on it, Seer's scheduling (shared queue, longest first), Seer's
divided rollout, and both."""


def seer_whatif(source, cost: StepCost, per_worker: int, max_batch: int | None,
                workers=(8, 16, 32, 64, 128, 256, 512, 1024), samples_per_prompt: int = 8,
                predictor: str = "siblings", noise: float = 0.0,
                update: float | UpdateCost = 0.0, prompt_tokens: float | None = None,
                prefill_per_token: float | None = None, spread: float = 0.0,
                seed: int = 0, draws: int = 1) -> pd.DataFrame:
    """Seer's scheduling, TLT, or both at every N of ``workers``: one RL step of ``N x
    per_worker`` requests (whole groups of a ``Trace`` or a ``LengthModel``'s draws,
    ``remedies.trace_steps``, seeded), each worker ``max_batch`` rows at once, replayed under
    each of :data:`SEER_SETTINGS` (predictions by ``predictor``, :func:`predicted_lengths`).
    One row per N: ``makespan_<setting>_s``, ``idle_fraction_<setting>``, ``moves`` and
    ``reprefill_s`` of ``seer_divided``, each the mean over ``draws`` steps (seeds ``seed``,
    ``seed + 1``, ...: their lengths and slow workers), and ``speedup_<setting>``, the mean
    static plain step's time (rollout and ``update``) over the setting's. Prompt tokens: the
    trace's mean where not given (a ``LengthModel``: 0 unless given). ``spread``: stragglers
    (``simulate_dispatch``), the same slow workers under every setting of a draw."""
    per_worker = check_int("per_worker", per_worker, 1)
    G = check_int("samples_per_prompt", samples_per_prompt, 1)
    draws = check_int("draws", draws, 1)
    if prompt_tokens is None:
        prompt_tokens = (float(source.requests["prompt_tokens"].mean())
                         if hasattr(source, "requests") else 0.0)
    rows = []
    for n in workers:
        n = check_int("workers", n, 1)
        update_s = update.seconds(n) if isinstance(update, UpdateCost) else float(update)
        step = pd.DataFrame([_seer_step(source, cost, n, per_worker, max_batch, G, predictor,
                                        noise, prompt_tokens, prefill_per_token, spread, s)
                             for s in range(seed, seed + draws)]).mean()
        row = {"workers": n, "requests": n * per_worker, "draws": draws, "update_s": update_s,
               **step.to_dict()}
        base = row["makespan_static_s"] + update_s
        for name in SEER_SETTINGS:
            row[f"speedup_{name}"] = base / (row[f"makespan_{name}_s"] + update_s)
        rows.append(row)
    return pd.DataFrame(rows)


def _seer_step(source, cost, n, per_worker, max_batch, G, predictor, noise, prompt_tokens,
               prefill_per_token, spread, seed) -> dict:
    """One drawn step of ``seer_whatif`` at N = ``n`` under every setting."""
    from .remedies import trace_steps
    need = n * per_worker
    groups = trace_steps(source, math.ceil(need / G) + 1, 1, G, seed)[0]
    while sum(len(g) for g in groups) < need:  # a trace's groups may be smaller than G
        groups += trace_steps(source, len(groups), 1, G, seed + len(groups))[0]
    tokens = np.concatenate(groups)[:need]
    labels = np.repeat(np.arange(len(groups)), [len(g) for g in groups])[:need]
    guess = predicted_lengths(tokens, labels, predictor, noise, seed)
    out = {}
    for name, (policy, rule) in SEER_SETTINGS.items():
        run = simulate_dispatch(tokens, n, cost, max_batch, policy, guess, prompt_tokens,
                                rule, prefill_per_token, spread=spread, seed=seed)
        out[f"makespan_{name}_s"] = run.makespan
        out[f"idle_fraction_{name}"] = run.idle_fraction()
        if name == "seer_divided":
            out["moves"], out["reprefill_s"] = run.moves, run.reprefill_s
    return out


def _row(table: pd.DataFrame, workers: int) -> pd.Series:
    rows = table[table["workers"] == workers]
    if len(rows) != 1:
        raise ValueError(f"the table has no row at N={workers}; its N: "
                         f"{table['workers'].tolist()}")
    return rows.iloc[0]


def seer_metrics(table: pd.DataFrame, workers: int = 64) -> dict[str, float]:
    """notebook 10's figures at ``workers`` (a row of :func:`seer_whatif`'s table): each
    setting's predicted speedup over the static plain step, keyed
    ``predicted_speedup_<setting>_{workers}``, and the divided rollout's moves."""
    r = _row(table, workers)
    out = {f"predicted_speedup_{k}_{workers}": float(r[f"speedup_{k}"])
           for k in SEER_SETTINGS if k != "static"}
    out[f"predicted_moves_seer_divided_{workers}"] = float(r["moves"])
    return out


def seer_answer(table: pd.DataFrame, workers: int, tie: float = 0.005) -> str:
    """The answer at ``workers`` (a row of :func:`seer_whatif`'s table), from its numbers:
    which of TLT, Seer (its divided rollout) and both is fastest (those within ``tie``, a
    relative margin, of the fastest tie with it), each one's speedup over the static plain
    step, and whether TLT still pays beside Seer and Seer beside TLT."""
    r = _row(table, workers)
    s = {k: float(r[f"speedup_{k}"]) for k in ("tlt", "seer_schedule", "seer_divided",
                                                "tlt+seer_divided")}
    names = {"tlt": "TLT", "seer_divided": "Seer", "tlt+seer_divided": "TLT with Seer"}
    top = max(s[k] for k in names)
    leaders = [names[k] for k in names if s[k] >= top / (1 + tie)]
    lead = (f"{leaders[0]} is fastest" if len(leaders) == 1
            else " and ".join(leaders) + " tie for fastest")
    pays = lambda gain: (f"still pays ({gain:.2f}x)" if gain > 1 + tie
                         else f"adds nothing ({gain:.3f}x)")
    return (f"N={workers}: {lead} (speedup over static plain: TLT {s['tlt']:.2f}x, Seer's "
            f"scheduling {s['seer_schedule']:.2f}x, Seer divided {s['seer_divided']:.2f}x, "
            f"both {s['tlt+seer_divided']:.2f}x); TLT beside Seer "
            f"{pays(s['tlt+seer_divided'] / s['seer_divided'])}, Seer beside TLT "
            f"{pays(s['tlt+seer_divided'] / s['tlt'])}")
