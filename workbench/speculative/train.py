"""Offline EAGLE-head training on hidden states harvested from rollouts.

Data: ``RolloutConfig(harvest=True)`` keeps, for every request, the policy's pre-norm hidden
state at every fed position. A sequence ``x_0..x_{L-1}`` (prompt + response) with states
``h_0..h_{L-2}`` gives pairs ``(h_t, x_{t+1})`` at positions ``t``; the head's output at ``t``
is trained towards ``h_{t+1}`` (0.5 * SmoothL1) and its logits towards the policy's own next-
token distribution at ``t+1`` (0.5 * soft cross-entropy), as in TLT.

Training also unrolls the head on its own predictions (``unroll`` extra passes, the way it
drafts at depth > 1), so chained drafts stay accurate; pass ``unroll=0`` for plain teacher
forcing.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..rollout.forward import causal_mask_4d
from .eagle import EagleHead

__all__ = ["EagleTrainConfig", "harvest_pairs", "train_eagle", "eagle_loss", "state_regression"]

STATE_UNITS = ("rms", "raw")


@dataclass
class EagleTrainConfig:
    """Arguments of :func:`train_eagle`.

    Args:
        steps: optimizer steps.
        batch_size: sequences per step.
        lr: AdamW learning rate (cosine decay to 10%).
        unroll: extra passes on the head's own predicted states (training-time drafting).
        noise: std of uniform noise added to input states (EAGLE's robustness trick).
        state_units: ``"rms"`` measures the SmoothL1 in units of each target state's RMS,
            ``"raw"`` in the policy's own units. Pre-norm states of a small policy have RMS
            far above 1, so in raw units the regression term dwarfs the cross-entropy that
            decides the drafted token; ``"rms"`` puts the two on one scale.
        seed: batch order and initialisation.
        checkpoint_every: steps between atomic checkpoints when ``out_dir`` is given.
        max_minutes: wall-clock cap; training stops (and checkpoints) when it is reached.
    """

    steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    unroll: int = 2
    noise: float = 0.05
    state_units: str = "rms"
    seed: int = 0
    checkpoint_every: int = 200
    max_minutes: float = float("inf")


def harvest_pairs(result) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(tokens [L], states [L-1, H])`` per request of a rollout run with ``harvest=True``."""
    out = []
    for r in result.requests:
        if r.hidden is None:
            raise ValueError("the rollout kept no hidden states; run it with harvest=True")
        seq = torch.tensor(r.prompt_ids + r.tokens, dtype=torch.long)
        if r.hidden.shape[0] != len(seq) - 1:
            raise ValueError(f"request {r.uid}: {r.hidden.shape[0]} states for {len(seq)} tokens")
        out.append((seq, r.hidden))
    return out


def _pad_batch(items, device, dtype):
    """Right-padded ``tokens [B, L]``, ``states [B, L-1, H]`` and ``mask [B, L-1]`` (pairs)."""
    n = max(len(t) for t, _ in items) - 1
    hdim = items[0][1].shape[-1]
    toks = torch.zeros((len(items), n + 1), dtype=torch.long)
    states = torch.zeros((len(items), n, hdim), dtype=dtype)
    mask = torch.zeros((len(items), n), dtype=torch.long)
    for i, (t, h) in enumerate(items):
        toks[i, :len(t)] = t
        states[i, :h.shape[0]] = h.to(dtype)
        mask[i, :h.shape[0]] = 1
    return toks.to(device), states.to(device), mask.to(device)


def _check_state_units(units: str) -> None:
    if units not in STATE_UNITS:
        raise ValueError(f"state_units must be one of {STATE_UNITS}, got {units!r}")


def state_regression(pred: torch.Tensor, target: torch.Tensor, units: str = "rms") -> torch.Tensor:
    """SmoothL1 between predicted and true hidden states, one value per position (mean over
    the hidden dimension). ``units="rms"`` divides both by the target's RMS first, so the loss
    does not change when the states are rescaled together."""
    _check_state_units(units)
    if units == "rms":
        scale = target.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-6)
        pred, target = pred / scale, target / scale
    return F.smooth_l1_loss(pred, target, reduction="none").mean(-1)


def eagle_loss(head: EagleHead, policy, tokens, states, mask, unroll: int = 0,
               noise: float = 0.0, state_units: str = "rms"):
    """``(loss, metrics)`` of the head on a padded batch of pairs.

    Pass 0 reads the true states; pass ``u`` reads the states pass ``u-1`` predicted, shifted
    one position, which is what the head sees when drafting at depth ``u + 1``.
    """
    decoder, lm_head = policy.get_decoder(), policy.get_output_embeddings()
    n = states.shape[1]
    pos = torch.arange(n, device=states.device)[None].expand(states.shape[0], -1)
    emb = policy.get_input_embeddings()(tokens[:, 1:])
    attn = causal_mask_4d(mask, n, states.dtype)
    rope = decoder.rotary_emb(emb, pos)
    with torch.no_grad():
        target_p = torch.softmax(lm_head(decoder.norm(states[:, 1:])).float(), dim=-1)
    valid = (mask[:, 1:] * mask[:, :-1]).to(states.dtype)
    inputs = states
    total, reg_sum, ce_sum, acc = 0.0, 0.0, 0.0, []
    for u in range(unroll + 1):
        if noise:
            inputs = inputs + (torch.rand_like(inputs) - 0.5) * 2 * noise
        pred = head(emb, inputs, attn, rope)[:, :-1]               # pred[:, t] ~ h_{t+1}
        v = valid[:, u:]                                           # inputs predicted u times
        denom = v.sum().clamp(min=1)
        reg = (state_regression(pred[:, u:], states[:, 1 + u:], state_units) * v).sum() / denom
        logq = torch.log_softmax(lm_head(decoder.norm(pred[:, u:])).float(), dim=-1)
        ce = (-(target_p[:, u:] * logq).sum(-1) * v).sum() / denom
        total = total + 0.5 * reg + 0.5 * ce
        reg_sum, ce_sum = reg_sum + reg.item(), ce_sum + ce.item()
        match = (logq.argmax(-1) == target_p[:, u:].argmax(-1)).to(v.dtype)
        acc.append(float((match * v).sum() / denom))
        # the next pass sees predicted states where true ones were: shift right by one
        inputs = torch.cat([states[:, :1 + u], pred[:, u:]], dim=1)[:, :n]
    return total / (unroll + 1), {"smooth_l1": reg_sum / (unroll + 1),
                                  "soft_ce": ce_sum / (unroll + 1),
                                  **{f"top1_depth{u + 1}": a for u, a in enumerate(acc)}}


def train_eagle(policy, pairs, config: EagleTrainConfig | None = None, head: EagleHead | None = None,
                out_dir: str | os.PathLike | None = None, progress: bool = True):
    """Train an EAGLE head for ``policy`` on harvested ``pairs``; returns ``(head, history)``.

    The policy stays frozen. With ``out_dir`` the head is checkpointed atomically every
    ``checkpoint_every`` steps and at the end (``EagleHead.save_pretrained``).
    """
    config = config or EagleTrainConfig()
    _check_state_units(config.state_units)  # before anything is trained or written
    if not pairs:
        raise ValueError("no training pairs: harvest a rollout first (harvest_pairs)")
    torch.manual_seed(config.seed)
    head = head or EagleHead(policy)
    head.train()
    for p in policy.parameters():
        p.requires_grad_(False)
    dtype = policy.get_output_embeddings().weight.dtype
    device = policy.get_output_embeddings().weight.device
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * s / config.steps))).item())
    rng = random.Random(config.seed)
    # batches of similar length: sort by length, cut, shuffle the batches each epoch
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
    batches = [order[s:s + config.batch_size] for s in range(0, len(order), config.batch_size)]
    history = []
    bar = tqdm(range(config.steps), desc="train eagle", disable=not progress)
    start = time.perf_counter()
    for step in bar:
        if step % len(batches) == 0:
            rng.shuffle(batches)
        tokens, states, mask = _pad_batch([pairs[i] for i in batches[step % len(batches)]],
                                          device, dtype)
        loss, metrics = eagle_loss(head, policy, tokens, states, mask, config.unroll, config.noise,
                                   config.state_units)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        history.append({"step": step + 1, "loss": loss.item(), **metrics,
                        "elapsed_s": time.perf_counter() - start})
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{metrics['top1_depth1']:.2f}")
        out_of_time = time.perf_counter() - start > config.max_minutes * 60
        if out_dir is not None and ((step + 1) % config.checkpoint_every == 0
                                    or step + 1 == config.steps or out_of_time):
            head.save_pretrained(Path(out_dir))
        if out_of_time:
            print(f"wall-clock cap of {config.max_minutes:.1f} min reached at step {step + 1}")
            break
    head.eval()
    return head, pd.DataFrame(history)
