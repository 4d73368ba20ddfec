"""What notebooks 06 and 07 report of models trained once per seed: greedy accuracy per method
as mean ± sd over seeds with a bootstrap 95% interval (:mod:`.stats`); for a retraining study
(06) also the final LM loss, and whether KD beats plain cross-entropy beyond the noise (a
paired test on the same seeds and held-out problems)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..evaluate import evaluate_policy
from .data import lm_loss
from .stats import paired_difference, summarize, summarize_column
from .studies import RETRAININGS, tokens_to_reach

__all__ = ["problem_rewards", "final_losses", "accuracy_over_seeds", "with_accuracy_over_seeds",
           "retraining_summary", "kd_against_ce"]


def problem_rewards(model, tokenizer, problems, max_new_tokens: int = 256) -> np.ndarray:
    """``[problems]`` exact-match rewards of ``model``'s greedy responses, in ``problems``'
    order (their mean is the task accuracy)."""
    report = evaluate_policy(model, tokenizer, problems, max_new_tokens=max_new_tokens,
                             progress=False)
    return report.table["reward"].to_numpy(dtype=float)


def final_losses(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, seed) of ``curves`` (:func:`~.studies.retraining_study`): the
    training tokens and the held-out LM loss of the weights the run ends with (its ``best``
    evaluation), and the tokens it needed to reach the same seed's from-scratch final loss."""
    rows = []
    for seed, part in curves.groupby("seed", sort=False):
        scratch = part[part["run"] == RETRAININGS[3]]["lm_loss"].iloc[-1]
        for run, mine in part.groupby("run", sort=False):
            kept = mine[mine["best"].astype(bool)]
            rows.append({"run": run, "seed": seed, "tokens": mine["tokens"].iloc[-1],
                         "lm_loss": (kept if len(kept) else mine)["lm_loss"].iloc[-1],
                         "tokens_to_scratch_final": tokens_to_reach(part, run, scratch)})
    return pd.DataFrame(rows)


def accuracy_over_seeds(models: dict, tokenizer, problems,
                        max_new_tokens: int = 256) -> tuple[pd.DataFrame, dict]:
    """``(table, rewards)`` of ``models`` ``{(name, seed): model}``: per name (first order)
    the greedy accuracy on ``problems`` as the mean over its seeds with ``accuracy_sd`` (over
    seeds), ``accuracy_lo``/``accuracy_hi`` (two-level bootstrap 95%: seeds and problems
    resampled) and ``seeds``; ``rewards``: ``{name: [seeds, problems]}``."""
    rewards: dict = {}
    for (name, _), model in models.items():
        rewards.setdefault(name, []).append(problem_rewards(model, tokenizer, problems,
                                                            max_new_tokens))
    rewards = {name: np.stack(r) for name, r in rewards.items()}
    rows = []
    for name, r in rewards.items():
        s = summarize(r)
        rows.append({"name": name, "accuracy": s["mean"], "accuracy_sd": s["sd"],
                     "accuracy_lo": s["lo"], "accuracy_hi": s["hi"], "seeds": s["seeds"]})
    return pd.DataFrame(rows), rewards


def with_accuracy_over_seeds(table: pd.DataFrame, accuracy: pd.DataFrame) -> pd.DataFrame:
    """``table`` (one row per ``model``, e.g. ``evaluate.compare_models``', whose
    ``accuracy`` is one seed's) with its ``accuracy`` replaced by :func:`accuracy_over_seeds`'
    mean over seeds and its ``accuracy_sd``, ``accuracy_lo``, ``accuracy_hi`` and ``seeds``,
    matched by ``model`` against ``accuracy``'s ``name`` (a model without an accuracy row is
    dropped)."""
    return (table.drop(columns="accuracy")
            .merge(accuracy.rename(columns={"name": "model"}), on="model"))


def retraining_summary(curves: pd.DataFrame, models: dict, teacher, tokenizer, held_out,
                       problems, max_new_tokens: int = 256) -> tuple[pd.DataFrame, dict]:
    """``(table, rewards)``. ``table``: per retraining run and for the teacher, the training
    tokens, the final held-out LM loss and the greedy accuracy on ``problems``, each as the
    mean over seeds with ``_sd`` (over seeds) and ``_lo``/``_hi`` (bootstrap 95%; accuracy's
    resamples seeds and problems), the tokens to reach scratch's final loss (mean), and
    ``seeds``. ``rewards``: ``{run: [seeds, problems]}`` rewards, the teacher's ``[1,
    problems]`` (greedy: one seed), for :func:`kd_against_ce`."""
    per_seed = final_losses(curves)
    table = summarize_column(per_seed, "run", "lm_loss").drop(columns="seeds")
    means = per_seed.groupby("run", sort=False)[["tokens", "tokens_to_scratch_final"]].mean()
    table = table.join(means, on="run")
    teacher_loss = lm_loss(teacher, held_out)
    table.loc[len(table)] = {"run": "teacher", "lm_loss": teacher_loss, "lm_loss_sd": 0.0,
                             "lm_loss_lo": teacher_loss, "lm_loss_hi": teacher_loss, "tokens": 0}
    runs = {(run, seed): models[run, seed] for run, seed in zip(per_seed["run"], per_seed["seed"])}
    acc, rewards = accuracy_over_seeds({**runs, ("teacher", 0): teacher}, tokenizer, problems,
                                       max_new_tokens)
    return table.merge(acc.rename(columns={"name": "run"}), on="run"), rewards


def kd_against_ce(rewards: dict) -> dict:
    """Each KD run of ``rewards`` (:func:`retraining_summary`) against plain CE on the same
    seeds and problems: ``<kd>_minus_ce_accuracy`` with ``_lo``/``_hi`` (paired bootstrap 95%,
    :data:`~.stats.TEST`) and ``<kd>_beats_ce_significant`` (the whole interval above 0), with
    ``<kd>`` ``kd`` (logits) and ``kd_hidden`` (logits + hidden states, when it ran)."""
    out = {}
    for key, run in (("kd", RETRAININGS[0]), ("kd_hidden", RETRAININGS[1])):
        if run not in rewards:
            continue
        d = paired_difference(rewards[run], rewards[RETRAININGS[2]])
        out.update({f"{key}_minus_ce_accuracy": d["diff"], f"{key}_minus_ce_accuracy_lo": d["lo"],
                    f"{key}_minus_ce_accuracy_hi": d["hi"],
                    f"{key}_beats_ce_significant": d["lo"] > 0})
    return out
