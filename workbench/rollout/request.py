"""Requests in and out of a rollout: what a worker is given, and what it gives back."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Request", "RequestOutput"]


@dataclass(frozen=True)
class Request:
    """One response to generate: its uid (prompt, sample index, RL step; see ``make_uid``),
    its prompt's token ids, and its own length cap (``None``: the config's
    ``max_new_tokens``; a response continued from where an earlier step cut it has only the
    rest of its budget)."""

    uid: int
    prompt_id: int
    sample_idx: int
    prompt_ids: tuple[int, ...]
    max_new_tokens: int | None = None


@dataclass
class RequestOutput:
    """One request's result. ``tokens`` is the response (EOS included when emitted)."""

    uid: int
    prompt_id: int
    sample_idx: int
    prompt_ids: list[int]
    worker: int = -1
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""
    start_s: float = 0.0
    end_s: float = 0.0
    text: str = ""
    accepted_per_step: list[int] = field(default_factory=list)  # drafts accepted per verify
    emitted_per_step: list[int] = field(default_factory=list)   # tokens emitted per verify
    drafted: int = 0
    hidden: torch.Tensor | None = None
    max_new_tokens: int | None = None  # the request's own cap (None: the config's)

    @classmethod
    def of(cls, request: Request, worker: int) -> "RequestOutput":
        """A fresh output for ``request``, decoded on ``worker``."""
        return cls(request.uid, request.prompt_id, request.sample_idx,
                   list(request.prompt_ids), worker, max_new_tokens=request.max_new_tokens)

    def record(self) -> dict:
        """This request's row of the timeline's requests table."""
        return {"worker": self.worker, "uid": self.uid, "prompt_id": self.prompt_id,
                "sample_idx": self.sample_idx, "start_s": self.start_s, "end_s": self.end_s,
                "prompt_tokens": len(self.prompt_ids), "response_tokens": len(self.tokens),
                "finish": self.finish, "verify_steps": len(self.emitted_per_step),
                "drafted": self.drafted, "accepted": sum(self.accepted_per_step),
                "emitted": sum(self.emitted_per_step),
                "reward": float("nan"), "text": self.text}
