"""Text for compression: calibration and distillation sets, padded batches, and LM loss.

Importance, distillation and evaluation all read token sequences drawn from one of three
sources: an embedded task (each problem's prompt followed by its worked solution), a JSONL
task file (prompt followed by answer), or a plain text file (one example per non-empty line).
The set's size is a parameter; an empty set is refused before any model runs.
"""
from __future__ import annotations

import math
import numbers
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..tasks import TASKS, get_problems

__all__ = ["CALIBRATION_SEED", "texts_from", "encode_texts", "token_batches", "lm_loss"]

# problems for calibration and distillation: neither the policy's training data, the RL pool
# nor the held-out set (tasks.TRAIN_SEED / RL_SEED / HELDOUT_SEED)
CALIBRATION_SEED = 3_000_017


def _check_count(num) -> None:
    if isinstance(num, bool) or not isinstance(num, numbers.Integral) or num < 1:
        raise ValueError(f"the set's size must be an integer >= 1, got {num!r}")


def texts_from(source: str | os.PathLike = "running_sum", num: int = 256,
               seed: int = CALIBRATION_SEED) -> list[str]:
    """``num`` example texts from ``source``: an embedded task name (prompt + worked solution),
    a ``.jsonl`` task file (prompt + answer), or a text file (one example per non-empty line).
    Raises ``ValueError`` naming the source when it yields no text."""
    _check_count(num)
    if isinstance(source, str) and source in TASKS:
        texts = [p.prompt + (p.reference or p.answer) for p in get_problems(source, num, seed)]
    elif Path(source).suffix.lower() == ".jsonl":
        texts = [p.prompt + (p.reference or p.answer) for p in get_problems(source, num)]
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"unknown text source {str(source)!r}; accepted: a task name "
                             f"{sorted(TASKS)}, a .jsonl task file, or a text file")
        lines = path.read_text(encoding="utf-8").splitlines()
        texts = [line for line in lines if line.strip()][:num]
    if not texts:
        raise ValueError(f"empty calibration/text set: {str(source)!r} gave no text")
    return texts


def encode_texts(texts: list[str], tokenizer, max_len: int | None = None) -> list[list[int]]:
    """Token ids of each text (BOS as the tokenizer adds it), cut to ``max_len`` tokens."""
    if not texts:
        raise ValueError("empty calibration/text set: no texts to encode")
    ids = [tokenizer(t)["input_ids"][:max_len] for t in texts]
    if not any(len(s) > 1 for s in ids):
        raise ValueError("every text encodes to at most one token: nothing to predict")
    return ids


def token_batches(seqs: list[list[int]], batch_size: int, pad_id: int,
                  device=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(ids, mask)`` batches of right-padded sequences, sorted by length (little padding)."""
    if not seqs:
        raise ValueError("empty calibration/text set: no sequences to batch")
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = []
    for s in range(0, len(order), batch_size):
        group = [seqs[i] for i in order[s:s + batch_size]]
        width = max(map(len, group))
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for r, seq in enumerate(group):
            ids[r, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[r, :len(seq)] = 1
        out.append((ids.to(device), mask.to(device)))
    return out


@torch.no_grad()
def lm_loss(model, batches, progress: bool = False, desc: str = "LM loss") -> float:
    """Token-mean next-token cross-entropy (nats) of ``model`` over ``batches`` of
    ``(ids, mask)``; ``math.exp`` of it is the perplexity."""
    device = model.get_input_embeddings().weight.device
    total, count = 0.0, 0
    for ids, mask in tqdm(batches, desc=desc, disable=not progress):
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        total += float(F.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                       ignore_index=-100, reduction="sum"))
        count += int((target != -100).sum())
    if count == 0:
        raise ValueError("no tokens to score: every sequence has at most one token")
    return total / count if math.isfinite(total) else float("inf")
