"""Groups whose responses may outlive an RL step, grown segment by segment.

Glossary: a *group* is one prompt and its ``G`` responses (GRPO's unit: the advantage
compares a response with its group, so a group trains only when all ``G`` are done). A
*segment* is what a response grew by in one step's rollout. A token's *version* is the
number of policy updates done when it was sampled (the policy that sampled it), and its
*behaviour* log-prob that policy's, recorded as it is sampled (``None`` where the run trains
nothing off-policy and records none). A *carried* group is one unfinished when its step's
rollout ended, continued in the next step (partial rollouts, APRIL's recycling).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...tasks import Problem

__all__ = ["Response", "Group"]


@dataclass
class Response:
    """One sample of a group: its tokens so far and, per token, the version that sampled it
    and (recorded runs) that policy's log-prob of it. ``finish``: ``""`` while it is live,
    then ``"eos"`` or ``"length"``."""

    tokens: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    segments: list[torch.Tensor] = field(default_factory=list)  # behaviour log-probs
    finish: str = ""
    uid: int = -1  # the request that sampled its latest segment (-1: none yet)

    @property
    def done(self) -> bool:
        return bool(self.finish)

    def grow(self, tokens: list[int], version: int, uid: int, finish: str = "") -> None:
        """Append a segment of ``tokens`` sampled by policy ``version`` in request ``uid``;
        ``finish`` if the response ended with it."""
        if self.done:
            raise ValueError(f"this response already finished ({self.finish!r}); a finished "
                             "response takes no more tokens")
        self.tokens.extend(tokens)
        self.versions.extend([version] * len(tokens))
        self.finish, self.uid = finish, uid

    def behaviour(self) -> torch.Tensor:
        """``[len(tokens)]`` behaviour log-probs, segment after segment."""
        if sum(len(s) for s in self.segments) != len(self.tokens):
            raise ValueError(f"{sum(len(s) for s in self.segments)} behaviour log-probs for "
                             f"{len(self.tokens)} tokens: this run did not record them "
                             "(RemedyConfig.off_policy)")
        return torch.cat(self.segments) if self.segments else torch.zeros(0)


@dataclass
class Group:
    """A prompt, its token ids, and its ``G`` responses; ``drawn``: the prompt's index in
    the run's stream of fresh prompts (older groups first)."""

    problem: Problem
    prompt_ids: list[int]
    responses: list[Response]
    drawn: int

    @classmethod
    def fresh(cls, problem: Problem, prompt_ids: list[int], size: int, drawn: int) -> "Group":
        return cls(problem, list(prompt_ids), [Response() for _ in range(size)], drawn)

    @property
    def done(self) -> bool:
        return all(r.done for r in self.responses)

    @property
    def live(self) -> list[Response]:
        """The responses still growing."""
        return [r for r in self.responses if not r.done]

    def tokens(self) -> int:
        return sum(len(r.tokens) for r in self.responses)
