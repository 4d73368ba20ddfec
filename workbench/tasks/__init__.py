"""Verifiable tasks: the embedded running-sum generator, user JSONL files, rewards."""
from __future__ import annotations

import os
from pathlib import Path

from ..checks import check_choice, check_int
from .base import Problem, exact_match_reward
from .jsonl import load_jsonl
from .running_sum import RunningSumTask

__all__ = ["Problem", "RunningSumTask", "exact_match_reward", "load_jsonl", "get_problems",
           "get_reward", "TRAIN_SEED", "HELDOUT_SEED", "RL_SEED"]

TASKS = {"running_sum": RunningSumTask, "default": RunningSumTask}

# Seeds of the split every recipe and notebook agrees on: the zoo trains on TRAIN_SEED
# problems, RL draws its prompts from RL_SEED problems, evaluation uses HELDOUT_SEED problems
# (the generator's streams never coincide).
TRAIN_SEED = 0
"""The seed of the problems the zoo trains on."""
HELDOUT_SEED = 1_000_003
"""The seed of the held-out problems evaluation uses."""
RL_SEED = 2_000_003  # the RL prompt pool: neither the policy's training data nor held out
"""The seed of the RL prompt pool: neither the policy's training data nor held out."""


def get_problems(task: str | os.PathLike, num: int | None = None,
                 seed: int = HELDOUT_SEED) -> list[Problem]:
    """Problems of a named embedded task, or of a JSONL file path.

    ``task`` is one of :data:`TASKS` or a path ending in ``.jsonl`` (any case). ``num`` caps the
    count (required for generated tasks); for files it takes the first ``num`` lines.
    """
    check_int("num", num, 0, optional="every problem of a JSONL file")
    if isinstance(task, str) and task in TASKS:
        if num is None:
            raise ValueError(f"task {task!r} is generated: pass num, the number of problems")
        return TASKS[task]().generate(int(num), seed=seed)
    if isinstance(task, (str, os.PathLike)) and Path(task).suffix.lower() == ".jsonl":
        problems = load_jsonl(task)
        return problems if num is None else problems[:num]
    raise ValueError(f"unknown task {task!r}; accepted: {sorted(TASKS)} or a path to a .jsonl "
                     "file of {\"prompt\", \"answer\"} lines")


REWARDS = ("exact", "step")


def get_reward(name: str, task: str | os.PathLike = "running_sum"):
    """The reward called ``name`` for ``task``: ``"exact"`` (exact match of the final answer,
    any task) or ``"step"`` (the running-sum task's process reward,
    :meth:`RunningSumTask.step_reward`)."""
    check_choice("reward", name, REWARDS)
    if name == "exact":
        return exact_match_reward
    if not (isinstance(task, str) and task in TASKS):
        raise ValueError(f"reward 'step' checks running-sum traces; task {task!r} is not an "
                         f"embedded running-sum task ({sorted(TASKS)}); use reward='exact'")
    return TASKS[task]().step_reward
