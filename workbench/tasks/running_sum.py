"""The embedded default task: a running total over a labelled list, one written step per item.

A problem lists ``n`` labelled numbers; the worked solution keeps a running total (modulo
``modulus``), one step per item, then states the answer after ``#``. The default uses digits
and modulus 10, so every step is one lookup (find the next label, add one digit)::

    prompt     a7 b5 c8?
    reference   a7=7 b5=2 c8=0 #0

With ``modulus=None`` and ``max_value=99`` it is a plain running sum of two-digit numbers
(`` a47=47 b5=52 c81=133 #133``), much harder for a small model.

Why this shape: the trace length grows linearly with ``n`` and ``n`` is drawn from a clipped
log-normal, so reference lengths are long-tailed the way reasoning-RL responses are (a few
problems need many more steps than the median). Each step is local (find the next label in the
prompt, add one number), so a small model can learn it, while errors compound with the number
of steps: long problems are harder, which gives RL something to learn on the tail.
"""
from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass

from ..checks import check_int, check_non_negative, check_positive
from .base import Problem, exact_match_reward

__all__ = ["RunningSumTask", "LABELS"]

LABELS = string.ascii_lowercase  # at most 26 items per problem


@dataclass(frozen=True)
class RunningSumTask:
    """Generator of running-sum problems.

    Args:
        median_items: median number of items ``n`` per problem.
        sigma: log-normal spread of ``n``; larger gives a heavier tail.
        min_items, max_items: clip range of ``n`` (``max_items`` <= 26 labels).
        max_value: items are drawn uniformly from ``1..max_value``.
        modulus: the running total is kept modulo this (None: the plain sum).
    """

    median_items: float = 4.0
    sigma: float = 0.9
    min_items: int = 2
    max_items: int = 26
    max_value: int = 9
    modulus: int | None = 10
    name: str = "running_sum"

    def __post_init__(self):
        check_positive("median_items", self.median_items)
        check_non_negative("sigma", self.sigma)
        check_int("min_items", self.min_items, 1, len(LABELS))
        check_int("max_items (one label each, at least min_items)", self.max_items,
                  self.min_items, len(LABELS))
        check_int("max_value", self.max_value, 1)
        check_int("modulus", self.modulus, 2, optional="the plain sum")

    def sample_size(self, rng: random.Random) -> int:
        n = round(math.exp(rng.gauss(math.log(self.median_items), self.sigma)))
        return min(self.max_items, max(self.min_items, n))

    def make(self, items: list[int], uid: int = 0) -> Problem:
        """The problem for an explicit list of items."""
        if not 1 <= len(items) <= len(LABELS):
            raise ValueError(f"a problem has 1..{len(LABELS)} items, got {len(items)}")
        labelled = [f"{LABELS[i]}{v}" for i, v in enumerate(items)]
        prompt = " ".join(labelled) + "?"
        total, steps = 0, []
        for tag, v in zip(labelled, items):
            total = total + v if self.modulus is None else (total + v) % self.modulus
            steps.append(f"{tag}={total}")
        reference = " " + " ".join(steps) + f" #{total}"
        return Problem(prompt=prompt, answer=str(total), reference=reference, uid=uid,
                       meta={"items": len(items)})

    def step_reward(self, prompt: str, completion: str, answer: str) -> float:
        """A verifiable process reward: half for the share of the worked steps written
        correctly before the first mistake (each step's label, item and running total are
        checked against the prompt), half for the exact final answer. Denser than exact match
        alone, so that a group whose responses all miss the answer still says which got
        further; the final answer still decides the other half."""
        items = [tok[1:] for tok in prompt.rstrip("?").split()]
        expected, total = [], 0
        for i, item in enumerate(items):
            if not item.isdigit():
                return exact_match_reward(prompt, completion, answer)  # not one of ours
            total = total + int(item) if self.modulus is None else (total + int(item)) % self.modulus
            expected.append(f"{LABELS[i]}{item}={total}")
        written = completion.split("#")[0].split()
        good = 0
        for want, got in zip(expected, written):
            if want != got:
                break
            good += 1
        return 0.5 * good / len(expected) + 0.5 * exact_match_reward(prompt, completion, answer)

    def generate(self, num: int, seed: int = 0) -> list[Problem]:
        """``num`` problems drawn from ``seed``; the same seed always gives the same list."""
        check_int("num", num, 0)
        rng = random.Random(f"{self.name}:{seed}")
        out = []
        for uid in range(num):
            n = self.sample_size(rng)
            out.append(self.make([rng.randint(1, self.max_value) for _ in range(n)], uid=uid))
        return out
