"""Text for compression: calibration and distillation sets, padded batches, and LM loss.

Importance, distillation and evaluation all read token sequences drawn from one of three
sources: an embedded task (each problem's prompt followed by its worked solution), a JSONL
task file (prompt followed by answer), or a plain text file (one example per non-empty line).
The set's size is a parameter; an empty set is refused before any model runs.

LM loss is scored where the text is meant to be modelled: for task sources, the response (the
worked solution after the prompt; a policy is trained on responses, and its prompts are random
numbers no model can predict); for text files, every token. :func:`sequences_from` returns the
first scored position of each sequence, and :func:`token_batches` then adds a third tensor, the
scored-token mask, that :func:`lm_loss` reads.
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

__all__ = ["CALIBRATION_SEED", "texts_from", "sequences_from", "encode_texts", "token_batches",
           "distill_data", "budget_tokens", "lm_loss"]

# problems for calibration and distillation: neither the policy's training data, the RL pool
# nor the held-out set (tasks.TRAIN_SEED / RL_SEED / HELDOUT_SEED)
CALIBRATION_SEED = 3_000_017


def _examples(source, num: int, seed: int) -> tuple[list[str], list[str] | None]:
    """``(texts, prompts)`` of ``source``; ``prompts`` is None for a text file (no prompt)."""
    check_int("the set's size", num, 1)
    if _is_task(source):
        problems = (get_problems(source, num, seed) if isinstance(source, str) and source in TASKS
                    else get_problems(source, num))
        texts = [p.prompt + (p.reference or p.answer) for p in problems]
        prompts = [p.prompt for p in problems]
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"unknown text source {str(source)!r}; accepted: a task name "
                             f"{sorted(TASKS)}, a .jsonl task file, or a text file")
        lines = path.read_text(encoding="utf-8").splitlines()
        texts, prompts = [line for line in lines if line.strip()][:num], None
    if not texts:
        raise ValueError(f"empty calibration/text set: {str(source)!r} gave no text")
    return texts, prompts


def texts_from(source: str | os.PathLike = "running_sum", num: int = 256,
               seed: int = CALIBRATION_SEED) -> list[str]:
    """``num`` example texts from ``source``: an embedded task name (prompt + worked solution),
    a ``.jsonl`` task file (prompt + answer), or a text file (one example per non-empty line).
    Raises ``ValueError`` naming the source when it yields no text."""
    return _examples(source, num, seed)[0]


def _is_task(source) -> bool:
    return (isinstance(source, str) and source in TASKS) or Path(source).suffix.lower() == ".jsonl"


def sequences_from(source: str | os.PathLike, num: int, tokenizer, seed: int = CALIBRATION_SEED,
                   max_len: int | None = None) -> tuple[list[list[int]], list[int]]:
    """``(token ids, first scored position)`` of ``num`` texts of ``source``: for a task the
    first response token (after the prompt's tokens), for a text file 1 (every token)."""
    texts, prompts = _examples(source, num, seed)
    seqs = encode_texts(texts, tokenizer, max_len)
    if prompts is None:
        return seqs, [1] * len(seqs)
    starts = [min(len(tokenizer(p)["input_ids"]), len(s) - 1) for p, s in zip(prompts, seqs)]
    return seqs, starts


def encode_texts(texts: list[str], tokenizer, max_len: int | None = None) -> list[list[int]]:
    """Token ids of each text (BOS as the tokenizer adds it), cut to ``max_len`` tokens."""
    if not texts:
        raise ValueError("empty calibration/text set: no texts to encode")
    ids = [tokenizer(t)["input_ids"][:max_len] for t in texts]
    if not any(len(s) > 1 for s in ids):
        raise ValueError("every text encodes to at most one token: nothing to predict")
    return ids


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


def distill_data(tokenizer, source: str | os.PathLike = "running_sum", num: int = 256,
                 eval_num: int = 32, batch_size: int = 16, seed: int = 0,
                 max_len: int | None = None) -> tuple[list, list]:
    """``(train batches, held-out batches)`` of ``(ids, mask, scored)`` from ``source``
    (:func:`sequences_from`, scored: a task's responses, a text file's every token):
    ``num + eval_num`` texts, the last ``eval_num`` held out. Train batches hold sequences of
    similar length (little padding), in an order drawn from ``seed``, so that consecutive
    steps see a mix of lengths."""
    check_int("num", num, 1)
    check_int("eval_num", eval_num, 0)
    seqs, starts = sequences_from(source, num + eval_num, tokenizer, max_len=max_len)
    if len(seqs) < num + eval_num:
        raise ValueError(f"{str(source)!r} gave {len(seqs)} texts; {num} to train on and "
                         f"{eval_num} held out need {num + eval_num}")

    def batched(part):
        return (token_batches(seqs[part], batch_size, tokenizer.pad_token_id,
                              starts=starts[part]) if seqs[part] else [])

    batches = batched(slice(0, num))
    order = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed))
    return [batches[i] for i in order], batched(slice(num, num + eval_num))


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
