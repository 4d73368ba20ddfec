"""Distilling a compressed student *as a drafter* for its teacher (issue #25).

Speculative decoding accepts a draft where the drafter's next token agrees with the teacher's,
on the sequences the teacher itself decodes; greedy verification compares the drafter's argmax
with the teacher's argmax along the teacher's greedy path. The task's reference traces, on
which :func:`~workbench.compress.iterative.compress_step` distils, are not those sequences: the
teacher writes its own responses (and its own mistakes), and a drafter is judged on exactly
them. So drafter-KD trains on the teacher's rollouts, decoded by the real engine with its KV
cache (greedy, the path greedy SD walks, and samples at temperature 1, whose nearby prefixes
widen the data), and pulls the student's whole next-token distribution toward the teacher's at
every response position (logit KD, forward KL; :class:`~workbench.compress.distill.Distiller`
with the rollouts as its batches). Prompts are fed but not scored, as in every distillation
here: the drafter never predicts them.

Glossary: *rollout data*, ``(ids, mask, scored)`` batches of prompt then response tokens (EOS
included when the teacher stopped), scored from the first response token on; *agreement*, the
share of scored positions where student and teacher put their highest logit on the same token:
under greedy verification the chance that one draft is accepted, so at k drafts a drafter whose
agreement is ``a`` everywhere has tau = (1 - a^(k+1)) / (1 - a).
"""
from __future__ import annotations

import os

import torch

from ..checks import check_int, check_non_negative
from ..rollout import RolloutConfig, RolloutEngine
from .data import pad_id, seeded_order, token_batches
from .distill import DistillConfig, Distiller

__all__ = ["rollout_sequences", "rollout_batches", "agreement", "distill_drafter"]


def _check_prompts(prompts, what: str) -> list:
    """``prompts`` as a non-empty list (strings or token-id lists), else ``ValueError``."""
    if isinstance(prompts, str) or not hasattr(prompts, "__iter__"):
        raise ValueError(f"{what} {prompts!r}: accepted: a non-empty list of prompts (strings "
                         "or token-id lists)")
    prompts = list(prompts)
    if not prompts:
        raise ValueError(f"{what} is empty: accepted: a non-empty list of prompts")
    return prompts


def _check_temperatures(temperatures) -> tuple[float, ...]:
    """At least one temperature, each >= 0 (0: greedy)."""
    temps = tuple(check_non_negative(f"temperatures[{i}]", t)
                  for i, t in enumerate(temperatures))
    if not temps:
        raise ValueError("temperatures is empty: accepted: one or more temperatures >= 0 "
                         "(0: greedy)")
    return temps


def rollout_sequences(teacher, tokenizer, prompts, temperatures=(0.0, 1.0), samples: int = 2,
                      max_new_tokens: int = 256, seed: int = 0,
                      max_batch_size: int | None = 64) -> tuple[list[list[int]], list[int]]:
    """``(sequences, starts)``: the teacher's own rollouts of ``prompts``, one per prompt at
    temperature 0 and ``samples`` per prompt at every temperature above 0, decoded by the
    rollout engine (``seed`` draws the samples); each sequence is the prompt's tokens as the
    engine encodes them then the response (EOS included when emitted), and ``starts[i]`` its
    first response position."""
    prompts = _check_prompts(prompts, "prompts")
    temps = _check_temperatures(temperatures)
    check_int("samples", samples, 1)
    engine = RolloutEngine(teacher, tokenizer)
    seqs, starts = [], []
    for temp in temps:
        config = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temp, seed=seed,
                               samples_per_prompt=samples if temp > 0 else 1,
                               max_batch_size=max_batch_size)
        for out in engine.rollout(prompts, config, progress=False).requests:
            seqs.append(list(out.prompt_ids) + list(out.tokens))
            starts.append(len(out.prompt_ids))
    return seqs, starts


def rollout_batches(teacher, tokenizer, prompts, batch_size: int = 16, seed: int = 0,
                    **rollouts) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(ids [B, T], mask [B, T], scored [B, T])`` batches of :func:`rollout_sequences`
    (``rollouts``: its keyword arguments, ``seed`` included), sequences of similar length
    together, in an order drawn from ``seed``; ``scored`` marks the response tokens."""
    check_int("batch_size", batch_size, 1)
    seqs, starts = rollout_sequences(teacher, tokenizer, prompts, seed=seed, **rollouts)
    return seeded_order(token_batches(seqs, batch_size, pad_id(tokenizer), starts=starts), seed)


@torch.no_grad()
def agreement(student, teacher, batches) -> float:
    """The share of scored positions of ``batches`` where ``student``'s most likely next token
    is ``teacher``'s: the chance that one greedy draft is accepted there."""
    device = student.get_input_embeddings().weight.device
    same, count = 0, 0
    for ids, mask, *scored in batches:
        ids, mask = ids.to(device), mask.to(device)
        valid = (scored[0] if scored else mask)[:, 1:].to(device).bool()
        mine = student(input_ids=ids, attention_mask=mask).logits[:, :-1].argmax(-1)
        theirs = teacher(input_ids=ids, attention_mask=mask).logits[:, :-1].argmax(-1)
        same += int((mine.to(device) == theirs.to(device))[valid].sum())
        count += int(valid.sum())
    if count == 0:
        raise ValueError("no tokens to score: every sequence has at most one token")
    return same / count


def distill_drafter(student, teacher, tokenizer, prompts, held_out_prompts=(),
                    config: DistillConfig | None = None,
                    checkpoint_dir: str | os.PathLike | None = None,
                    **rollouts) -> Distiller:
    """Distil ``student`` in place toward ``teacher``'s next-token distributions on the
    teacher's own rollouts of ``prompts`` (:func:`rollout_batches`; ``rollouts`` its keyword
    arguments but ``batch_size`` and ``seed``, which are ``config``'s), by logit KD; the
    greedy rollouts of ``held_out_prompts`` are the held-out batches (LM loss on the teacher's
    greedy tokens, KL to the teacher; with ``config.keep_best`` the best evaluation's weights
    are restored at the horizon). Returns the finished :class:`Distiller` (its ``evals``: the
    student before and after)."""
    config = config if config is not None else DistillConfig()
    config.validate()
    if config.mode != "kd":
        raise ValueError(f"DistillConfig.mode={config.mode!r}: a drafter is distilled toward "
                         "its teacher; accepted: 'kd'")
    held_prompts = (list(held_out_prompts) if isinstance(held_out_prompts, (list, tuple))
                    else _check_prompts(held_out_prompts, "held_out_prompts"))
    seed = config.train.seed
    train = rollout_batches(teacher, tokenizer, prompts, config.batch_size, seed, **rollouts)
    held_out = (rollout_batches(teacher, tokenizer, held_prompts, config.batch_size, seed,
                                **{**rollouts, "temperatures": (0.0,)}) if held_prompts else [])
    distiller = Distiller(student, teacher, train, config, held_out,
                          checkpoint_dir=checkpoint_dir, desc="drafter KD")
    distiller.run()
    return distiller

