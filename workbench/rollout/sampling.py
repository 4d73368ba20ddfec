"""Sampling: the adjusted next-token distribution and coupled (batch-independent) draws.

Coupled sampling makes a rollout reproducible token for token: the uniform number that picks a
request's token at a position depends only on ``(seed, uid, position)``, never on which other
requests share the batch, nor on whether speculative decoding produced the position. Tokens
are then drawn by inverse CDF over the adjusted distribution in vocabulary order, a fixed
function of the logits and that uniform.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch

from ..checks import check_fraction, check_int, check_non_negative

__all__ = ["SamplingParams", "Stream", "adjusted_logprobs", "make_uid", "split_uid"]

_PROMPT_BITS, _SAMPLE_BITS = 24, 16
SEED_LIMIT = 2**64  # seeds are hashed as unsigned 64-bit integers: [0, 2**64) without wrapping


class Stream(IntEnum):
    """Independent families of coupled draws at the same ``(seed, uid, position)``."""

    TOKEN = 0    # the token emitted at a position (the policy's, and a coupled draft's)
    ACCEPT = 1   # speculative sampling: the accept test of a draft
    DRAFT = 2    # speculative sampling: the drafter's own draw, independent of the policy's


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen.

    Args:
        temperature: 0 is greedy (argmax); otherwise logits are divided by it.
        top_p: nucleus size in (0, 1]; 1 keeps the whole distribution.
        seed: root of every coupled draw of a rollout.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        check_non_negative("temperature (0: greedy)", self.temperature)
        check_fraction("top_p", self.top_p, low_open=True)
        check_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_seed(seed) -> None:
    """Seeds are integers in [0, 2**64): a float, a bool, a negative or a larger number would
    either fail deep inside sampling or silently wrap onto another seed's draws."""
    check_int("seed", seed, 0, SEED_LIMIT - 1)


def adjusted_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities of the distribution tokens are drawn from (last dim = vocabulary).

    Temperature scales the logits, then top-p keeps the smallest set of most likely tokens whose
    mass reaches ``top_p`` and renormalises. At temperature 0 (greedy) this is the plain
    ``log_softmax`` of the logits, which is what RL wants as the policy's logprob.
    Computed in float32 at least (float64 stays float64).
    """
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if params.greedy:
        return torch.log_softmax(x, dim=-1)
    logp = torch.log_softmax(x / params.temperature, dim=-1)
    if params.top_p < 1:
        sorted_lp, order = torch.sort(logp, dim=-1, descending=True)
        probs = sorted_lp.exp()
        mass_before = probs.cumsum(-1) - probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return logp


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def coupled_uniforms(seed: int, uids, positions, stream: Stream = Stream.TOKEN) -> np.ndarray:
    """Uniforms in [0, 1), one per ``(uid, position)`` pair, a pure function of the inputs.

    ``stream`` (a :class:`Stream`) separates independent uses of the same position.
    """
    uids = np.asarray(uids, dtype=np.int64).astype(np.uint64)
    positions = np.asarray(positions, dtype=np.int64).astype(np.uint64)
    h = _splitmix64(np.full_like(uids, np.uint64(seed)) ^ np.uint64(int(stream)))
    h = _splitmix64(h ^ uids)
    h = _splitmix64(h ^ positions)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def choose_tokens(logp: torch.Tensor, params: SamplingParams, uniforms=None) -> torch.Tensor:
    """Token ids from adjusted log-probs ``[..., V]``: argmax when greedy, else inverse CDF.

    ``uniforms`` (array of shape ``logp.shape[:-1]``) are the coupled draws; required unless
    greedy.
    """
    if params.greedy:
        return logp.argmax(dim=-1)
    return draw(logp, torch.as_tensor(np.asarray(uniforms)))


def draw(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids ``[...]`` by inverse CDF from log-probs ``logp [..., V]`` at uniforms
    ``u [...]`` (a tensor, moved to ``logp``'s device and dtype): the first token whose cumulative
    probability exceeds ``u`` times the total. Torch only, so a compiled graph draws the
    same way (an EAGLE chain's drafts, ``rollout.step_graph``)."""
    cdf = logp.exp().cumsum(-1)
    target = (u.to(cdf.device, cdf.dtype) * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True).squeeze(-1)
    return idx.clamp(max=logp.shape[-1] - 1)


def make_uid(prompt_id: int, sample_idx: int = 0, rl_step: int = 0) -> int:
    """The request uid: prompt, sample index within its group, and RL step packed in an int64."""
    prompt_id = check_int("prompt_id", prompt_id, 0, 2**_PROMPT_BITS - 1)
    sample_idx = check_int("sample_idx", sample_idx, 0, 2**_SAMPLE_BITS - 1)
    rl_step = check_int("rl_step", rl_step, 0, 2**23 - 1)
    return (rl_step << (_PROMPT_BITS + _SAMPLE_BITS)) | (prompt_id << _SAMPLE_BITS) | sample_idx


def split_uid(uid: int) -> tuple[int, int, int]:
    """``(prompt_id, sample_idx, rl_step)`` of a uid made by :func:`make_uid`."""
    return ((uid >> _SAMPLE_BITS) & (2**_PROMPT_BITS - 1), uid & (2**_SAMPLE_BITS - 1),
            uid >> (_PROMPT_BITS + _SAMPLE_BITS))
