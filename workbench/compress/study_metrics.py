"""The flat scalars of the pruning study (notebook 05), the retraining study (notebook 06) and
the Minitron pipeline (notebook 07), read off their tables: what each notebook writes to
``metrics.json`` and ``workbench pipeline`` gathers, named as the README's notebook table lists
them.

Each function reads one table of the study (the shape its producer returns) and refuses a table
that lacks a row it needs by naming the row and the rows it has, so that a changed study fails
here and not as a ``KeyError`` deep in a notebook.
"""
from __future__ import annotations

import pandas as pd

from .stats import paired_difference
from .studies import RETRAININGS, token_savings

__all__ = ["ranking_metrics", "width_depth_test", "width_depth_metrics", "speed_metrics",
           "retraining_metrics", "RETRAINING_NAMES", "stage_metrics", "best_compressed_drafter",
           "drafter_metrics"]

INTERVAL_COLUMNS = ("lm_loss", "lm_loss_sd", "lm_loss_lo", "lm_loss_hi")


def _row(table: pd.DataFrame, key, what: str) -> pd.Series:
    if key not in table.index:
        raise ValueError(f"{what} has no row {key!r}; rows: {list(table.index)}")
    return table.loc[key]


def ranking_metrics(ablation: pd.DataFrame) -> dict:
    """From ``studies.ranking_ablation``'s table: the LM loss right after pruning with the
    default activation ranking (L2 over the batch, mean over the sequence), the best
    activation ranking, weight magnitude and random (its mean and sd over the draws), each
    where the ablation ran it (``rankings``: a ranking left out leaves its metrics out)."""
    by = ablation.set_index("ranking")
    activation = by[by.index.str.startswith("activation")]["lm_loss"]
    out = {}
    if "activation l2/mean" in by.index:
        out["loss_after_prune_l2mean"] = by.loc["activation l2/mean", "lm_loss"]
    if not activation.empty:
        out["loss_after_prune_best_activation"] = activation.min()
    if "random" in by.index:
        out["loss_after_prune_random"] = by.loc["random", "lm_loss"]
        out["loss_after_prune_random_sd"] = by.loc["random", "lm_loss_sd"]
    if "weight magnitude" in by.index:
        out["loss_after_prune_magnitude"] = by.loc["weight magnitude", "lm_loss"]
    return out


def width_depth_test(per_seed: pd.DataFrame) -> dict:
    """Width minus depth LM loss after distillation, paired over seeds
    (``stats.paired_difference``: ``diff``, ``lo``, ``hi``, ``significant``), from
    ``studies.width_against_depth``'s one row per (kind, stage, seed)."""
    distilled = per_seed[per_seed["stage"] == "after distillation"].pivot(
        index="seed", columns="kind", values="lm_loss")
    missing = {"width", "depth"} - set(distilled.columns)
    if missing:
        raise ValueError(f"no distilled {sorted(missing)} student in the width-against-depth "
                         f"table; kinds: {sorted(distilled.columns)}")
    return paired_difference(distilled["width"], distilled["depth"])


def width_depth_metrics(summary: pd.DataFrame, test: dict) -> dict:
    """From the width-against-depth summary (``stats.summarize_column`` by kind and stage) and
    its paired ``test``: each student's loss after pruning, its loss after distillation with
    sd and interval, and the difference."""
    after = summary.set_index(["kind", "stage"])
    out = {f"loss_{kind}_pruned": _row(after, (kind, "after pruning"),
                                       "the width-against-depth summary")["lm_loss"]
           for kind in ("width", "depth")}
    for kind in ("width", "depth"):
        row = _row(after, (kind, "after distillation"), "the width-against-depth summary")
        out.update({f"loss_{kind}_distilled{column[7:]}": row[column]
                    for column in INTERVAL_COLUMNS})
    return {**out, "width_minus_depth_loss": test["diff"], "width_minus_depth_loss_lo": test["lo"],
            "width_minus_depth_loss_hi": test["hi"],
            "width_depth_differ_significant": test["significant"]}


def speed_metrics(speed: pd.DataFrame, batch: int, names: dict[str, str]) -> dict:
    """``throughput_ratio_<key>``: the tokens/s ratio to the teacher at ``batch`` of the model
    ``names[key]`` names in ``evaluate.decode_throughput``'s table; and
    ``throughput_disturbed_share``, the share of that batch's timed repeats other work
    disturbed, where the table has it."""
    at = speed[speed["batch"] == batch].set_index("model")
    if at.empty:
        raise ValueError(f"the decode-speed table has no batch {batch}; batches: "
                         f"{sorted(int(b) for b in speed['batch'].unique())}")
    out = {f"throughput_ratio_{key}": _row(at, name, f"batch {batch} of the decode-speed "
                                                     "table")["ratio"]
           for key, name in names.items()}
    if "disturbed_share" in at:  # the share of the timed repeats other work disturbed
        out["throughput_disturbed_share"] = float(at["disturbed_share"].iloc[0])
    return out


RETRAINING_NAMES = {RETRAININGS[0]: "student_kd", RETRAININGS[1]: "student_kd_hidden",
                    RETRAININGS[2]: "student_ce", RETRAININGS[3]: "scratch"}
"""Each retraining run of `studies.RETRAININGS` as its metrics name it."""


def retraining_metrics(table: pd.DataFrame, tests: dict, curves: pd.DataFrame, *,
                       params_teacher: int, params_student: int, eval_problems: int,
                       seeds: int) -> dict:
    """From ``retraining_summary.retraining_summary``'s table (one row per retraining run and
    the teacher), the KD-against-CE ``tests`` (``retraining_summary.kd_against_ce``) and the
    study's ``curves`` (``studies.retraining_study``): the parameters, the teacher's accuracy
    and LM loss, the counts of held-out problems and ``seeds``; per run of
    :data:`RETRAINING_NAMES` that ran (the hidden-state run only with layer pairs) its
    accuracy with sd and interval and its LM loss with sd, named ``accuracy_<name>``,
    ``accuracy_<name>_sd``, ``_lo``, ``_hi``, ``loss_<name>``, ``loss_<name>_sd``; then the
    ``tests`` and ``studies.token_savings`` of the curves."""
    t = table.set_index("run")
    _row(t, "teacher", "the retraining table")
    out = {"params_teacher": params_teacher, "params_student": params_student,
           "accuracy_teacher": t.loc["teacher", "accuracy"],
           "loss_teacher": t.loc["teacher", "lm_loss"],
           "eval_problems": eval_problems, "seeds": seeds}
    for run, name in RETRAINING_NAMES.items():
        if run in t.index:
            out.update({f"accuracy_{name}": t.loc[run, "accuracy"],
                        **{f"accuracy_{name}_{k}": t.loc[run, f"accuracy_{k}"]
                           for k in ("sd", "lo", "hi")},
                        f"loss_{name}": t.loc[run, "lm_loss"],
                        f"loss_{name}_sd": t.loc[run, "lm_loss_sd"]})
    return {**out, **tests, **token_savings(curves)}


def stage_metrics(table: pd.DataFrame, stages, saturation: int) -> dict:
    """From ``evaluate.compare_models``' table (with the accuracy over seeds merged in) and the
    pipeline's ``stages`` (``.name``, ``.params``): the teacher's and every stage's parameters
    and accuracy (with sd and interval), each stage's tokens/s ratio at the ``saturation``
    batch and its ideal speedup (FLOPs); ``throughput_disturbed_share``, the share of that
    batch's timed repeats other work disturbed, where the table has it."""
    t = table.set_index("model")
    teacher = _row(t, "teacher", "the models table")
    out = {"params_teacher": int(teacher["params"]), "accuracy_teacher": teacher["accuracy"]}
    for s in stages:
        row = _row(t, s.name, "the models table")
        out.update({f"params_{s.name}": s.params,
                    **{f"accuracy_{s.name}{k}": row[f"accuracy{k}"]
                       for k in ("", "_sd", "_lo", "_hi")},
                    f"throughput_ratio_{s.name}": row[f"speedup_b{saturation}"],
                    f"ideal_speedup_{s.name}": row["ideal_speedup"]})
    if f"disturbed_share_b{saturation}" in t:  # the timed repeats other work disturbed
        out["throughput_disturbed_share"] = float(teacher[f"disturbed_share_b{saturation}"])
    return out


def best_compressed_drafter(bridge: pd.DataFrame) -> pd.Series:
    """The row of ``sd_sweep``'s drafter table with the highest median speedup among the
    compressed drafters (rows ``"compressed <name>"``); its ``name`` is the drafter's row."""
    b = bridge.set_index("drafter")
    compressed = b[b.index.str.startswith("compressed ")]
    if compressed.empty:
        raise ValueError(f"the drafter table has no compressed drafter; rows: {list(b.index)}")
    return compressed.loc[compressed["speedup"].idxmax()]


def drafter_metrics(bridge: pd.DataFrame, first: str, candidates: list[str]) -> dict:
    """From ``sd_sweep``'s table of the compressed drafters (rows ``"compressed <name>"``) and
    the small LM (row ``"small LM"``, when measured): tau and speedup of the first stage's
    student, of every candidate, of the best compressed one (its name too), and of the small
    LM; ``lossless``: every row token-identical to plain decoding."""
    b = bridge.set_index("drafter")
    best = best_compressed_drafter(bridge).name
    first_row = _row(b, f"compressed {first}", "the drafter table")
    out = {"accept_len_compressed_drafter": first_row["tau"],
           "speedup_compressed_drafter": first_row["speedup"]}
    for name in candidates:
        row = _row(b, f"compressed {name}", "the drafter table")
        out.update({f"accept_len_drafter_{name}": row["tau"],
                    f"speedup_drafter_{name}": row["speedup"]})
    out.update(best_compressed_drafter=best.removeprefix("compressed "),
               speedup_best_compressed_drafter=b.loc[best, "speedup"],
               accept_len_best_compressed_drafter=b.loc[best, "tau"])
    if "small LM" in b.index:
        out.update(accept_len_small_lm_drafter=b.loc["small LM", "tau"],
                   speedup_small_lm_drafter=b.loc["small LM", "speedup"])
    return {**out, "lossless": bool(bridge["identical"].all())}
