"""The GRPO loss and what it reads: group advantages, the clipped token-level surrogate with
an optional k3 KL term, its aggregation, and one RL step's sequences with their log-probs.

Glossary (shapes at the signatures): ``B`` sequences of a (micro-)batch, ``L`` padded prompt
+ response length, ``G`` responses per prompt (a group). A sequence's *response part* is the
log-probability of each of its response tokens, ``[len(response)]``.

The pure pieces (:func:`group_advantages`, :func:`token_terms`, :func:`aggregate`) are what
the tests check against hand-computed values. :class:`UpdateData` is everything one RL step's
update reads, built once after the rollout and never changed: the sequences, their
advantages, and the old and reference log-probabilities. :class:`~workbench.rl.grpo.GRPO`
composes them with the engine and :class:`~workbench.train.Trainer`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import check_choice
from .config import LOSS_AGGREGATIONS

__all__ = ["LOSS_AGGREGATIONS", "group_advantages", "token_terms", "k3", "aggregate", "grpo_loss",
           "sequence_logprobs"]


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
                kl_coef: float = 0.0, weight=None):
    """Per-token loss ``[B, T]`` and clip indicator: the clipped surrogate
    ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` plus ``kl_coef`` times the k3
    estimate ``exp(ref - logp) - (ref - logp) - 1`` of KL(policy || reference).

    ``weight [B, T]`` (detached; None: 1) multiplies the surrogate: the behaviour importance
    weight of the decoupled PPO objective, for tokens that an older policy sampled
    (``rl.remedies.offpolicy``); ``old_logp`` is then the proximal policy's."""
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None].to(logp.dtype)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    loss = -torch.minimum(unclipped, clipped)
    if weight is not None:
        loss = weight * loss
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
    check_choice("aggregation", how, LOSS_AGGREGATIONS)
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


@dataclass(frozen=True)
class UpdateData:
    """What one RL step's update reads, fixed before its first optimizer step.

    ``prompts[i]`` and ``responses[i]`` are sequence ``i``'s token ids (request order: group
    after group); ``advantages [N]`` its group-relative advantage; ``old_logp[i]`` the
    response part under the policy before the update (``None``: on-policy, one epoch of one
    minibatch, where the loss's own forward is the old policy and its detached values serve);
    ``ref_logp[i]`` the response part under the reference (``None`` for sequences outside the
    KL sample). ``pad_id`` pads batches; ``device`` is the policy's. ``weights[i]`` the
    response part's importance weights (``None``: on-policy data, every weight 1).
    """

    prompts: list
    responses: list
    advantages: torch.Tensor
    old_logp: list | None
    ref_logp: list | None
    pad_id: int
    device: torch.device
    weights: list | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def micro(self, index: list[int], budget: int) -> list[SequenceBatch]:
        """Sequences ``index`` as padded batches of similar length, each at most ``budget``
        padded tokens (:func:`micro_batches`)."""
        lengths = [len(self.prompts[i]) + len(self.responses[i]) for i in index]
        return [SequenceBatch.of([self.prompts[index[j]] for j in g],
                                 [self.responses[index[j]] for j in g],
                                 [index[j] for j in g], self.pad_id, self.device)
                for g in micro_batches(lengths, budget)]

    def response_part(self, mb: SequenceBatch, row: int, values: torch.Tensor) -> torch.Tensor:
        """Row ``row`` of ``values [B, L-1]`` where its sequence's response tokens are."""
        i = mb.index[row]
        start = len(self.prompts[i]) - 1
        return values[row, start:start + len(self.responses[i])]

    def padded(self, mb: SequenceBatch, per_seq: list, like: torch.Tensor) -> torch.Tensor:
        """Per-sequence response parts laid out as ``like [B, L-1]`` (zeros elsewhere)."""
        out = torch.zeros_like(like)
        for row, i in enumerate(mb.index):
            start = len(self.prompts[i]) - 1
            out[row, start:start + len(per_seq[i])] = per_seq[i]
        return out

    @torch.no_grad()
    def logprobs(self, model, count: int, temperature: float, budget: int) -> list:
        """The response parts of the first ``count`` sequences under ``model`` (no grad);
        ``None`` for the rest."""
        out = [None] * len(self)
        for mb in self.micro(list(range(count)), budget):
            logp = sequence_logprobs(model, mb, temperature)
            for row, i in enumerate(mb.index):
                out[i] = self.response_part(mb, row, logp)
        return out


def minibatch_loss(model, data: UpdateData, index: list[int], config) -> tuple:
    """``(loss, metrics)`` of one optimizer step on sequences ``index`` of ``data`` under
    ``config`` (a :class:`~workbench.rl.config.GRPOConfig`), forward by forward.

    The old log-probabilities are ``data.old_logp``, or on-policy the forward's own detached
    values (the ratio is then exactly 1). Metrics: ``clip_fraction`` and ``tokens`` of the
    step, and ``drift_sum`` / ``drift_tokens``, the k3 estimate of KL(old policy || start)
    summed over the response tokens of the sequences that have a reference part, and their
    count (the RL step's ``kl_start`` is their ratio over its optimizer steps).
    """
    c = config
    sums, counts, clipped, drift, drift_tokens = [], [], 0.0, 0.0, 0
    for mb in data.micro(index, c.micro_tokens):
        logp = sequence_logprobs(model, mb, c.rollout.temperature)
        old = logp.detach() if data.old_logp is None else data.padded(mb, data.old_logp, logp)
        ref = data.padded(mb, data.ref_logp, logp) if c.kl_coef else None
        weight = None if data.weights is None else data.padded(mb, data.weights, logp)
        per_token, clip = token_terms(logp, old, data.advantages[mb.index], c.clip_eps, ref,
                                      c.kl_coef, weight)
        sums.append((per_token * mb.response).sum(1))
        counts.append(mb.response.sum(1))
        clipped += float((clip * mb.response).sum())
        for row, i in enumerate(mb.index):
            if data.ref_logp[i] is not None:
                drift += float(k3(data.ref_logp[i] - data.response_part(mb, row, old)).sum())
                drift_tokens += len(data.responses[i])
    counts = torch.cat(counts)
    loss = aggregate_sums(torch.cat(sums), counts, c.loss_aggregation)
    return loss, {"clip_fraction": clipped / max(1.0, float(counts.sum())),
                  "tokens": int(counts.sum()), "drift_sum": drift, "drift_tokens": drift_tokens}
