"""Token sequences for compression: calibration and distillation sets, padded batches, LM loss.

Importance, distillation and evaluation all read token sequences drawn from one of three
sources: an embedded task, a JSONL task file of ``{"prompt", "answer"}`` lines (a
``reference`` key adds a worked solution), or a plain text file (one example per non-empty
line). The set's size is a parameter; an empty set is refused before any model runs.

A task's example is what its policy reads and writes in a rollout (:func:`task_sequence`): the
prompt's tokens as the rollout engine encodes a prompt, then the response's tokens (the
problem's reference trace when it has one, else its answer), then the stop token that ends a
rollout. The losses score the response and the stop token, never the prompt (a policy is
trained on responses; the embedded task's prompts are random numbers no model can predict); a
text file's every token is scored. :func:`sequences_from` returns each sequence's first scored
position, and :func:`token_batches` turns it into a third tensor, the scored-token mask, that
:func:`lm_loss` and the distiller read. Distillation on fewer than :data:`MIN_SCORED_TOKENS`
scored tokens is refused (:func:`distill_data`): a few dozen answer tokens make any comparison
of students noise.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from ..checks import check_int
from ..progress import tqdm

from ..tasks import TASKS, get_problems

__all__ = ["MIN_SCORED_TOKENS", "accuracy_task", "task_sequence", "sequences_from", "distill_data",
           "seeded_order", "check_seeds",
           "budget_tokens", "lm_loss"]

# problems for calibration and distillation: neither the policy's training data, the RL pool
# nor the held-out set (tasks.TRAIN_SEED / RL_SEED / HELDOUT_SEED)
CALIBRATION_SEED = 3_000_017

# the fewest scored tokens distillation trains on: below this, students differ by noise
MIN_SCORED_TOKENS = 2_000
"""The fewest scored tokens distillation trains on: below this, students differ by noise."""

def is_task(source) -> bool:
    """Whether ``source`` is a task (an embedded task name or a ``.jsonl`` file), not a text
    file."""
    return ((isinstance(source, str) and source in TASKS)
            or (isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() == ".jsonl"))


def accuracy_task(source) -> str | os.PathLike:
    """The task whose held-out problems judge accuracy when compressing on ``source``: the
    task itself, or the embedded running sum for a text file (a text has no answers)."""
    return source if is_task(source) else "running_sum"


def task_sequence(prompt: str, response: str, tokenizer) -> tuple[list[int], int]:
    """``(ids, start)``: one example as a policy sees it in a rollout. The prompt's tokens
    exactly as :meth:`workbench.rollout.RolloutEngine.encode` makes them
    (``tokenizer(prompt)``, BOS where the tokenizer adds one), the response's tokens after
    them (no special tokens: the policy writes them one by one), then the stop token that
    ends a rollout (EOS; none when the tokenizer has none, as the engine then never stops).
    ``start`` is the first response token's position: the losses score from there on."""
    prompt_ids = list(tokenizer(prompt)["input_ids"])
    response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    stop = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    return prompt_ids + response_ids + stop, len(prompt_ids)


def _task_sequences(source, num: int, seed: int, tokenizer) -> list[tuple[list[int], int]]:
    """The problems' prompt-response sequences; the response is the reference trace when
    the problem has one, else its answer."""
    named = isinstance(source, str) and source in TASKS
    problems = get_problems(source, num, seed) if named else get_problems(source, num)
    return [task_sequence(p.prompt, p.reference or p.answer, tokenizer) for p in problems]


def _text_sequences(source, num: int, tokenizer) -> list[tuple[list[int], int]]:
    """One sequence per non-empty line, every token scored (from position 1: the first
    token has nothing before it to be predicted from)."""
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"unknown text source {str(source)!r}; accepted: a task name "
                         f"{sorted(TASKS)}, a .jsonl task file of {{\"prompt\", \"answer\"}} "
                         "lines, or a text file")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(list(tokenizer(line)["input_ids"]), 1) for line in lines[:num]]


def sequences_from(source: str | os.PathLike, num: int, tokenizer, seed: int = CALIBRATION_SEED,
                   max_len: int | None = None) -> tuple[list[list[int]], list[int]]:
    """``(token ids, first scored position)`` of ``num`` examples of ``source``, each cut to
    ``max_len`` tokens: a task's prompt then response then stop token
    (:func:`task_sequence`; scored from the response on), or a text file's lines (every
    token scored). Raises ``ValueError`` naming the source when it yields nothing to
    predict."""
    check_int("the set's size", num, 1)
    pairs = (_task_sequences(source, num, seed, tokenizer) if is_task(source)
             else _text_sequences(source, num, tokenizer))
    if not pairs:
        raise ValueError(f"empty calibration/text set: {str(source)!r} gave no text")
    seqs = [ids[:max_len] for ids, _ in pairs]
    if not any(len(s) > 1 for s in seqs):
        raise ValueError(f"every example of {str(source)!r} encodes to at most one token: "
                         "nothing to predict")
    return seqs, [start for _, start in pairs]


def scored_tokens(seqs: list[list[int]], starts: list[int]) -> int:
    """Tokens the losses score over ``seqs``: from each one's first scored position on (never
    position 0, which nothing predicts), as ``token_batches``' mask counts them."""
    return sum(max(0, len(s) - max(start, 1)) for s, start in zip(seqs, starts))


def pad_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS (many causal LM
    tokenizers have no pad token), else 0; padding is masked out, so any id will do."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0


def token_batches(seqs: list[list[int]], batch_size: int, pad_id: int, device=None,
                  starts: list[int] | None = None) -> list[tuple]:
    """``(ids, mask)`` batches of right-padded sequences, sorted by length (little padding);
    with ``starts`` (first scored position per sequence) ``(ids, mask, scored)``."""
    if not seqs:
        raise ValueError("empty calibration/text set: no sequences to batch")
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = []
    for s in range(0, len(order), batch_size):
        rows = order[s:s + batch_size]
        width = max(len(seqs[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, i in enumerate(rows):
            ids[r, :len(seqs[i])] = torch.tensor(seqs[i], dtype=torch.long)
            mask[r, :len(seqs[i])] = 1
        batch = (ids.to(device), mask.to(device))
        if starts is not None:
            scored = mask.clone()
            for r, i in enumerate(rows):
                scored[r, :starts[i]] = 0
            batch += (scored.to(device),)
        out.append(batch)
    return out


def _check_enough(source, seqs, starts, max_len) -> None:
    """Refuse training texts that hold fewer than :data:`MIN_SCORED_TOKENS` scored tokens,
    saying how many there are, how many are needed, and what would give more."""
    have = scored_tokens(seqs, starts)
    if have >= MIN_SCORED_TOKENS:
        return
    what = ("response and stop tokens (prompts are not scored)" if is_task(source)
            else "tokens")
    was_cut = max_len is not None and any(len(s) >= max_len for s in seqs)
    cut = f", or a max_len above {max_len} (some examples were cut to it)" if was_cut else ""
    raise ValueError(
        f"{str(source)!r}: the {len(seqs)} training texts hold {have:,} scored {what}; "
        f"distillation needs at least {MIN_SCORED_TOKENS:,} to mean anything. Use more "
        f"examples (num / train_size), a task with longer responses (a JSONL line's "
        f"'reference' key holds a worked solution, scored in place of the bare answer){cut}")


def distill_data(tokenizer, source: str | os.PathLike = "running_sum", num: int = 256,
                 eval_num: int = 32, batch_size: int = 16, seed: int = 0,
                 max_len: int | None = None) -> tuple[list, list]:
    """``(train batches, held-out batches)`` of ``(ids, mask, scored)`` from ``source``
    (:func:`sequences_from`, scored: a task's responses and stop tokens, a text file's every
    token): ``num + eval_num`` examples, the last ``eval_num`` held out. Training texts with
    fewer than :data:`MIN_SCORED_TOKENS` scored tokens are refused. Train batches hold
    sequences of similar length (little padding), in an order drawn from ``seed``, so that
    consecutive steps see a mix of lengths."""
    check_int("num", num, 1)
    check_int("eval_num", eval_num, 0)
    seqs, starts = sequences_from(source, num + eval_num, tokenizer, max_len=max_len)
    if len(seqs) < num + eval_num:
        raise ValueError(f"{str(source)!r} gave {len(seqs)} texts; {num} to train on and "
                         f"{eval_num} held out need {num + eval_num}")
    _check_enough(source, seqs[:num], starts[:num], max_len)

    def batched(part):
        return (token_batches(seqs[part], batch_size, pad_id(tokenizer), starts=starts[part])
                if seqs[part] else [])

    return seeded_order(batched(slice(0, num)), seed), batched(slice(num, num + eval_num))


def seeded_order(batches: list, seed: int) -> list:
    """``batches`` in an order drawn from ``seed`` (a permutation, each batch once): what a
    seed changes in a distillation run's data, beside its initialisations."""
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed))
    return [batches[i] for i in order]


def check_seeds(seeds) -> list[int]:
    """``seeds`` as a list of distinct ints >= 0, at least one; else ``ValueError`` naming it."""
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise ValueError(f"seeds {seeds!r}: accepted: a list of distinct integers >= 0")
    out = [check_int(f"seeds[{i}]", s, 0) for i, s in enumerate(seeds)]
    if not out or len(set(out)) != len(out):
        raise ValueError(f"seeds {list(seeds)!r}: accepted: a non-empty list of distinct "
                         "integers >= 0")
    return out


def budget_tokens(batches, steps: int) -> int:
    """Training tokens (scored targets) that ``steps`` steps over ``batches`` (cycled, one
    batch a step) see: the token budget stated beside every comparison."""
    total = 0
    for step in range(steps):
        ids, mask, *scored = batches[step % len(batches)]
        total += int((scored[0] if scored else mask)[:, 1:].sum())
    return total


@torch.no_grad()
def lm_loss(model, batches, progress: bool = False, desc: str = "LM loss") -> float:
    """Token-mean next-token cross-entropy (nats) of ``model`` over ``batches`` of
    ``(ids, mask)`` or ``(ids, mask, scored)`` (only scored tokens count); ``math.exp`` of it
    is the perplexity."""
    device = model.get_input_embeddings().weight.device
    total, count = 0.0, 0
    for ids, mask, *scored in tqdm(batches, desc=desc, disable=not progress):
        ids, mask = ids.to(device), mask.to(device)
        keep = (scored[0] if scored else mask).to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = ids[:, 1:].masked_fill(keep[:, 1:] == 0, -100)
        total += float(F.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                       ignore_index=-100, reduction="sum"))
        count += int((target != -100).sum())
    if count == 0:
        raise ValueError("no tokens to score: every sequence has at most one token")
    return total / count if math.isfinite(total) else float("inf")
