"""Where does SD pay? Speedup and acceptance over batch sizes, drafters, k and temperature.

One function runs the grid on one engine and returns one tidy table; notebooks and the
benchmark both use it, so their numbers mean the same thing (docs/design.md, "Measures": *SD
speedup*). Plain decoding of the same engine, prompts, batch size and temperature is the
baseline. At each (temperature, batch size) plain decoding and every (drafter, k) alternate
inside each repeat (the order rotates between repeats, :mod:`workbench.speedup`), so a busy
period hits them all; the speedup is the median over repeats of the per-repeat tokens/s ratio
(SD over plain, makespans on the rollout's own clock, one worker), reported with its spread.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import product

import pandas as pd
import torch
from ..progress import tqdm

from ..checks import check_int
from ..rollout import RolloutConfig
from ..speedup import (
    WIDE_SPREAD, check_repeats, disturbed_share, interleave, per_repeat_ratios, spread_note,
    spread_stats)
from .measure import acceptance_length, sd_bound, step_times

__all__ = ["sd_sweep", "check_lossless", "sweep_metrics", "sweep_spread_note", "check_only",
           "narrowed", "drafter_speedups"]

# the columns sd_sweep adds for the spread of the per-repeat speedups
SPREAD_COLUMNS = ("speedup_min", "speedup_max", "speedup_spread", "spread_wide", "repeats")


def first_divergence(a: list[list[int]], b: list[list[int]]) -> int | None:
    """Index of the first token where two rollouts differ (over requests in order), or None."""
    flat_a = [t for seq in a for t in seq]
    flat_b = [t for seq in b for t in seq]
    for i, (x, y) in enumerate(zip(flat_a, flat_b)):
        if x != y:
            return i
    return None if len(flat_a) == len(flat_b) else min(len(flat_a), len(flat_b))


def _tokens(result) -> int:
    return sum(len(t) for t in result.tokens)


def _tok_s(result, seconds) -> float:
    """The measure compared per repeat: tokens over the rollout's makespan."""
    return _tokens(result) / result.timeline.makespan_s


def _median(results, attr) -> float:
    return float(pd.Series([getattr(r.timeline, attr) for r in results]).median())


def check_only(only, drafters, ks, batch_sizes) -> dict:
    """``only`` (``{drafter name: {"batch_sizes": [...], "ks": [...]}}``, None: nothing
    narrowed) once every name is a drafter of the sweep and every batch size and k is one of
    the grid's (a key left out: all of the grid's); each bad value named."""
    if only is None:
        return {}
    if not isinstance(only, dict):
        raise ValueError(f"only {only!r}: accepted None or a dict {{drafter name: "
                         "{'batch_sizes': [...], 'ks': [...]}}")
    grid = {"batch_sizes": list(batch_sizes), "ks": list(ks)}
    out = {}
    for name, where in only.items():
        if name not in drafters:
            raise ValueError(f"only: {name!r} is not a drafter of the sweep; accepted: "
                             f"{list(drafters)}")
        if not isinstance(where, dict) or not set(where) <= set(grid):
            raise ValueError(f"only[{name!r}] = {where!r}: accepted a dict with the keys "
                             f"{list(grid)} (either may be left out)")
        for key, values in where.items():
            if (not isinstance(values, (list, tuple, set)) or not values
                    or not set(values) <= set(grid[key])):
                raise ValueError(f"only[{name!r}][{key!r}] = {values!r}: accepted a non-empty "
                                 f"list of the sweep's {key} {grid[key]}")
        out[name] = {key: set(where.get(key, grid[key])) for key in grid}
    return out


def narrowed(names, drafters, batch_sizes, grid_batch_sizes, k: int) -> dict:
    """``sd_sweep``'s ``only`` that measures each of ``names`` that is among ``drafters`` at
    ``k`` alone and at batch 1 and those of ``batch_sizes`` in ``grid_batch_sizes`` (the
    sweep's), so that drafters added to a comparison cost a part of the grid's time; a name
    not compared is passed over (a list of names checked)."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"narrowed drafters {names!r}: accepted a list of drafter names")
    sizes = sorted({1, *batch_sizes} & set(grid_batch_sizes))
    return {name: {"batch_sizes": sizes, "ks": [k]} for name in names if name in drafters}


def _cell_systems(engine, prompts, base, drafters, ks, only) -> tuple[dict, dict]:
    """``{system name: callable}`` for plain and every (drafter, k) measured at ``base``'s
    batch size (``only``: :func:`check_only`'s), and ``{name: (drafter, k)}`` for the SD
    ones."""
    systems = {"plain": lambda: engine.rollout(prompts, base, progress=False)}
    which = {}
    for (name, drafter), k in product(drafters.items(), ks):
        where = only.get(name)
        if where is not None and (k not in where["ks"]
                                  or base.max_batch_size not in where["batch_sizes"]):
            continue
        key = f"{name} k={k}"
        which[key] = (name, k)
        cfg = replace(base, spec_k=k)
        systems[key] = (lambda c=cfg, d=drafter:
                        engine.rollout(prompts, c, drafter=d, progress=False))
    return systems, which


def _sd_row(plain, sd, ratios, k, wide) -> dict:
    """The measures of one (drafter, k) from its runs and the plain runs of the same repeats."""
    t1 = step_times(pd.concat([r.timeline.steps for r in plain]))["T1"]
    times = step_times(pd.concat([r.timeline.steps for r in sd]), k)
    tau = acceptance_length(pd.concat([r.timeline.requests for r in sd]))
    divs = [d for d in (first_divergence(p.tokens, s.tokens) for p, s in zip(plain, sd))
            if d is not None]
    stats = spread_stats(ratios, wide)
    return {"tokens": _tokens(plain[0]), "plain_s": _median(plain, "makespan_s"),
            "sd_s": _median(sd, "makespan_s"),
            "plain_tok_s": float(pd.Series([_tok_s(r, 0) for r in plain]).median()),
            "sd_tok_s": float(pd.Series([_tok_s(r, 0) for r in sd]).median()),
            "tau": tau, "T1": t1, "Td": times["Td"], "Tv": times["Tv"],
            "bound": sd_bound(tau, t1, times["Td"], times["Tv"], k),
            "identical": not divs, "diverged_at": min(divs) if divs else None,
            "speedup": stats["ratio"], "speedup_min": stats["ratio_min"],
            "speedup_max": stats["ratio_max"], "speedup_spread": stats["spread"],
            "spread_wide": stats["spread_wide"], "repeats": stats["repeats"]}


def sd_sweep(engine, prompts, drafters: dict, ks=(4,), batch_sizes=(1, 8, 32),
             temperatures=(0.0,), repeats: int = 3, max_new_tokens: int = 384,
             seed: int = 0, progress: bool = True, wide: float = WIDE_SPREAD,
             samples_per_prompt: int = 1, only: dict | None = None,
             compile: bool | str = False) -> pd.DataFrame:
    """One row per (temperature, batch size, drafter, k): speedup over plain decoding, tau,
    T1/Td/Tv, the bound, and whether the SD tokens equal the plain tokens (greedy and coupled
    sampling must; float32 rounding can make them diverge late, reported as ``diverged_at``,
    the earliest over repeats).

    At each (temperature, batch size), plain decoding and every (drafter, k) run once per
    repeat, interleaved. ``speedup`` is the median over ``repeats`` (at least 3) of the per-repeat
    ratio SD tokens/s over plain tokens/s, i.e. (plain makespan / SD makespan) x (SD tokens /
    plain tokens); ``speedup_min``/``speedup_max`` are its extremes, ``speedup_spread`` is
    (max - min) / median and ``spread_wide`` says it exceeds ``wide``. ``plain_s``/``sd_s``
    and ``plain_tok_s``/``sd_tok_s`` are medians over repeats (so ``speedup`` need not equal
    their ratio exactly); T1, Td and Tv are median step times over all repeats, tau is over all
    verify steps of all repeats.

    ``samples_per_prompt`` responses per prompt (a GRPO group, each with its own draws) make
    every rollout: a drafter that drafts from a row's siblings (``sibling``, ``suffix``) has
    none with one; at temperature 0 the samples of a prompt are identical, so there a
    finished sibling is an exact draft. ``only`` narrows where a drafter is measured
    (:func:`check_only`; e.g. ``{"suffix": {"batch_sizes": [1, 16], "ks": [4]}}``): plain
    decoding and the other drafters still run in that cell.

    ``compile`` is ``RolloutConfig.compile`` of every rollout, plain and SD alike
    (``rollout.compiled``: ``True`` compiles the plain step, the verify pass and an EAGLE
    head's drafting), so the speedups are SD's on that path over plain decoding on the same
    path; the table's ``compile`` column says which ran (a bad value is refused by
    ``RolloutConfig`` before any rollout). A compile is a ``compile`` row of the timeline,
    off the sim clock, so the first repeat's makespans do not include it.
    """
    check_repeats(repeats)
    samples_per_prompt = check_int("samples_per_prompt", samples_per_prompt, 1)
    only = check_only(only, drafters, ks, batch_sizes)
    rows = []
    grid = list(product(temperatures, batch_sizes))
    base_cfgs = {(temp, bs): RolloutConfig(
        max_new_tokens=max_new_tokens, temperature=temp, seed=seed, max_batch_size=bs,
        samples_per_prompt=samples_per_prompt, compile=compile) for temp, bs in grid}
    cells = {cell: _cell_systems(engine, prompts, cfg, drafters, ks, only)
             for cell, cfg in base_cfgs.items()}
    bar = tqdm(total=repeats * sum(len(systems) for systems, _ in cells.values()),
               desc="sd sweep", disable=not progress)
    for (temp, bs), (systems, which) in cells.items():
        runs = interleave(systems, repeats, measure=_tok_s, higher_is_better=True,
                          on_run=lambda *_: bar.update())
        ratios = per_repeat_ratios(runs, "plain")
        disturbed = disturbed_share(runs)  # the cell's share of disturbed repeats
        for key, (name, k) in which.items():
            mine = ratios[ratios["system"] == key].sort_values("repeat")["ratio"]
            rows.append({"temperature": temp, "batch_size": bs, "drafter": name, "k": k,
                         **_sd_row(runs.outputs["plain"], runs.outputs[key], mine, k, wide),
                         "disturbed_share": disturbed, "compile": compile,
                         "clock": runs.outputs["plain"][0].timeline.clock})
    bar.close()
    return pd.DataFrame(rows)


def sweep_spread_note(table: pd.DataFrame, wide: float = WIDE_SPREAD) -> str:
    """The sentence a notebook prints under an sd_sweep table: whether any speedup's
    per-repeat spread is wide (and which rows), or that none is."""
    note = spread_note(table, wide=wide, what="configurations")
    bad = table[table["spread_wide"].astype(bool)] if "spread_wide" in table else table[:0]
    rows = [f"T={r.temperature:g} batch {r.batch_size} {r.drafter} k={r.k}: "
            f"{r.speedup:.2f}x ({r.speedup_min:.2f}-{r.speedup_max:.2f})"
            for r in bad.itertuples()]
    return note + ("\n  " + "\n  ".join(rows) if rows else "")


def check_lossless(model_name: str, drafters_factory, prompts, k: int = 4,
                   max_new_tokens: int = 96) -> pd.DataFrame:
    """The exactness check, in float64: greedy and coupled-sampling SD must reproduce plain
    decoding token for token, for every drafter. ``drafters_factory(policy, tokenizer)``
    builds the drafters for the float64 policy. One row per (drafter, temperature)."""
    from ..models import load_model
    from ..rollout import RolloutEngine
    policy, tok = load_model(model_name, device="cpu", dtype=torch.float64)
    engine = RolloutEngine(policy, tok)
    drafters = drafters_factory(policy, tok)  # each rollout starts them afresh (begin())
    rows = []
    for temp in (0.0, 1.0):
        cfg = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temp, spec_k=k)
        plain = engine.rollout(prompts, cfg, progress=False)
        for name, drafter in drafters.items():
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
    size (greedy) and at batch 1 (temperature 1), each with ``_min``/``_max`` (extremes of the
    per-repeat ratios), the bound at batch 1, ``speedup_spread_wide`` (true if any speedup of
    either table has a wide spread), and ``lossless`` (true only if the float64 check ran and
    every drafter reproduced plain decoding); ``disturbed_share``, the share of the timed
    repeats other work disturbed (``speedup.interleave``: redone, then flagged), over both
    tables' cells, ``clock``, the one the makespans were read on (the rollouts' own:
    ``"sim"`` on the local backend, whose figures the disturbance does not move), and
    ``compile``, the decode path they ran (``RolloutConfig.compile``, :func:`sd_sweep`'s)."""
    metrics = {f"accept_len_{name}": sweep_value(compare, "tau", drafter=name, k=k,
                                                 temperature=0.0)
               for name in compare["drafter"].unique()}
    cells = {f"speedup_bs{bs}": dict(batch_size=bs, temperature=0.0) for bs in (1, 8, 32)}
    cells["speedup_bs1_t1"] = dict(batch_size=1, temperature=1.0)
    for key, where in cells.items():
        metrics[key] = sweep_value(curve, "speedup", **where)
        for end in ("min", "max"):
            metrics[f"{key}_{end}"] = (sweep_value(curve, f"speedup_{end}", **where)
                                       if f"speedup_{end}" in curve else float("nan"))
    metrics["bound_bs1"] = sweep_value(curve, "bound", batch_size=1, temperature=0.0)
    metrics["speedup_spread_wide"] = bool(any(
        t["spread_wide"].astype(bool).any() for t in (compare, curve) if "spread_wide" in t))
    metrics["lossless"] = bool(len(exact) > 0 and exact["identical"].all())
    metrics["k"] = k
    measured = [t for t in (compare, curve) if "disturbed_share" in t and len(t)]
    metrics["disturbed_share"] = (float(pd.concat([t["disturbed_share"] for t in measured])
                                        .mean()) if measured else float("nan"))
    metrics["clock"] = str(measured[0]["clock"].iloc[0]) if measured else None
    path = measured[0]["compile"].iloc[0] if measured and "compile" in measured[0] else None
    metrics["compile"] = path if path is None or isinstance(path, str) else bool(path)
    return metrics


def drafter_speedups(table: pd.DataFrame, k: int, batch_sizes=(1, 16)) -> dict:
    """Every drafter's speedup at chain ``k`` and each of ``batch_sizes`` it was measured at
    (an ``sd_sweep`` table), at every temperature: ``speedup_bs<b>_<drafter>`` (greedy) or
    ``speedup_bs<b>_t<T>_<drafter>``, each with ``_min``/``_max`` (the per-repeat extremes);
    a cell not measured has no key. For notebook 02's comparison at batch 1 and 16."""
    out = {}
    rows = table[(table["k"] == k) & table["batch_size"].isin(list(batch_sizes))]
    for r in rows.itertuples():
        temp = "" if r.temperature == 0 else f"_t{r.temperature:g}"
        key = f"speedup_bs{r.batch_size}{temp}_{r.drafter}"
        out.update({key: float(r.speedup), f"{key}_min": float(r.speedup_min),
                    f"{key}_max": float(r.speedup_max)})
    return out
