"""The comparisons notebooks 05-07 report, as functions that return tidy tables.

- :func:`ranking_ablation`: one plan, many rankings (registered importance scores,
  :mod:`.rankings`; by default every batch/sequence aggregation of the activation scores,
  weight magnitude, random), judged by LM loss right after pruning.
- :func:`architecture_search`: candidate plans near a target, ranked by LM loss right after
  pruning, the best few retrained by a short distillation and ranked again.
- :func:`width_against_depth`: a width and a depth student of about the same size, right after
  pruning and after distillation on the same batches (an equal token budget).
- :func:`retraining_study`: one pruned architecture retrained four ways on the same batches
  (KD on logits, KD on logits and hidden states, plain cross-entropy, cross-entropy from
  scratch), with :func:`tokens_to_reach` to read the token savings off the curves.

:func:`width_against_depth` and :func:`retraining_study` run once per seed (``seeds``): a seed
orders the distillation batches and draws every initialisation, so :mod:`.retraining_summary`
and :mod:`.stats` can put error bars on what they compare; :func:`ranking_ablation` draws its
random ranking once per seed.
"""
from __future__ import annotations

import copy
import math
import numbers
from pathlib import Path

import pandas as pd
from ..progress import tqdm
from ..scalar_log import check_report_to

from .data import check_seeds, lm_loss, seeded_order
from .distill import DistillConfig, Distiller, scratch_like
from .importance import importance_from_batches
from .iterative import compress_step
from .plan import check_model_type, param_count
from .prune import prune
from .rankings import DEFAULT_RANKINGS, check_rankings, resolve
from .search import feasible_plans, nearest_plan, rank_candidates, snap_note

__all__ = ["ranking_ablation", "architecture_search", "width_against_depth", "retraining_study",
           "mean_curves", "token_savings", "tokens_to_reach", "RETRAININGS"]

RETRAININGS = ("pruned + KD (logits)", "pruned + KD (logits + hidden)", "pruned + CE",
               "scratch + CE")
"""The retraining runs `retraining_study` compares, by name."""

def ranking_ablation(teacher, plan, calibration, held_out, seed: int = 0,
                     progress: bool = True, seeds=None,
                     rankings=DEFAULT_RANKINGS) -> pd.DataFrame:
    """LM loss on ``held_out`` right after pruning ``teacher`` to ``plan`` with the units each
    of ``rankings`` keeps (registered importance scores, :mod:`.rankings`; default: activation
    importance under every (batch, sequence) aggregation, the default L2/mean first, weight
    magnitude, and a random draw); one row per ranking, by its label, best first. A ranking
    that draws randomly is drawn once per seed of ``seeds`` (default: ``[seed]``) and reported
    as the mean with ``lm_loss_sd`` over the draws (0 for the rankings that draw nothing);
    the others score once, with the first seed. ``rankings`` is checked before any model runs
    (an unknown name is refused listing the registered ones)."""
    check_model_type(teacher)
    seeds = check_seeds([seed] if seeds is None else seeds)
    chosen = [resolve(r) for r in check_rankings(rankings)]
    rows = []
    for ranking in tqdm(chosen, desc="rankings", disable=not progress):
        draws = seeds if ranking.draws_randomly else seeds[:1]
        losses = pd.Series([lm_loss(prune(teacher, plan, ranking.scores(teacher, calibration, s)),
                                    held_out) for s in draws])
        rows.append({"ranking": ranking.label, "lm_loss": float(losses.mean()),
                     "lm_loss_sd": float(losses.std()) if len(losses) > 1 else 0.0})
    return pd.DataFrame(rows).sort_values("lm_loss", kind="stable").reset_index(drop=True)


def _search_table(config, target, kinds, max_flops_ratio, candidates) -> pd.DataFrame:
    """Plans of ``kinds`` (within the FLOPs budget) within 5% of ``target``, nearest first;
    when none is, within 5% of the nearest feasible plan, and one line says so."""
    nearest = nearest_plan(config, target, kinds, max_flops_ratio=max_flops_ratio)  # checks
    table = feasible_plans(config, kinds, max_flops_ratio=max_flops_ratio)
    goal = round(target if isinstance(target, numbers.Integral) else target * param_count(config))
    if abs(nearest["params"] - goal) > 0.05 * goal:
        print(f"architecture search: no plan within 5% of the target; searching around the "
              f"nearest: {snap_note(config, target, nearest)}")
        goal = int(nearest["params"])
    table = table[(table["params"] - goal).abs() <= 0.05 * goal]
    order = (table["params"] - goal).abs().sort_values(kind="stable").index
    return table.loc[order].head(candidates).reset_index(drop=True)


def architecture_search(teacher, target, calibration, train, held_out, top: int = 3,
                        config: DistillConfig | None = None, scores=None,
                        kinds=("width", "depth", "both"), candidates: int | None = 12,
                        max_flops_ratio: float | None = None,
                        progress: bool = True) -> pd.DataFrame:
    """Every plan within 5% of ``target`` (a fraction of the teacher's parameters in (0, 1),
    or a count), ranked by LM loss right after pruning (``loss_pruned``); the best ``top``
    are distilled from ``teacher`` with ``config`` on ``train`` and ranked again
    (``loss_retrained``). When no plan lies within 5% of ``target``, the search centres on
    the nearest feasible plan and prints one line saying so (a small model has few plans).
    ``scores``: the units to keep (default: activation importance, L2/mean, on
    ``calibration``); ``kinds``: which plans (width, depth, both) take part;
    ``max_flops_ratio``: only plans whose FLOPs per token are at most this share of the
    teacher's (a speed budget beside the parameter target: at equal parameters, a plan that
    keeps every attention head keeps most of the attention FLOPs); ``candidates``: how many of
    them, nearest the target first (None: all). Both rankings are LM losses on the one
    ``held_out`` set the caller passes."""
    check_model_type(teacher)
    table = _search_table(teacher.config, target, kinds, max_flops_ratio, candidates)
    if scores is None:
        scores = importance_from_batches(teacher, calibration, progress=False).scores
    ranked = rank_candidates(table, lambda p: lm_loss(prune(teacher, p, scores), held_out),
                             "loss_pruned")
    config = (config if config is not None else DistillConfig()).updated(progress=False,
                                                                           eval_every=0)

    def retrained(plan):
        student = prune(teacher, plan, scores)
        Distiller(student, teacher, train, config).run()
        return lm_loss(student, held_out)

    best = rank_candidates(ranked.head(top), retrained, "loss_retrained")
    cols = ["plan", "loss_retrained", "loss_retrained_rank"]
    out = ranked.merge(best[cols], on="plan", how="left")
    out["loss_retrained_rank"] = out["loss_retrained_rank"].astype("Int64")
    return out


def width_against_depth(teacher, target, calibration, train, held_out,
                        config: DistillConfig | None = None, width_plan=None, seeds=None,
                        progress: bool = True):
    """``(table, stages)``: a width and a depth student of ``teacher`` near ``target`` (the
    width one cut to ``width_plan`` when given, e.g. the architecture search's best), pruned
    (LM loss right after) and distilled on the same ``train`` batches (LM loss after), once
    per seed of ``seeds`` (the seed orders the batches, :func:`~.data.seeded_order`, and seeds
    the run; default: ``config``'s seed alone); the table has one row per (kind, stage, seed), ``stages`` the first seed's.
    Each student is the feasible plan of its kind nearest ``target``
    (:func:`~workbench.compress.iterative.pick_plan` prints what it got: a 4-layer model's
    depth plans keep 1 to 3 layers, so "about the same size" may be 0.46 against 0.5)."""
    check_model_type(teacher)
    config = config if config is not None else DistillConfig()
    seeds = check_seeds([config.train.seed] if seeds is None else seeds)
    plans, rows, stages = {"width": width_plan, "depth": None}, [], {}
    for seed in seeds:
        for kind in plans:
            st = compress_step(teacher, target, seeded_order(train, seed), held_out,
                               calibration, kind, config.updated(seed=seed), name=kind,
                               plan=plans[kind], progress=progress)
            plans[kind] = st.plan  # the first seed picks it; the others reuse it
            stages.setdefault(kind, st)
            rows += [{"kind": kind, "stage": "after pruning", "seed": seed,
                      "lm_loss": st.loss_after_prune, "params": st.params},
                     {"kind": kind, "stage": "after distillation", "seed": seed,
                      "lm_loss": st.loss_after_distill, "params": st.params}]
    return pd.DataFrame(rows), stages


def _retrainings(student, teacher, config: DistillConfig, layer_pairs, seed: int) -> dict:
    """``{run: (model, teacher or None, config)}`` of :data:`RETRAININGS` for one seed."""
    kd = config.updated(mode="kd", layer_pairs=(), seed=seed)
    ce = config.updated(mode="ce", layer_pairs=(), seed=seed)
    runs = {RETRAININGS[0]: (copy.deepcopy(student), teacher, kd),
            RETRAININGS[1]: (copy.deepcopy(student), teacher,
                             kd.updated(layer_pairs=tuple(layer_pairs))),
            RETRAININGS[2]: (copy.deepcopy(student), None, ce),
            RETRAININGS[3]: (scratch_like(student, seed), None, ce)}
    if not layer_pairs:
        del runs[RETRAININGS[1]]
    return runs


def retraining_study(teacher, student, train, held_out, config: DistillConfig,
                     layer_pairs=(), seeds=None, progress: bool = True, report_to: str = "none",
                     run_dir=None):
    """``(curves, models)``: the pruned ``student`` retrained from copies in the ways of
    :data:`RETRAININGS` (the hidden-state run only with ``layer_pairs``), once per seed of
    ``seeds`` (default: ``config``'s seed alone); within a seed every run sees the same batches (``train`` in the seed's order,
    :func:`~.data.seeded_order`) for ``config.train.horizon`` steps, so at an equal token
    budget, and the seed draws the projections and the from-scratch weights. ``curves``: one
    row per (run, seed, evaluation) with ``step``, ``tokens`` (training tokens seen),
    ``lm_loss`` on ``held_out`` and ``best`` (the evaluation whose weights the run's model
    ends with: :class:`~.distill.Distiller` restores its best at the horizon); ``models``:
    ``{(run, seed): model}``. ``report_to="tensorboard"``: each (run, seed) logs its steps
    (:class:`~.distill.Distiller`'s) in a folder of its own under ``run_dir``."""
    check_report_to(report_to, run_dir)
    curves, models = [], {}
    for seed in check_seeds([config.train.seed] if seeds is None else seeds):
        batches = seeded_order(train, seed)
        for name, (model, teach, cfg) in _retrainings(student, teacher, config, layer_pairs,
                                                       seed).items():
            distiller = Distiller(model, teach, batches, cfg.updated(progress=progress),
                                  eval_batches=held_out, desc=f"{name}, seed {seed}",
                                  report_to=report_to, run_dir=None if run_dir is None
                                  else Path(run_dir) / f"{_slug(name)}-seed{seed}")
            distiller.run()
            ev = distiller.evals
            curves.append(pd.DataFrame({"run": name, "seed": seed, "step": ev["step"],
                                        "tokens": ev["tokens_seen"], "lm_loss": ev["eval_loss"],
                                        "best": ev["best"]}))
            models[name, seed] = model
    return pd.concat(curves, ignore_index=True), models


def _slug(name: str) -> str:
    """A run's name as a folder name: ``pruned + KD (logits)`` -> ``pruned_kd_logits``."""
    return "_".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


def mean_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """``curves`` averaged over seeds per (run, step): ``tokens`` and ``lm_loss`` means (the
    batch order moves the tokens of a step a little); without a ``seed`` column, as given."""
    if "seed" not in curves:
        return curves
    return (curves.groupby(["run", "step"], sort=False)[["tokens", "lm_loss"]].mean()
            .reset_index())


def tokens_to_reach(curves: pd.DataFrame, run: str, loss: float) -> float:
    """Training tokens ``run`` needed for its held-out LM loss to reach ``loss``: linear
    between the two evaluations that bracket it; NaN if it never does."""
    part = curves[curves["run"] == run].sort_values("tokens")
    prev = None
    for r in part.itertuples():
        if r.lm_loss <= loss:
            if prev is None or prev.lm_loss == r.lm_loss:
                return float(r.tokens)
            frac = (prev.lm_loss - loss) / (prev.lm_loss - r.lm_loss)
            return float(prev.tokens + frac * (r.tokens - prev.tokens))
        prev = r
    return math.nan


def token_savings(curves: pd.DataFrame, run: str = RETRAININGS[0]) -> dict:
    """How many times fewer tokens ``run`` needs than the from-scratch run to reach the latter's
    final loss (on the curves averaged over seeds, :func:`mean_curves`): interpolated between
    evaluations (inf if ``run`` starts there), and a lower bound from the first evaluation
    (after step 0) at or below it."""
    curves = mean_curves(curves)
    scratch = curves[curves["run"] == RETRAININGS[3]]
    budget, target = scratch["tokens"].iloc[-1], scratch["lm_loss"].iloc[-1]
    mine = curves[curves["run"] == run]
    needed = tokens_to_reach(curves, run, target)
    first_eval = mine[mine["tokens"] > 0]["tokens"].min()
    reached = mine[(mine["lm_loss"] <= target) & (mine["tokens"] > 0)]["tokens"].min()
    return {"tokens_budget": int(budget), "tokens_kd_to_scratch_loss": needed,
            "token_savings_vs_scratch": budget / needed if needed > 0 else math.inf,
            "token_savings_lower_bound": budget / max(reached, first_eval)}
