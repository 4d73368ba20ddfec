"""Minitron's headline at our scale: how many of the teacher's pretraining tokens does a pruned
student need, distilled, to come back to the teacher's held-out accuracy, and what does the same
architecture reach from scratch on the same tokens?

*Token budget*: a fraction of the teacher's pretraining tokens (``train_tokens`` of the
teacher's ``provenance.json``, or a number the caller gives). Tokens are counted the way the
teacher's recipe counted them (``lm_train.response_lm_loss``): the tokens of each padded batch's
sequences, prompt, response and stop token, padding excluded (the batch's attention-mask sum).
The batches are built the teacher's way too (``lm_train.length_batches``: similar lengths under
``tokens_per_batch`` padded tokens, 4,096 for the default policy), from problems neither the
teacher nor the held-out set saw (``CALIBRATION_SEED``), so a budget of 1% is about 1% of the
teacher's optimizer steps. A run trains on its seed's batches, in order, until its tokens first
reach the budget (:func:`steps_for`), so every budget is a separate run with its own warm-up +
cosine horizon, and a smaller budget's batches are the first ones of a larger budget's.

:func:`budget_study` writes one row per (method, budget, seed) atomically after each run, and
a second call skips the rows already there (resumable per row; within a row the distiller's
own checkpoint resumes). :func:`~.budget_summary.budget_summary` puts error bars on the table.
"""
from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pandas as pd

from ..checks import check_int
from ..lm_train import length_batches
from ..results import read_table, write_table
from .data import CALIBRATION_SEED, check_seeds, lm_loss, pad_id, sequences_from, token_batches
from .distill import DistillConfig, Distiller, scratch_like
from .retraining_summary import problem_rewards

__all__ = ["METHODS", "COLUMNS", "teacher_tokens", "check_budgets", "budget_batches",
           "batch_tokens", "steps_for", "budget_study"]

METHODS = ("kd", "scratch")
"""How `budget_study` trains a student at each token budget: distilled from the teacher, or
from scratch."""
COLUMNS = ["method", "budget_fraction", "tokens", "steps", "seed", "accuracy", "lm_loss",
           "kept_step", "rewards"]
"""The columns of `budget_study`'s table, in order."""
KEY = ["method", "budget_fraction", "seed"]


def teacher_tokens(teacher_dir: str | os.PathLike | None = None,
                   tokens: int | None = None) -> int:
    """The teacher's pretraining tokens: ``train_tokens`` of ``<teacher_dir>/provenance.json``
    when that file exists, else ``tokens``; ``ValueError`` naming both when neither gives
    one, or when they disagree."""
    if tokens is not None:
        check_int("teacher_tokens", tokens, 1)
    path = Path(teacher_dir) / "provenance.json" if teacher_dir is not None else None
    if path is not None and path.is_file():
        recorded = json.loads(path.read_text(encoding="utf-8")).get("train_tokens")
        if not isinstance(recorded, int) or recorded < 1:
            raise ValueError(f"{path}: train_tokens is {recorded!r}; accepted: an integer >= 1")
        if tokens is not None and tokens != recorded:
            raise ValueError(f"teacher_tokens={tokens} disagrees with {path}'s train_tokens "
                             f"{recorded}; pass one of them")
        return recorded
    if tokens is None:
        where = f"{path} does not exist" if path is not None else "teacher_dir is None"
        raise ValueError(f"the teacher's pretraining tokens are unknown: teacher_tokens is "
                         f"None and {where}; accepted: a folder with a provenance.json that "
                         f"holds train_tokens, or teacher_tokens, an integer >= 1")
    return tokens


def check_budgets(budgets) -> list[float]:
    """``budgets`` as a list of distinct fractions in (0, 1], ascending; else ``ValueError``
    naming the bad one."""
    if isinstance(budgets, (str, bytes)) or not hasattr(budgets, "__iter__"):
        raise ValueError(f"budgets {budgets!r}: accepted: a list of fractions in (0, 1]")
    out = []
    for b in budgets:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b <= 1:
            raise ValueError(f"budget {b!r} is not a fraction of the teacher's tokens in "
                             f"(0, 1]; accepted: e.g. 0.01, 0.03, 0.1")
        out.append(float(b))
    if not out or len(set(out)) != len(out):
        raise ValueError(f"budgets {list(budgets)!r}: accepted: a non-empty list of distinct "
                         "fractions in (0, 1]")
    return sorted(out)


def batch_tokens(batch) -> int:
    """A batch's tokens as the teacher's recipe counted them: its sequences' tokens, padding
    excluded (the attention mask's sum)."""
    return int(batch[1].sum())


def budget_batches(seqs, starts, tokens_per_batch: int, seed: int, pad: int) -> list[tuple]:
    """``(ids, mask, scored)`` batches of ``seqs`` the teacher's way: similar lengths under
    ``tokens_per_batch`` padded tokens, in an order drawn from ``seed``
    (``lm_train.length_batches``); ``scored`` marks each sequence's tokens from ``starts``
    on (the response and the stop token)."""
    groups = length_batches(list(zip(seqs, starts)), tokens_per_batch, seed)
    return [token_batches([seqs[i] for i in g], len(g), pad, starts=[starts[i] for i in g])[0]
            for g in groups]


def steps_for(batches, budget: int) -> tuple[int, int]:
    """``(steps, tokens)``: the fewest steps over ``batches`` (in order, cycled) whose tokens
    (:func:`batch_tokens`) reach ``budget``, and the tokens they hold."""
    check_int("budget", budget, 1)
    steps = tokens = 0
    while tokens < budget:
        tokens += batch_tokens(batches[steps % len(batches)])
        steps += 1
    return steps, tokens


def _pool(tokenizer, source, need: int, eval_size: int, max_len: int | None):
    """``(train seqs, train starts, held-out seqs, held-out starts)``: ``eval_size`` texts held
    out (the first ones of the draw), then training texts whose tokens cover ``need`` once,
    so no budget repeats a text. Draws grow until they do (the draws are prefix-stable)."""
    num = eval_size + 256
    while True:
        seqs, starts = sequences_from(source, num, tokenizer, CALIBRATION_SEED, max_len)
        have = sum(len(s) for s in seqs[eval_size:])
        if have >= need or len(seqs) < num:  # a finite source: as much as it has
            return seqs[eval_size:], starts[eval_size:], seqs[:eval_size], starts[:eval_size]
        num = eval_size + math.ceil((num - eval_size) * 1.1 * need / have)


def _read_done(out: Path) -> pd.DataFrame:
    """The rows ``out`` already holds (none when it does not exist), columns checked."""
    if not out.exists():
        return pd.DataFrame(columns=COLUMNS)
    done = read_table(pd.read_csv(out, dtype={"rewards": str}), COLUMNS, "a budget table")
    return done[COLUMNS]


def _one_run(student, teacher, method: str, batches, held_out, config: DistillConfig,
             seed: int, state: Path, desc: str):
    """Train a copy of ``student`` (``kd``) or a fresh one of its shape (``scratch``) on
    ``batches`` for exactly their number of steps; ``(model, kept step, kept LM loss)``."""
    model = copy.deepcopy(student) if method == "kd" else scratch_like(student, seed)
    steps = len(batches)
    cfg = config.updated(mode="kd" if method == "kd" else "ce", layer_pairs=(), horizon=steps,
                         warmup=max(1, steps // 20), eval_every=max(1, math.ceil(steps / 5)),
                         seed=seed)
    distiller = Distiller(model, teacher if method == "kd" else None, batches, cfg, held_out,
                          checkpoint_dir=state, desc=desc)
    distiller.run()
    distiller.trainer.discard_checkpoint()
    evals = distiller.evals
    return model, distiller.restored, float(evals.loc[evals["best"], "eval_loss"].iloc[0])


def _row(method, fraction, tokens, steps, seed, model, tokenizer, problems, max_new_tokens,
         kept_step, loss) -> dict:
    rewards = problem_rewards(model, tokenizer, problems, max_new_tokens)
    return {"method": method, "budget_fraction": fraction, "tokens": tokens, "steps": steps,
            "seed": seed, "accuracy": float(rewards.mean()), "lm_loss": loss,
            "kept_step": kept_step, "rewards": "".join("1" if r > 0 else "0" for r in rewards)}


def _check_study(budgets, seeds, methods, tokens_per_batch: int, out) -> tuple:
    """``budget_study``'s arguments checked before anything is trained or written: the
    budgets and seeds as ``check_budgets`` and ``check_seeds`` return them, and ``out`` as
    a ``Path`` to a ``.csv``."""
    fractions, seeds = check_budgets(budgets), check_seeds(seeds)
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods {list(methods)!r}: accepted: a non-empty subset of {METHODS}")
    check_int("tokens_per_batch", tokens_per_batch, 1)
    out = Path(out)
    if out.suffix.lower() != ".csv":
        raise ValueError(f"out {str(out)!r}: accepted: a path ending in .csv")
    return fractions, seeds, out


def budget_study(teacher, student, tokenizer, problems, out: str | os.PathLike, budgets,
                 seeds=(0,), *, teacher_dir: str | os.PathLike | None = None,
                 tokens: int | None = None, source: str | os.PathLike = "running_sum",
                 tokens_per_batch: int = 4096, config: DistillConfig | None = None,
                 methods=METHODS, eval_size: int = 64, max_len: int | None = 512,
                 max_new_tokens: int = 256, progress: bool = True) -> pd.DataFrame:
    """KD of ``student`` (a pruned ``teacher``) and the same architecture from scratch
    (random init, cross-entropy), each at every token budget of ``budgets`` (fractions of the
    teacher's pretraining tokens, :func:`teacher_tokens`) and every seed of ``seeds`` (the
    seed orders the batches and draws the scratch weights); ``config`` gives the optimizer
    (peak lr, lr floor, temperature...; its horizon is each run's steps, its warm-up 5% of
    them (at least one) and its held-out evaluations five per run). Greedy accuracy on ``problems``; LM loss on ``eval_size`` held-out texts
    (of the kept weights: each run keeps its best held-out evaluation).

    Returns the tidy table also written to ``out`` (a ``.csv``) after every run: one row per
    (method, budget_fraction, seed) with ``tokens`` (:func:`batch_tokens` summed), ``steps``,
    ``accuracy``, ``lm_loss``, ``kept_step`` and ``rewards`` (the per-problem 0/1 rewards as
    a string, for the two-level bootstrap), and one ``teacher`` row (budget 1.0). Rows
    already in ``out`` are not rerun."""
    fractions, seeds, out = _check_study(budgets, seeds, methods, tokens_per_batch, out)
    total = teacher_tokens(teacher_dir, tokens)
    done = _read_done(out)
    config = config if config is not None else DistillConfig()
    seqs, starts, held, held_starts = _pool(tokenizer, source, math.ceil(max(fractions) * total),
                                            eval_size, max_len)
    pad = pad_id(tokenizer)
    held_out = token_batches(held, 16, pad, starts=held_starts)
    rows, keys = done.to_dict("records"), set(map(tuple, done[KEY].itertuples(index=False)))
    states = out.with_name(out.stem + ".state")  # a checkpoint per run, gone once it is done

    def save(row):
        rows.append(row)
        keys.add((row["method"], row["budget_fraction"], row["seed"]))
        write_table(pd.DataFrame(rows, columns=COLUMNS), out)

    if not any(key[0] == "teacher" for key in keys):  # greedy: one run, seed 0
        save(_row("teacher", 1.0, total, None, 0, teacher, tokenizer, problems,
                  max_new_tokens, None, lm_loss(teacher, held_out)))
    for seed in seeds:
        batches = budget_batches(seqs, starts, tokens_per_batch, seed, pad)
        for fraction in fractions:
            steps, used = steps_for(batches, math.ceil(fraction * total))
            for method in methods:
                if (method, fraction, seed) in keys:
                    continue
                name = f"{method}_{fraction:g}_seed{seed}"
                model, kept, loss = _one_run(
                    student, teacher, method, [batches[s % len(batches)] for s in range(steps)],
                    held_out, config.updated(progress=progress), seed,
                    states / name, name)
                save(_row(method, fraction, used, steps, seed, model, tokenizer, problems,
                          max_new_tokens, kept, loss))
    if states.is_dir() and not any(states.iterdir()):
        states.rmdir()
    return pd.DataFrame(rows, columns=COLUMNS)
