"""Where does SD pay? Speedup and acceptance over batch sizes, drafters, k and temperature.

One function runs the grid on one engine and returns one tidy table; notebooks and the
benchmark both use it, so their numbers mean the same thing. Plain decoding of the same
engine, prompts, batch size and temperature is the baseline; every time is the median of
``repeats`` runs on the wall clock of this process (one worker).
"""
from __future__ import annotations

import statistics
from itertools import product

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..rollout import RolloutConfig
from .measure import acceptance_length, sd_bound, step_times

__all__ = ["sd_sweep", "first_divergence", "check_lossless", "sweep_value", "sweep_metrics"]


def first_divergence(a: list[list[int]], b: list[list[int]]) -> int | None:
    """Index of the first token where two rollouts differ (over requests in order), or None."""
    flat_a = [t for seq in a for t in seq]
    flat_b = [t for seq in b for t in seq]
    for i, (x, y) in enumerate(zip(flat_a, flat_b)):
        if x != y:
            return i
    return None if len(flat_a) == len(flat_b) else min(len(flat_a), len(flat_b))


def _run(engine, prompts, cfg, drafter, repeats):
    times, result = [], None
    for _ in range(repeats):
        result = engine.rollout(prompts, cfg, drafter=drafter, progress=False)
        times.append(result.timeline.makespan_s)
    return result, statistics.median(times)


def sd_sweep(engine, prompts, drafters: dict, ks=(4,), batch_sizes=(1, 8, 32),
             temperatures=(0.0,), repeats: int = 3, max_new_tokens: int = 384,
             seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """One row per (temperature, batch size, drafter, k): speedup over plain decoding, tau,
    T1/Td/Tv, the bound, and whether the SD tokens equal the plain tokens (greedy and coupled
    sampling must; float32 rounding can make them diverge late, reported as ``diverged_at``).
    """
    rows = []
    grid = list(product(temperatures, batch_sizes))
    bar = tqdm(total=len(grid) * (1 + len(drafters) * len(ks)), desc="sd sweep",
               disable=not progress)
    for temp, bs in grid:
        base = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temp, seed=seed,
                             max_batch_size=bs)
        plain, plain_s = _run(engine, prompts, base, None, repeats)
        bar.update()
        t1 = step_times(plain.timeline.steps)["T1"]
        n_tokens = sum(len(t) for t in plain.tokens)
        for (name, drafter), k in product(drafters.items(), ks):
            cfg = RolloutConfig(**{**base.__dict__, "spec_k": k})
            sd, sd_s = _run(engine, prompts, cfg, drafter, repeats)
            bar.update()
            tau = acceptance_length(sd)
            times = step_times(sd.timeline.steps, k)
            div = first_divergence(plain.tokens, sd.tokens)
            rows.append({"temperature": temp, "batch_size": bs, "drafter": name, "k": k,
                         "tokens": n_tokens, "plain_s": plain_s, "sd_s": sd_s,
                         "plain_tok_s": n_tokens / plain_s,
                         "sd_tok_s": sum(len(t) for t in sd.tokens) / sd_s,
                         "tau": tau, "T1": t1, "Td": times["Td"], "Tv": times["Tv"],
                         "bound": sd_bound(tau, t1, times["Td"], times["Tv"], k),
                         "identical": div is None, "diverged_at": div})
            rows[-1]["speedup"] = rows[-1]["sd_tok_s"] / rows[-1]["plain_tok_s"]
    bar.close()
    return pd.DataFrame(rows)


def check_lossless(model_name: str, drafters_factory, prompts, k: int = 4,
                   max_new_tokens: int = 96) -> pd.DataFrame:
    """The exactness check, in float64: greedy and coupled-sampling SD must reproduce plain
    decoding token for token, for every drafter. ``drafters_factory(policy, tokenizer)``
    builds the drafters for the float64 policy. One row per (drafter, temperature)."""
    from ..models import load_model
    from ..rollout import RolloutEngine
    policy, tok = load_model(model_name, device="cpu", dtype=torch.float64)
    engine = RolloutEngine(policy, tok)
    rows = []
    for temp in (0.0, 1.0):
        cfg = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temp, spec_k=k)
        plain = engine.rollout(prompts, cfg, progress=False)
        for name, drafter in drafters_factory(policy, tok).items():
            sd = engine.rollout(prompts, cfg, drafter=drafter, progress=False)
            rows.append({"drafter": name, "temperature": temp, "k": k,
                         "identical": sd.tokens == plain.tokens,
                         "diverged_at": first_divergence(plain.tokens, sd.tokens)})
    return pd.DataFrame(rows)


def sweep_value(table: pd.DataFrame, column: str, **where) -> float:
    """``column`` of the first row matching ``where`` (NaN when none matches)."""
    sel = table
    for key, v in where.items():
        sel = sel[sel[key] == v]
    return float(sel.iloc[0][column]) if len(sel) else float("nan")


def sweep_metrics(compare: pd.DataFrame, curve: pd.DataFrame, exact: pd.DataFrame,
                  k: int = 4) -> dict:
    """The scalars notebook 02 reports: tau per drafter (greedy, k), EAGLE speedups by batch
    size (greedy) and at batch 1 (temperature 1), the bound at batch 1, and ``lossless``
    (true only if the float64 check ran and every drafter reproduced plain decoding)."""
    metrics = {f"accept_len_{name}": sweep_value(compare, "tau", drafter=name, k=k,
                                                 temperature=0.0)
               for name in compare["drafter"].unique()}
    for bs in (1, 8, 32):
        metrics[f"speedup_bs{bs}"] = sweep_value(curve, "speedup", batch_size=bs,
                                                 temperature=0.0)
    metrics["speedup_bs1_t1"] = sweep_value(curve, "speedup", batch_size=1, temperature=1.0)
    metrics["bound_bs1"] = sweep_value(curve, "bound", batch_size=1, temperature=0.0)
    metrics["lossless"] = bool(len(exact) > 0 and exact["identical"].all())
    metrics["k"] = k
    return metrics
