"""Training a causal LM on (prompt, response) token sequences, loss on the response.

What both LM recipes share: the default policy (``zoo.policy``, trained on reference traces)
and the small-LM drafter of any policy (``speculative.fit``, trained on the policy's own
outputs). Examples are ``(ids, prompt_len)`` pairs; batches group similar lengths under a
token budget; the loss is next-token cross-entropy on the response tokens only; optimisation
goes through the one training loop (:class:`workbench.train.Trainer`), so checkpoints resume
exactly.

Layering: beside ``train.py``; imports only ``train`` from the workbench.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from .train import TrainConfig, Trainer, isolated_rng

__all__ = ["small_llama", "length_batches", "lm_train_config", "train_lm", "final_loss"]


def small_llama(vocab_size: int, tokenizer, hidden_size: int, layers: int, heads: int,
                kv_heads: int, intermediate_size: int, max_position: int,
                seed: int) -> LlamaForCausalLM:
    """A freshly initialised GQA Llama with tied embeddings, seeded without touching the
    caller's RNG; its special tokens are ``tokenizer``'s, so it speaks that tokenizer."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_position, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0)
    with isolated_rng(seed):
        return LlamaForCausalLM(config)


def length_batches(examples, tokens_per_batch: int, seed: int) -> list[list[int]]:
    """Index batches of similar length (little padding), each under ``tokens_per_batch``, shuffled."""
    rng = random.Random(seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches = []
    chunk = 4096  # sort inside chunks: similar lengths per batch, still a random mix over time
    for c in range(0, len(order), chunk):
        part = sorted(order[c:c + chunk], key=lambda i: len(examples[i][0]))
        batch, longest = [], 0
        for i in part:
            n = len(examples[i][0])
            if batch and max(longest, n) * (len(batch) + 1) > tokens_per_batch:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, n)
        if batch:
            batches.append(batch)
    rng.shuffle(batches)
    return batches


def collate(examples, idx, pad_id: int):
    """``(ids, labels, mask)`` of the examples ``idx``, right-padded; labels only on responses."""
    longest = max(len(examples[i][0]) for i in idx)
    ids = torch.full((len(idx), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(idx), longest), -100, dtype=torch.long)
    mask = torch.zeros((len(idx), longest), dtype=torch.long)
    for r, i in enumerate(idx):
        seq, plen = examples[i]
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, plen:len(seq)] = torch.tensor(seq[plen:])
        mask[r, :len(seq)] = 1
    return ids, labels, mask


def lm_batches(examples, batches: list[list[int]], pad_id: int, device=None):
    """The harness's batch source: step ``s`` trains on ``batches[s % len(batches)]``, moved
    to ``device`` (the model's; None: left on the CPU)."""
    if not batches:
        raise ValueError("no batches: the example list is empty")

    def batch(step):
        tensors = collate(examples, batches[step % len(batches)], pad_id)
        return tensors if device is None else tuple(t.to(device) for t in tensors)
    return batch


def response_lm_loss(model):
    """The harness's loss: next-token cross-entropy on the labelled (response) tokens; the
    padded tokens of the batch are reported as ``tokens``."""
    def loss_fn(batch, generator):
        ids, labels, mask = batch
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return loss, {"tokens": int(mask.sum())}
    return loss_fn


# TrainConfig field <- recipe attribute, read only when ``kw`` does not set the field
_FROM_RECIPE = {"horizon": "steps", "lr": "lr", "warmup": "warmup", "seed": "seed",
                "max_minutes": "minutes"}


def lm_train_config(recipe, weight_decay: float, checkpoint_dir=None, desc: str = "train",
                    **kw) -> TrainConfig:
    """The LM recipes' optimisation: AdamW betas (0.9, 0.95), linear warm-up then a constant LR
    (so a run of N steps is exactly the first N steps of a longer one), clipping at 1.0.
    ``recipe`` supplies ``steps`` (the horizon), ``lr``, ``warmup``, ``seed`` and ``minutes``
    unless ``kw`` sets them; ``kw`` sets or overrides any other :class:`TrainConfig` field."""
    fields = dict(schedule="constant", betas=(0.9, 0.95), weight_decay=weight_decay,
                  clip_norm=1.0, checkpoint_dir=checkpoint_dir, desc=desc)
    fields.update({name: getattr(recipe, attr) for name, attr in _FROM_RECIPE.items()
                   if name not in kw})
    return TrainConfig(**{**fields, **kw})


def train_lm(model, examples, batches, pad_id: int, config: TrainConfig, on_step=None) -> Trainer:
    """Train ``model`` on ``examples`` (resuming from ``config.checkpoint_dir`` if it holds a
    checkpoint) on the model's device; returns the trainer, whose history holds the losses and
    token counts."""
    device = next(model.parameters()).device
    source = lm_batches(examples, batches, pad_id, None if device.type == "cpu" else device)
    trainer = Trainer(model, response_lm_loss(model), config, on_step=on_step)
    trainer.run(source)
    return trainer


def final_loss(trainer: Trainer, last: int = 20) -> float:
    """Mean loss of the last ``last`` steps (NaN before any step)."""
    losses = trainer.history["loss"].tail(last)
    return float(losses.mean()) if len(losses) else float("nan")
