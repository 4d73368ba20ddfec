"""The one table that compares a teacher with its compressed students (issue #10, item 6).

Each model gets: parameters, FLOPs per token (the ideal speedup of a pruned model is the
FLOPs ratio), LM loss and perplexity on held-out task text (and on any text file), greedy task
accuracy, and decode tokens/s through the rollout engine at the batch sizes asked for. Decode
speed is measured side by side (:mod:`workbench.speedup`): at each batch size every model
decodes the same prompts once per repeat, the order rotating, each row to the same number of
tokens (``ignore_eos``); a model's ratio is the median of its per-repeat tokens/s ratios to the
teacher, with min-max and spread. :func:`saturation_batch` finds the batch size where the
teacher's tokens/s stops rising on this machine, the batch where compute, not per-layer
overhead, decides speed.
"""
from __future__ import annotations

import math
import time

import pandas as pd
from ..progress import tqdm

from ..checks import check_int, check_non_negative
from ..evaluate import evaluate_policy
from ..rollout import RolloutConfig, RolloutEngine
from ..speedup import disturbed_share, interleave, per_repeat_ratios, spread_stats
from ..tasks import HELDOUT_SEED, get_problems
from .data import is_task, lm_loss, pad_id, sequences_from, token_batches
from .plan import flops_per_token

__all__ = ["count_params", "steady_decode_tok_s", "saturation_batch", "decode_throughput",
           "compare_models"]


def count_params(model) -> int:
    """Parameters of ``model``, a tied embedding counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def decode_tok_s(engine: RolloutEngine, prompts, batch_size: int, max_new_tokens: int) -> float:
    """Tokens/s of one greedy wave of ``prompts[:batch_size]``, every row decoded to
    ``max_new_tokens`` (the rollout's makespan, one worker)."""
    cfg = RolloutConfig(max_new_tokens=max_new_tokens, max_batch_size=batch_size,
                        ignore_eos=True)
    res = engine.rollout(list(prompts[:batch_size]), cfg, progress=False)
    return sum(map(len, res.tokens)) / res.timeline.makespan_s


def _prompts(n: int) -> list[str]:
    return [p.prompt for p in get_problems("running_sum", n, seed=HELDOUT_SEED)]


def steady_decode_tok_s(model, tokenizer, batch_size: int, min_seconds: float = 2.0,
                        wave_tokens: int = 64, min_waves: int = 3) -> float:
    """Greedy decode tokens/s of ``model`` at ``batch_size``, timed long enough to repeat,
    whatever tokens per row a notebook decodes: after one warm-up wave (the first calls pay
    for allocation), waves of ``wave_tokens`` tokens per row run until they have taken
    ``min_seconds`` and numbered ``min_waves``; the fastest wave's tokens/s. Other work on
    the machine only ever slows a wave down, so the fastest of several long waves is the
    figure that repeats (the median follows the machine's load), as ``timeit`` takes the
    best of its repeats. This is the teacher's figure that the FLOPs model of
    ``compress.plan_table`` scales: timed over 4 tokens (mostly prefill and scheduling
    noise), two identical smoke runs of notebook 05 once predicted throughputs 80x apart."""
    check_int("batch_size", batch_size, 1)
    check_int("wave_tokens", wave_tokens, 1)
    check_int("min_waves", min_waves, 1)
    check_non_negative("min_seconds", min_seconds)
    engine = RolloutEngine(model, tokenizer)
    prompts = _prompts(batch_size)
    decode_tok_s(engine, prompts, batch_size, wave_tokens)  # warm-up
    rates, spent = [], 0.0
    while len(rates) < min_waves or spent < min_seconds:
        start = time.perf_counter()
        rates.append(decode_tok_s(engine, prompts, batch_size, wave_tokens))
        spent += time.perf_counter() - start
    return max(rates)


def saturation_batch(model, tokenizer, max_batch: int = 1024, gain: float = 1.05,
                     max_new_tokens: int = 64, repeats: int = 3, progress: bool = True):
    """``(batch, table)``: the sweep of median tokens/s over batch sizes doubling from 1 to
    ``max_batch``, and the smallest batch size within ``gain`` of the best tokens/s of the
    sweep: where tokens/s stops rising. The whole sweep runs, so one noisy doubling cannot end
    it early; ``batch == max_batch`` means tokens/s was still rising at the cap."""
    engine = RolloutEngine(model, tokenizer)
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    prompts = _prompts(sizes[-1])
    decode_tok_s(engine, prompts, 1, 8)  # warm-up
    rows = []
    for bs in tqdm(sizes, desc="saturation sweep", disable=not progress):
        runs = [decode_tok_s(engine, prompts, bs, max_new_tokens) for _ in range(repeats)]
        rows.append({"batch": bs, "tok_s": float(pd.Series(runs).median())})
    table = pd.DataFrame(rows)
    best = table["tok_s"].max()
    batch = int(table[table["tok_s"] * gain >= best]["batch"].iloc[0])
    return batch, table


def decode_throughput(models: dict, tokenizer, batch_sizes, max_new_tokens: int = 64,
                      repeats: int = 3, progress: bool = True) -> pd.DataFrame:
    """Per (batch size, model): median tokens/s and the ratio to the first model (the
    teacher) with its spread; the models alternate inside each repeat. ``disturbed_share``:
    the share of the batch size's repeats that other work disturbed (redone, then flagged:
    ``speedup.interleave``); the tokens/s are on the rollouts' own clock (sim, locally)."""
    names = list(models)
    engines = {n: RolloutEngine(m, tokenizer) for n, m in models.items()}
    prompts = _prompts(max(batch_sizes))
    rows = []
    for bs in tqdm(batch_sizes, desc="decode tokens/s", disable=not progress):
        systems = {n: (lambda e=e: decode_tok_s(e, prompts, bs, max_new_tokens))
                   for n, e in engines.items()}
        runs = interleave(systems, repeats, measure=lambda out, s: out, higher_is_better=True,
                          warmup=1)
        ratios = per_repeat_ratios(runs, names[0])
        disturbed = disturbed_share(runs)  # the batch size's share of disturbed repeats
        for n in names:
            mine = ratios[ratios["system"] == n]
            stats = spread_stats(mine["ratio"])
            rows.append({"batch": bs, "model": n, "tok_s": float(mine["value"].median()),
                         "ratio": stats["ratio"], "ratio_min": stats["ratio_min"],
                         "ratio_max": stats["ratio_max"], "spread": stats["spread"],
                         "spread_wide": stats["spread_wide"], "disturbed_share": disturbed})
    return pd.DataFrame(rows)


def _quality(model, tokenizer, task_batches, text_batches, problems, max_new_tokens) -> dict:
    loss = lm_loss(model, task_batches)
    row = {"lm_loss_task": loss, "ppl_task": math.exp(loss)}
    if text_batches is not None:
        text = lm_loss(model, text_batches)
        row.update(lm_loss_text=text, ppl_text=math.exp(text))
    rep = evaluate_policy(model, tokenizer, problems, max_new_tokens=max_new_tokens,
                          progress=False)
    return {**row, "accuracy": rep.summary()["accuracy"]}


def _scored_batches(source, num: int, tokenizer, seed: int) -> list:
    seqs, starts = sequences_from(source, num, tokenizer, seed)
    return token_batches(seqs, 32, pad_id(tokenizer), starts=starts)


def compare_models(models: dict, tokenizer, batch_sizes=(1, 32), text_file=None,
                   num: int = 200, max_new_tokens: int = 256, decode_tokens: int = 64,
                   repeats: int = 3, progress: bool = True,
                   task="running_sum") -> pd.DataFrame:
    """One row per model (the first is the teacher): params, FLOPs per token and their ratios
    to the teacher, LM loss / perplexity on the responses of ``num`` held-out problems of
    ``task`` (a task name or a JSONL file, whose first ``num`` lines it takes) and on every
    token of ``text_file``, greedy accuracy on those problems, and decode tokens/s with its
    measured ratio (spread included) at each of ``batch_sizes``."""
    if not models:
        raise ValueError("models is empty: pass {name: model}, the teacher first")
    if not is_task(task):
        raise ValueError(f"task {str(task)!r} is not a task; accepted: a task name or a .jsonl "
                         "file of {\"prompt\", \"answer\"} lines (a text file goes to text_file)")
    task_b = _scored_batches(task, num, tokenizer, HELDOUT_SEED)  # scored: the responses
    text_b = (_scored_batches(text_file, num, tokenizer, HELDOUT_SEED)
              if text_file is not None else None)
    problems = get_problems(task, num, seed=HELDOUT_SEED)
    rows = []
    for name, m in tqdm(models.items(), desc="quality", disable=not progress):
        rows.append({"model": name, "params": count_params(m),
                     "flops_per_token": flops_per_token(m.config),
                     **_quality(m, tokenizer, task_b, text_b, problems, max_new_tokens)})
    table = pd.DataFrame(rows).set_index("model")
    teacher = table.iloc[0]
    table["params_ratio"] = table["params"] / teacher["params"]
    table["ideal_speedup"] = teacher["flops_per_token"] / table["flops_per_token"]
    speed = decode_throughput(models, tokenizer, batch_sizes, decode_tokens, repeats, progress)
    for bs, part in speed.groupby("batch"):
        part = part.set_index("model")
        table[f"tok_s_b{bs}"] = part["tok_s"]
        table[f"speedup_b{bs}"] = part["ratio"]
        table[f"speedup_b{bs}_range"] = [f"{a:.2f}-{b:.2f}" + (" WIDE" if w else "")
                                         for a, b, w in zip(part["ratio_min"], part["ratio_max"],
                                                            part["spread_wide"])]
        table[f"disturbed_share_b{bs}"] = part["disturbed_share"]
    return table.reset_index()
