"""Minitron's recipe end to end: score, prune to a target, distill from the model pruned, and
iterate (teacher -> ~50% -> ~25% of its parameters), each model cut from the closest larger
one and distilled from it.

One stage is :func:`compress_step`; :func:`iterative_compress` chains stages. Each stage keeps
what a notebook reports: the plan, the LM loss right after pruning and after distillation, and
the distillation's history and evaluations.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..checks import check_choice, check_fraction
from .data import check_seeds, lm_loss, seeded_order
from .depth import layer_removal
from .distill import DistillConfig, Distiller
from .importance import Aggregation
from .plan import PrunePlan, check_model_type, param_count
from .prune import prune
from .rankings import Activation, Ranking, resolve
from .search import KINDS, nearest_plan, plan_kind, snap_note

__all__ = ["Stage", "pick_plan", "compress_step", "iterative_compress", "seeded_pipelines",
           "lineage_table", "seeded_models"]


@dataclass
class Stage:
    """One compressed model and how it was made."""

    name: str
    model: object
    plan: PrunePlan
    params: int
    loss_after_prune: float
    loss_after_distill: float
    history: pd.DataFrame = field(repr=False)
    evals: pd.DataFrame = field(repr=False)


def pick_plan(config, target: float | int, kind: str = "width",
              layer_scores=None) -> PrunePlan:
    """The feasible plan of ``kind`` nearest to ``target`` parameters (a fraction of
    ``config``'s in (0, 1), or a count): width plans keep every layer, depth plans every
    width. A small model has few plans, so the target snaps to the nearest one and one line
    says what was asked and what was got (:func:`~workbench.compress.search.snap_note`); a
    target outside (0, 1), or a kind the model has no plan of, is refused with the range the
    feasible plans span."""
    check_choice("kind", kind, KINDS)
    row = nearest_plan(config, target, (kind,), layer_scores)
    print(snap_note(config, target, row))
    return row["plan"]


def compress_step(teacher, target: float | int, train, held_out, calibration,
                  kind: str = "width", config: DistillConfig | None = None,
                  name: str = "student", checkpoint_dir: str | os.PathLike | None = None,
                  aggregation: Aggregation | None = None, plan: PrunePlan | None = None,
                  progress: bool = True, ranking: str = "activation") -> Stage:
    """Score ``teacher`` on ``calibration`` batches (by ``ranking``, a registered importance
    score, :mod:`.rankings`, for width: activation importance by default, under
    ``aggregation`` when given; the LM-loss increase of removing each layer for depth), prune
    it to the feasible ``kind`` plan nearest ``target`` (:func:`pick_plan`; or to ``plan``
    when given), then distill the student from ``teacher`` on ``train`` batches, evaluating
    on ``held_out``. A ranking that draws randomly draws with ``config``'s seed."""
    check_model_type(teacher)
    check_choice("kind", kind, KINDS)  # before the layer-removal scores are worked out
    ranked = _ranking(ranking, aggregation)
    if plan is None:
        layer_scores = (layer_removal(teacher, calibration, progress=progress)["increase"]
                        .tolist() if kind != "width" else None)
        plan = pick_plan(teacher.config, target, kind, layer_scores)
    narrower = plan_kind(teacher.config, plan) in ("width", "both")
    config = config if config is not None else DistillConfig()
    scores = ranked.scores(teacher, calibration, config.train.seed) if narrower else None
    student = prune(teacher, plan, scores)
    before = lm_loss(student, held_out)
    distiller = Distiller(student, teacher, train, config.updated(progress=progress),
                          eval_batches=held_out, checkpoint_dir=checkpoint_dir,
                          desc=f"distill {name}")
    distiller.run()
    return Stage(name, student, plan, param_count(student.config), before,
                 lm_loss(student, held_out), distiller.history,
                 distiller.evals)


def _ranking(ranking: str, aggregation: Aggregation | None) -> Ranking:
    """``ranking`` resolved; ``aggregation`` (the older way to pick an activation variant)
    turns the bare ``activation`` into its variant and is refused beside any other."""
    if aggregation is None:
        return resolve(ranking)
    if ranking != "activation":
        raise ValueError(f"aggregation {aggregation!r} with ranking {ranking!r}: an aggregation "
                         "picks a variant of 'activation' only; accepted ranking 'activation' "
                         "beside it, or a ranking alone")
    variant = f"{aggregation.batch}/{aggregation.sequence}"  # any Aggregation, not only the
    score = Activation()                                      # ablation's variants
    score.variant = variant
    return Ranking("activation", variant, f"activation {variant}", score)


def iterative_compress(teacher, targets=(0.5, 0.25), train=(), held_out=(), calibration=(),
                       kind: str = "width", config: DistillConfig | None = None,
                       out_dir: str | os.PathLike | None = None,
                       progress: bool = True, plans=None,
                       ranking: str = "activation") -> list[Stage]:
    """Stages that cut ``teacher`` to each of ``targets`` (fractions of the teacher's own
    parameters, largest first), each pruned from and distilled by the previous stage's model.
    With ``out_dir`` each stage's distillation checkpoints under ``out_dir/<name>`` (resume).
    ``plans``: one plan per target to cut to, instead of the nearest feasible ones (e.g. the
    plans another seed's run picked). ``ranking``: the importance score every width cut keeps
    the best units of (:func:`compress_step`)."""
    check_model_type(teacher)
    resolve(ranking)  # an unknown ranking is refused before the first stage runs
    fractions = [check_fraction(f"targets[{i}] (a share of the teacher's parameters)", f,
                                low_open=True, high_open=True) for i, f in enumerate(targets)]
    if fractions != sorted(fractions, reverse=True):
        raise ValueError(f"targets {targets!r}: fractions of the teacher in (0, 1), largest "
                         "first")
    if plans is not None and len(plans) != len(fractions):
        raise ValueError(f"plans has {len(plans)} entries for {len(fractions)} targets; "
                         "accepted: None or one plan per target")
    source = param_count(teacher.config)
    stages, current = [], teacher
    for i, f in enumerate(fractions):
        name = f"{kind}_{round(100 * f)}pct"
        ckpt = Path(out_dir) / name if out_dir is not None else None
        stage = compress_step(current, round(f * source), train, held_out, calibration, kind,
                              config, name, ckpt, plan=plans[i] if plans else None,
                              progress=progress, ranking=ranking)
        stages.append(stage)
        current = stage.model
    return stages


def seeded_pipelines(teacher, targets=(0.5, 0.25), train=(), held_out=(), calibration=(),
                     kind: str = "width", config: DistillConfig | None = None, seeds=None,
                     out_dir: str | os.PathLike | None = None,
                     progress: bool = True, ranking: str = "activation") -> dict[int, list[Stage]]:
    """``{seed: stages}``: :func:`iterative_compress` once per seed of ``seeds`` (default:
    ``config``'s seed alone), each on ``train`` in the seed's order
    (:func:`~.data.seeded_order`) with the seed in ``config``; the first seed picks each
    stage's plan and the others reuse it (one line per plan), so the seeds differ in their
    distillation alone (and a ``ranking`` that draws randomly, in its draw). With ``out_dir``,
    seed ``s`` checkpoints under ``out_dir/seed_<s>``."""
    check_model_type(teacher)
    resolve(ranking)
    config = config if config is not None else DistillConfig()
    runs, plans = {}, None
    for seed in check_seeds([config.train.seed] if seeds is None else seeds):
        runs[seed] = iterative_compress(
            teacher, targets, seeded_order(train, seed), held_out, calibration, kind,
            config.updated(seed=seed), Path(out_dir) / f"seed_{seed}" if out_dir else None,
            progress, plans, ranking)
        plans = [s.plan for s in runs[seed]]
    return runs


def lineage_table(runs: dict[int, list[Stage]], params_teacher: int) -> pd.DataFrame:
    """One row per stage of every seed of ``runs`` (:func:`seeded_pipelines`), in their
    order: ``model`` (the stage's name), ``seed``, ``plan`` (as text), ``params``,
    ``params_ratio`` (to ``params_teacher``), ``loss_after_prune`` and
    ``loss_after_distill``."""
    return pd.DataFrame([{"model": s.name, "seed": seed, "plan": str(s.plan), "params": s.params,
                          "params_ratio": s.params / params_teacher,
                          "loss_after_prune": s.loss_after_prune,
                          "loss_after_distill": s.loss_after_distill}
                         for seed, stages in runs.items() for s in stages])


def seeded_models(teacher, runs: dict[int, list[Stage]]) -> dict:
    """``{(name, seed): model}``: ``("teacher", 0)`` first (greedy: one seed), then every
    stage of every seed of ``runs`` (:func:`seeded_pipelines`), as
    ``retraining_summary.accuracy_over_seeds`` takes them."""
    return {("teacher", 0): teacher,
            **{(s.name, seed): s.model for seed, stages in runs.items() for s in stages}}
