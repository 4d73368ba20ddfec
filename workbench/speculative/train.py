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
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from ..checks import check_choice, check_int, check_non_negative
from ..nested_config import NestedConfig
from ..rollout.forward import causal_mask_4d
from ..train import TrainConfig, Trainer, isolated_rng, train_state_dir
from .eagle import EagleHead

__all__ = ["EagleTrainConfig", "EagleTrainer", "harvest_pairs", "train_eagle"]

STATE_UNITS = ("rms", "raw")


def _default_train() -> TrainConfig:
    """EAGLE's optimisation: AdamW, cosine decay to 10% without warm-up over 600 steps, clip
    1.0; the head saved (and the train state checkpointed) every 200 steps by ``train_eagle``."""
    return TrainConfig(horizon=600, lr=2e-3, schedule="cosine", warmup=0, lr_floor=0.1,
                       weight_decay=0.0, clip_norm=1.0, checkpoint_every=200, progress=False,
                       desc="train eagle")


@dataclass
class EagleTrainConfig(NestedConfig):
    """Arguments of :class:`EagleTrainer` and :func:`train_eagle`: the one declaration of the
    EAGLE head's training hyperparameters (the zoo recipe, on-the-spot fits and the spot
    trainer hold one). Flat: ``EagleTrainConfig.flat(horizon=2000, batch_size=16, lr=1e-3)``.

    Args:
        batch_size: sequences per step.
        unroll: extra passes on the head's own predicted states (training-time drafting).
        noise: half-width of the uniform noise added to input states (EAGLE's robustness
            trick), drawn from the trainer's generator.
        state_units: ``"rms"`` measures the SmoothL1 in units of each target state's RMS,
            ``"raw"`` in the policy's own units. Pre-norm states of a small policy have RMS
            far above 1, so in raw units the regression term dwarfs the cross-entropy that
            decides the drafted token; ``"rms"`` puts the two on one scale.
        train: the optimizer: ``horizon`` (the steps of a full training and of the cosine
            decay; ``None`` with ``schedule="constant"``: training that never ends, as during
            RL), ``lr``, ``seed`` (batch order, initialisation and noise), ``checkpoint_every``
            (steps between head saves and train-state checkpoints when ``train_eagle`` is
            given ``out_dir``), ``max_minutes`` (a wall-clock cap: training stops and
            checkpoints), ...
    """

    batch_size: int = 32
    unroll: int = 2
    noise: float = 0.05
    state_units: str = "rms"
    train: TrainConfig = field(default_factory=_default_train)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field (the optimizer's are the held
        ``TrainConfig``'s, checked when it is built)."""
        check_choice("EagleTrainConfig.state_units", self.state_units, STATE_UNITS)
        check_int("EagleTrainConfig.batch_size", self.batch_size, 1)
        check_int("EagleTrainConfig.unroll", self.unroll, 0)
        check_non_negative("EagleTrainConfig.noise", self.noise)
        if not isinstance(self.train, TrainConfig):
            raise ValueError(f"EagleTrainConfig.train must be a TrainConfig, got "
                             f"{type(self.train).__name__} (EagleTrainConfig.flat takes flat "
                             "parameters)")


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


def state_regression(pred: torch.Tensor, target: torch.Tensor, units: str = "rms") -> torch.Tensor:
    """SmoothL1 between predicted and true hidden states, one value per position (mean over
    the hidden dimension). ``units="rms"`` divides both by the target's RMS first, so the loss
    does not change when the states are rescaled together."""
    check_choice("state_units", units, STATE_UNITS)
    if units == "rms":
        scale = target.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-6)
        pred, target = pred / scale, target / scale
    return F.smooth_l1_loss(pred, target, reduction="none").mean(-1)


def _uniform_noise(like: torch.Tensor, half_width: float, generator) -> torch.Tensor:
    """Uniform noise in [-half_width, half_width) drawn from ``generator`` (never the global
    RNG), made on the generator's device and moved to the states'."""
    if generator is None:
        raise ValueError(f"eagle_loss: noise={half_width} needs a torch.Generator "
                         "(generator=...); the Trainer passes its own")
    u = torch.rand(like.shape, generator=generator, dtype=like.dtype, device=generator.device)
    return (u.to(like.device) - 0.5) * 2 * half_width


def eagle_loss(head: EagleHead, policy, tokens, states, mask, unroll: int = 0,
               noise: float = 0.0, state_units: str = "rms", generator=None):
    """``(loss, metrics)`` of the head on a padded batch of pairs.

    Pass 0 reads the true states; pass ``u`` reads the states pass ``u-1`` predicted, shifted
    one position, which is what the head sees when drafting at depth ``u + 1``. Input noise
    (``noise`` > 0) is drawn from ``generator``.
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
            inputs = inputs + _uniform_noise(inputs, noise, generator)
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


class PairBatches:
    """The batch of each step, from harvested pairs: sorted by length and cut into batches of
    similar length (little padding), visited every epoch in an order drawn from (seed, epoch)
    alone, so that the batch of a step depends on the step and nothing else (exact resume)."""

    def __init__(self, pairs, batch_size: int, seed: int, device, dtype):
        self.pairs, self.seed, self.device, self.dtype = pairs, seed, device, dtype
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
        self.groups = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]

    def __call__(self, step: int):
        epoch, i = divmod(step, len(self.groups))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        group = self.groups[int(torch.randperm(len(self.groups), generator=g)[i])]
        return _pad_batch([self.pairs[j] for j in group], self.device, self.dtype)


class EagleTrainer:
    """Trains an EAGLE head for a frozen policy, a few steps at a time.

    Optimizer, LR-schedule position, generator and history live on between calls, so the RL
    loop can train after every rollout and the head keeps learning where it left off: either
    ``train(new_pairs, steps=n)``, or :meth:`set_pairs` and then :meth:`step` inside
    ``with trainer.training():`` (the policy's ``requires_grad`` flags and train/eval modes
    are set once for the session and come back after it, exceptions included).

    Args:
        policy: the policy whose next hidden states the head predicts (frozen during training).
        head: the head to train; default a new one, initialised from ``config.train.seed``.
        config: an :class:`EagleTrainConfig`.
        checkpoint_dir: folder of the harness's train-state checkpoint; training resumes from
            it when it holds one.
        progress: show a progress bar.
    """

    def __init__(self, policy, head: EagleHead | None = None,
                 config: EagleTrainConfig | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, progress: bool = False):
        self.config = config if config is not None else EagleTrainConfig()
        self.config.validate()
        if head is None:
            with isolated_rng(self.config.train.seed):  # seeded, the caller's RNG untouched
                head = EagleHead(policy)
        else:
            head.config.check(policy.config)
        self.policy, self.head = policy, head
        self.batches: PairBatches | None = None  # set by set_pairs (or train(pairs))
        train = replace(self.config.train, checkpoint_dir=checkpoint_dir, progress=progress)
        self.trainer = Trainer(head, self._loss, train, frozen=[policy])

    def _loss(self, batch, generator):
        tokens, states, mask = batch
        c = self.config
        return eagle_loss(self.head, self.policy, tokens, states, mask, c.unroll, c.noise,
                          c.state_units, generator=generator)

    def set_pairs(self, pairs) -> None:
        """Train on ``pairs`` (from :func:`harvest_pairs`) from the next step on."""
        if not pairs:
            raise ValueError("no training pairs: harvest a rollout first (harvest_pairs)")
        hidden = self.policy.config.hidden_size
        if pairs[0][1].shape[-1] != hidden:
            raise ValueError(f"the pairs hold states of width {pairs[0][1].shape[-1]}, the "
                             f"policy's hidden size is {hidden}: harvest this policy")
        weight = self.policy.get_output_embeddings().weight
        self.batches = PairBatches(pairs, self.config.batch_size, self.config.train.seed,
                                   weight.device, weight.dtype)

    def _pairs(self) -> PairBatches:
        if self.batches is None:
            raise ValueError("no training pairs: pass pairs to EagleTrainer.train, or call "
                             "set_pairs (harvest_pairs of a rollout run with harvest=True)")
        return self.batches

    def training(self):
        """The training session :meth:`step` runs in (``Trainer.training``)."""
        return self.trainer.training()

    def step(self, batch: int | None = None) -> dict:
        """One optimizer step on batch number ``batch`` of the pairs (default: this step's
        number, so a resumed run sees the same data; the spot trainer's copies take disjoint
        numbers); returns its history row."""
        return self.trainer.step(self._pairs()(self.trainer.steps_done if batch is None else batch))

    def train(self, pairs=None, steps: int | None = None, stop=None) -> pd.DataFrame:
        """Train ``steps`` more steps (default: up to ``config.train.horizon`` in all) on
        ``pairs`` (default: the last ones given); ``stop(step)`` preempts between steps.
        Returns the history rows of this call."""
        if pairs is not None:
            self.set_pairs(pairs)
        before = len(self.trainer.history)
        return self.trainer.run(self._pairs(), steps, stop).iloc[before:].reset_index(drop=True)

    def evaluate(self, pairs) -> float:
        """The head's loss on ``pairs`` as training measures it, minus the input noise: a
        held-out measure (e.g. to stop training once it stops falling). Batches of similar
        length, their losses weighted by their sequences; no gradient, and the trainer's
        generator untouched, so evaluating changes nothing the training would see."""
        if not pairs:
            raise ValueError("no pairs to evaluate on (harvest_pairs of a rollout run with "
                             "harvest=True)")
        c = self.config
        weight = self.policy.get_output_embeddings().weight
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
        total = 0.0
        with torch.no_grad():
            for s in range(0, len(order), c.batch_size):
                group = [pairs[i] for i in order[s:s + c.batch_size]]
                tokens, states, mask = _pad_batch(group, weight.device, weight.dtype)
                loss, _ = eagle_loss(self.head, self.policy, tokens, states, mask, c.unroll,
                                     0.0, c.state_units)
                total += float(loss) * len(group)
        return total / len(pairs)

    @property
    def steps_done(self) -> int:
        return self.trainer.steps_done

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.trainer.optimizer

    @property
    def history(self) -> pd.DataFrame:
        return self.trainer.history


def train_eagle(policy, pairs, config: EagleTrainConfig | None = None, head: EagleHead | None = None,
                out_dir: str | os.PathLike | None = None, progress: bool = True):
    """Train an EAGLE head for ``policy`` on harvested ``pairs``; returns ``(head, history)``.

    The policy stays frozen and keeps its flags. With ``out_dir`` the head is saved atomically
    every ``checkpoint_every`` steps and at the end; beside it, ``<out_dir>.train_state`` holds
    the trainer's checkpoint, from which an interrupted run resumes exactly, and which is
    removed once the run is done.
    """
    config = config if config is not None else EagleTrainConfig()
    config.validate()  # before anything is trained or written
    if not pairs:
        raise ValueError("no training pairs: harvest a rollout first (harvest_pairs)")
    if out_dir is not None and Path(out_dir).is_file():
        raise FileExistsError(f"out_dir {str(out_dir)!r} is an existing file; pass a folder")
    fresh = head is None
    state = train_state_dir(out_dir) if out_dir is not None else None
    et = EagleTrainer(policy, head, config, checkpoint_dir=state, progress=progress)

    def save_head(trainer):
        every = config.train.checkpoint_every
        if every and trainer.steps_done % every == 0:
            et.head.save_pretrained(out_dir)

    if out_dir is not None:
        et.trainer.on_step = save_head
    et.train(pairs)
    if out_dir is not None:
        et.head.save_pretrained(out_dir)
        et.trainer.discard_checkpoint()
    if fresh:
        et.head.eval()  # a head made here is handed over ready to draft
    return et.head, et.history
