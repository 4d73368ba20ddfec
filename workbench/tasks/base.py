"""What every task hands the rest of the workbench: problems and a reward.

A task is a list of :class:`Problem` records plus a reward function. The rollout engine only
sees prompts; RL and evaluation score completions with ``reward(prompt, completion, answer)``,
which users may replace with any callable of that signature.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Problem", "Reward", "extract_final_answer", "exact_match_reward"]


@dataclass(frozen=True)
class Problem:
    """One verifiable problem.

    ``reference`` is a worked solution (the trace a good policy would write, final answer
    included) when the task can produce one; user JSONL tasks leave it empty. ``meta`` holds
    task-specific facts such as the problem size that drives the trace length.
    """

    prompt: str
    answer: str
    reference: str = ""
    uid: int = 0
    meta: dict = field(default_factory=dict)


class Reward(Protocol):
    def __call__(self, prompt: str, completion: str, answer: str) -> float: ...


# The default task ends its trace with "#<answer>"; user tasks may end with anything, so the
# fallback is the last whitespace-separated word.
_FINAL_MARK = re.compile(r"#\s*(\S+)\s*$")


def extract_final_answer(completion: str) -> str:
    """The final answer of a completion: the text after the last ``#``, else its last word."""
    text = completion.strip()
    m = _FINAL_MARK.search(text)
    if m:
        return m.group(1)
    words = text.split()
    return words[-1] if words else ""


def exact_match_reward(prompt: str, completion: str, answer: str) -> float:
    """1.0 when the completion's final answer equals ``answer`` exactly, else 0.0."""
    return 1.0 if extract_final_answer(completion) == str(answer).strip() else 0.0
