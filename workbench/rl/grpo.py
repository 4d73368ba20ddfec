"""GRPO: group-relative policy optimisation, one RL step at a time, on the training harness.

One step takes ``P`` prompts, samples ``G`` responses to each with the rollout engine, scores
them with the task's reward, normalises each reward inside its group (the advantage), and
updates the policy on a clipped token-level surrogate (optionally with a k3 KL term to a
reference policy) for ``epochs`` passes over minibatches of the step's sequences.

The trainer recomputes the old log-probabilities itself from the policy it updates, never
trusting the rollout's: a speculative verify pass rounds differently from a one-token step, and
the update must see the policy's own numbers. With one epoch of one minibatch (the default,
on-policy) the old log-probabilities are the detached values of the same forward, so the
ratio is exactly 1 and nothing is computed twice.

The pure pieces (:func:`group_advantages`, :func:`token_terms`, :func:`aggregate`) are what
the tests check against hand-computed values; :class:`GRPO` composes them with the engine
and :class:`~workbench.train.Trainer` (AdamW, clipping, its own generator, atomic state).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

__all__ = ["GRPOConfig", "LOSS_AGGREGATIONS", "group_advantages", "token_terms", "aggregate",
           "grpo_loss", "SequenceBatch", "sequence_logprobs"]

LOSS_AGGREGATIONS = ("token-mean", "sequence-mean")


def _is_int(v, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class GRPOConfig:
    """Arguments of a GRPO run; every field is checked when the config is built.

    Args:
        prompts_per_step: ``P``, prompts drawn per RL step.
        samples_per_prompt: ``G``, responses per prompt (a group); at least 2, since the
            advantage compares a response with its group.
        max_new_tokens: response length cap.
        temperature: sampling temperature of the rollout (and of the log-probabilities the
            loss uses: logits are divided by it, as the sampler does).
        lr: AdamW learning rate (constant).
        epochs: passes over the step's sequences.
        minibatches: optimizer steps per epoch (the step's sequences split evenly).
        clip_eps: the PPO clip range: ratios outside ``[1 - eps, 1 + eps]`` stop the gradient.
        loss_aggregation: ``"token-mean"`` (every response token weighs the same, as DAPO
            and TRL's default) or ``"sequence-mean"`` (each response's mean, then the mean
            over responses, as in the GRPO paper).
        kl_coef: ``beta`` of the k3 KL term to the reference policy; 0 turns it off (the
            KL to the starting policy is still measured every step).
        scale_rewards: divide each group's centred rewards by its standard deviation.
        weight_decay, clip_norm, betas: AdamW and gradient clipping.
        micro_tokens: padded tokens per forward inside a minibatch (sequences of similar
            length go together; their losses sum into one backward).
        kl_sample: sequences per step on which the KL to the starting policy is measured
            when ``kl_coef`` is 0 (the measure needs the reference's forward; a sample keeps
            it cheap); with ``kl_coef`` > 0 every sequence has it anyway.
        workers: rollout workers ``N`` (the sim clock charges the update as its time / N).
        max_batch_size: rows decoded together per worker (None: the whole shard).
        spec_mode: SD verification when sampling ("coupled" or "speculative").
        seed: prompt order, sampling draws and the trainer's generator.
    """

    prompts_per_step: int = 16
    samples_per_prompt: int = 8
    max_new_tokens: int = 256
    temperature: float = 1.0
    lr: float = 5e-5
    epochs: int = 1
    minibatches: int = 1
    clip_eps: float = 0.2
    loss_aggregation: str = "token-mean"
    kl_coef: float = 0.0
    scale_rewards: bool = True
    weight_decay: float = 0.0
    clip_norm: float | None = 1.0
    betas: tuple = (0.9, 0.99)
    micro_tokens: int = 8192
    kl_sample: int = 32
    workers: int = 1
    max_batch_size: int | None = None
    spec_mode: str = "coupled"
    seed: int = 0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field, its value and what is accepted."""
        if not _is_int(self.samples_per_prompt, 2):
            raise ValueError(f"GRPOConfig.samples_per_prompt (G) must be an integer >= 2: "
                             f"the advantage compares each response with its group, got "
                             f"{self.samples_per_prompt!r}")
        for name in ("prompts_per_step", "max_new_tokens", "epochs", "minibatches",
                     "micro_tokens", "workers", "kl_sample"):
            if not _is_int(getattr(self, name), 1):
                raise ValueError(f"GRPOConfig.{name} must be an integer >= 1, "
                                 f"got {getattr(self, name)!r}")
        if self.max_batch_size is not None and not _is_int(self.max_batch_size, 1):
            raise ValueError(f"GRPOConfig.max_batch_size must be None or an integer >= 1, "
                             f"got {self.max_batch_size!r}")
        if self.minibatches > self.prompts_per_step * self.samples_per_prompt:
            raise ValueError(f"GRPOConfig.minibatches={self.minibatches} exceeds the "
                             f"{self.prompts_per_step * self.samples_per_prompt} sequences "
                             "of a step")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"GRPOConfig.loss_aggregation must be one of {LOSS_AGGREGATIONS}, "
                             f"got {self.loss_aggregation!r}")
        reals = {"temperature": (lambda v: v > 0, "a number > 0 (GRPO samples)"),
                 "lr": (lambda v: v > 0, "a number > 0"),
                 "clip_eps": (lambda v: 0 < v < 1, "a number in (0, 1)"),
                 "kl_coef": (lambda v: v >= 0, "a number >= 0"),
                 "weight_decay": (lambda v: v >= 0, "a number >= 0")}
        for name, (ok, accepted) in reals.items():
            v = getattr(self, name)
            if not (_is_real(v) and ok(v)):
                raise ValueError(f"GRPOConfig.{name} must be {accepted}, got {v!r}")
        if not isinstance(self.scale_rewards, bool):
            raise ValueError(f"GRPOConfig.scale_rewards must be True or False, "
                             f"got {self.scale_rewards!r}")

    @property
    def sequences_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt


# ---- the pure pieces ----------------------------------------------------------------------

def group_advantages(rewards, group_size: int, scale: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """Each reward minus its group's mean, divided by the group's standard deviation (the
    unbiased one, as TRL) plus ``eps`` when ``scale``. Rewards come group after group:
    ``rewards[g * G + i]`` is sample ``i`` of prompt ``g``. A group whose rewards are all
    equal gets advantage 0: it carries no signal about which response was better."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.dim() != 1 or r.numel() % group_size:
        raise ValueError(f"{r.numel()} rewards do not split into groups of {group_size}")
    g = r.view(-1, group_size)
    centred = g - g.mean(dim=1, keepdim=True)
    if scale:
        std = g.std(dim=1, keepdim=True)
        centred = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    return centred.flatten()


def token_terms(logp, old_logp, advantages, clip_eps: float, ref_logp=None,
                kl_coef: float = 0.0):
    """Per-token loss ``[B, T]`` and clip indicator: the clipped surrogate
    ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` plus ``kl_coef`` times the k3
    estimate ``exp(ref - logp) - (ref - logp) - 1`` of KL(policy || reference)."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None].to(logp.dtype)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    loss = -torch.minimum(unclipped, clipped)
    if ref_logp is not None and kl_coef:
        loss = loss + kl_coef * k3(ref_logp - logp)
    return loss, (clipped < unclipped).to(logp.dtype)


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(p || q) per token, from ``log q - log p`` at samples of p."""
    return torch.exp(log_ratio) - log_ratio - 1


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str = "token-mean"):
    """The scalar loss: ``token-mean`` (sum over every response token / their count) or
    ``sequence-mean`` (each response's own mean, then the mean over responses)."""
    sums, counts = (per_token * mask).sum(1), mask.sum(1)
    return aggregate_sums(sums, counts, how)


def aggregate_sums(sums: torch.Tensor, counts: torch.Tensor, how: str):
    """:func:`aggregate` from each sequence's summed loss and token count (micro-batches)."""
    if how not in LOSS_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {LOSS_AGGREGATIONS}, got {how!r}")
    if how == "token-mean":
        return sums.sum() / counts.sum().clamp(min=1)
    return (sums / counts.clamp(min=1)).mean()


def grpo_loss(logp, old_logp, advantages, mask, clip_eps: float = 0.2,
              how: str = "token-mean", ref_logp=None, kl_coef: float = 0.0):
    """The GRPO loss of a padded batch: :func:`token_terms` aggregated by :func:`aggregate`."""
    per_token, _ = token_terms(logp, old_logp, advantages, clip_eps, ref_logp, kl_coef)
    return aggregate(per_token, mask.to(per_token.dtype), how)


# ---- sequences and their log-probabilities -----------------------------------------------

@dataclass
class SequenceBatch:
    """Right-padded prompt + response ids of some sequences, and where each response lies.

    ``ids [B, L]``, ``response [B, L-1]``: 1 where
    position ``t + 1`` is a response token (so ``logits[:, t]`` predicts it), and ``index``
    the sequences' positions in the step (to gather advantages and old log-probabilities).
    """

    ids: torch.Tensor
    response: torch.Tensor
    index: list[int]

    @classmethod
    def of(cls, prompts: list[list[int]], responses: list[list[int]], index: list[int],
           pad_id: int, device) -> "SequenceBatch":
        longest = max(len(p) + len(r) for p, r in zip(prompts, responses))
        ids = torch.full((len(index), longest), pad_id, dtype=torch.long)
        response = torch.zeros((len(index), longest - 1))
        for row, (p, r) in enumerate(zip(prompts, responses)):
            ids[row, :len(p) + len(r)] = torch.tensor(p + r)
            response[row, len(p) - 1:len(p) + len(r) - 1] = 1
        return cls(ids.to(device), response.to(device), index)


def sequence_logprobs(model, batch: SequenceBatch, temperature: float) -> torch.Tensor:
    """``[B, L-1]`` log-probability of every next token under ``model`` at ``temperature``
    (the sampler's adjusted distribution without top-p); read it where ``batch.response``.

    No attention mask is passed: the sequences are right-padded, so under causal attention no
    real token sees a pad, and the plain causal path (SDPA's ``is_causal`` kernel, positions
    0..L-1) gives the real tokens exactly the masked values, without building a mask."""
    logits = model(input_ids=batch.ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped by similar length (longest first), each group's padded size at most
    ``budget`` tokens (a group holds at least one sequence): little padding per forward."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
