"""BEG-MAB: TLT's bucketed epsilon-greedy bandit, and the adaptive schedule built on it.

TLT's adaptive engine speculates only once a worker's live batch has fallen to a threshold
(below it SD pays; above it the batch alone keeps the hardware busy), and lets a bandit pick
the SD strategy, because the best draft depth or tree shape depends on the batch size (a
verify pass of many tokens is cheap at batch 1 and dear at batch 32) and on how well the
drafter currently matches a policy that changes every RL step. Each batch-size bucket has its
own bandit; with probability epsilon it explores a uniformly random arm, otherwise it takes the
arm with the best median reward over a sliding window of its latest observations (the median
shrugs off a step slowed by something else on the machine; the window forgets a drafter that
has since improved or degraded). Arms never pulled in a bucket are pulled first, in order.
Reward = tokens the step emitted per second of the step: (mean accepted + 1) x batch / elapsed.

Strategies are :class:`~workbench.rollout.schedule.StepPlan` values, written as strings:

``"chain:k=K"``            a chain of K draft tokens per row;
``"tree:k=K,b=B[,n=N]"``   a tree K deep, B tokens per node, N tokens verified per row (all
                           when omitted).

Buckets are given by their lower edges: the default ``(1, 2, 4, ..., 128)`` makes buckets
``1``, ``2-3``, ``4-7``, ..., ``64-127`` and ``128+`` (powers of two).
"""
from __future__ import annotations

import random
import re
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from ..checks import check_int
from ..rollout.schedule import DEFAULT_SD_THRESHOLD, StepPlan, StepReport

__all__ = ["BucketedBandit", "Choice", "AdaptiveSchedule", "parse_strategy", "strategy_name",
           "DEFAULT_ARMS", "DEFAULT_BUCKET_EDGES", "STRATEGY_FORMS"]

DEFAULT_BUCKET_EDGES = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_ARMS = ("chain:k=2", "chain:k=4", "chain:k=6", "tree:k=4,b=3,n=16")
STRATEGY_FORMS = "'chain:k=K' or 'tree:k=K,b=B[,n=N]' (integers K, B, N >= 1)"
_CHAIN = re.compile(r"chain:k=(\d+)")
_TREE = re.compile(r"tree:k=(\d+),b=(\d+)(?:,n=(\d+))?")


def parse_strategy(strategy: str | StepPlan) -> StepPlan:
    """The speculative :class:`StepPlan` a strategy string names (a speculative plan passes
    through); ValueError naming anything else and the accepted forms."""
    if isinstance(strategy, StepPlan) and strategy.speculative:
        return strategy
    text = strategy.replace(" ", "") if isinstance(strategy, str) else ""
    chain, tree = _CHAIN.fullmatch(text), _TREE.fullmatch(text)
    k, b, n = (chain.group(1), "1", None) if chain else tree.groups() if tree else ("0", "1", None)
    if int(k) < 1 or int(b) < 1 or (n is not None and int(n) < 1):  # no match reads as k=0
        raise ValueError(f"unknown SD strategy {strategy!r}; accepted: {STRATEGY_FORMS}, "
                         "or a speculative StepPlan")
    return StepPlan("speculative", int(k), int(b), None if n is None else int(n))


def strategy_name(plan: StepPlan) -> str:
    """The canonical string of a speculative plan (what :func:`parse_strategy` reads back)."""
    if plan.branch == 1 and plan.verify_budget is None:
        return f"chain:k={plan.k}"
    budget = "" if plan.verify_budget is None else f",n={plan.verify_budget}"
    return f"tree:k={plan.k},b={plan.branch}{budget}"


def _bucket_labels(edges: tuple[int, ...]) -> list[str]:
    """``["1", "2-3", ..., "128+"]`` for lower edges ``(1, 2, ..., 128)``."""
    labels = [str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])]
    return labels + [f"{edges[-1]}+"]


@dataclass(frozen=True)
class Choice:
    """One pull: the bucket whose bandit chose, the arm, and whether it explored (a random
    pull with probability epsilon, or an arm's first pull in its bucket) or exploited."""

    bucket: str
    arm: str
    explored: bool


class BucketedBandit:
    """One epsilon-greedy bandit per batch-size bucket over the same named arms.

    Args:
        arms: arm names, in the order untried arms are pulled.
        edges: lower edges of the buckets, strictly increasing from 1 (module docstring).
        epsilon: probability of a uniformly random pull once every arm was tried.
        window: observations per arm and bucket whose median is the arm's value.
        seed: of the bandit's own ``random.Random`` (never the global generator), so that a
            seeded run repeats its choices.
    """

    def __init__(self, arms: Sequence[str], edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
                 epsilon: float = 0.1, window: int = 300, seed: int = 0):
        self.arms = list(arms)
        if not self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms must be a non-empty list of distinct names, got {arms!r}")
        self.edges = tuple(edges)
        if (not self.edges or self.edges[0] != 1 or any(b <= a for a, b in zip(self.edges,
                                                                                self.edges[1:]))
                or any(isinstance(e, bool) or not isinstance(e, int) for e in self.edges)):
            raise ValueError(f"bucket edges must be strictly increasing integers starting at 1 "
                             f"(lower edges, e.g. {DEFAULT_BUCKET_EDGES}), got {edges!r}")
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) \
                or not 0 <= epsilon <= 1:
            raise ValueError(f"epsilon must be a number in [0, 1], got {epsilon!r}")
        check_int("window", window, 1)
        self.epsilon, self.window = float(epsilon), window
        self.labels = _bucket_labels(self.edges)
        self.rng = random.Random(seed)
        self.rewards = {(b, a): deque(maxlen=window) for b in self.labels for a in self.arms}
        self.pulls = {key: 0 for key in self.rewards}

    def bucket(self, batch_size: int) -> str:
        """The label of the bucket ``batch_size`` falls in."""
        check_int("batch_size", batch_size, 1)
        return self.labels[sum(e <= batch_size for e in self.edges) - 1]

    def choose(self, batch_size: int) -> Choice:
        """Pull an arm in ``batch_size``'s bucket: an untried arm first, then with
        probability epsilon a random one, else the best median reward (first on ties)."""
        bucket = self.bucket(batch_size)
        untried = [a for a in self.arms if self.pulls[bucket, a] == 0]
        if untried:
            arm, explored = untried[0], True
        elif self.rng.random() < self.epsilon:
            arm, explored = self.arms[self.rng.randrange(len(self.arms))], True
        else:
            arm = max(self.arms, key=lambda a: self.value(bucket, a))  # max keeps the first
            explored = False
        self.pulls[bucket, arm] += 1
        return Choice(bucket, arm, explored)

    def value(self, bucket: str, arm: str) -> float:
        """Median reward of ``arm`` over its window in ``bucket`` (-inf before any reward)."""
        seen = self.rewards[bucket, arm]
        return statistics.median(seen) if seen else float("-inf")

    def update(self, choice: Choice, reward: float) -> None:
        """Record the reward of a pull."""
        self.rewards[choice.bucket, choice.arm].append(float(reward))

    def table(self) -> pd.DataFrame:
        """The bandit's state: one row per (bucket, arm) pulled at least once, with
        ``pulls``, ``median_reward`` (over the window) and ``observed`` (rewards in it)."""
        rows = [{"bucket": b, "arm": a, "pulls": self.pulls[b, a],
                 "median_reward": self.value(b, a), "observed": len(self.rewards[b, a])}
                for b in self.labels for a in self.arms if self.pulls[b, a]]
        return pd.DataFrame(rows, columns=["bucket", "arm", "pulls", "median_reward",
                                           "observed"])


class AdaptiveSchedule:
    """TLT's adaptive engine as a step schedule: plain while a worker's live batch is above
    ``threshold``; at or below it, the batch's bucket's bandit picks the SD strategy, and the
    step's tokens per second are its reward. With one arm it is a :class:`ThresholdSchedule`.

    Args:
        threshold: largest live batch that speculates (integer >= 1); the default is the
            measured one of :data:`~workbench.rollout.schedule.DEFAULT_SD_THRESHOLD`.
        arms: strategies (strings, module docstring, or speculative StepPlans). The default
            includes tree arms; the engine runs them once tree drafting is in.
        epsilon, window, buckets, seed: of the :class:`BucketedBandit` (``buckets`` = lower
            edges).
    """

    needs_drafter = True

    def __init__(self, threshold: int = DEFAULT_SD_THRESHOLD, arms: Sequence = DEFAULT_ARMS,
                 epsilon: float = 0.1, window: int = 300,
                 buckets: Sequence[int] = DEFAULT_BUCKET_EDGES, seed: int = 0):
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise ValueError(f"threshold must be an integer >= 1 (the largest live batch that "
                             f"speculates), got {threshold!r}")
        if isinstance(arms, str) or not list(arms):
            raise ValueError(f"arms must be a non-empty list of strategies ({STRATEGY_FORMS}), "
                             f"got {arms!r}")
        plans = [parse_strategy(a) for a in arms]
        self.plans = {strategy_name(p): p for p in plans}
        if len(self.plans) != len(plans):
            raise ValueError(f"arms name the same strategy twice: {list(arms)!r}")
        self.threshold = threshold
        self.bandit = BucketedBandit(list(self.plans), buckets, epsilon, window, seed)
        self.pending: dict[int, Choice | None] = {}  # each worker's latest choice

    def plan(self, batch_size: int, worker: int) -> StepPlan:
        if batch_size > self.threshold:
            self.pending[worker] = None
            return StepPlan()
        choice = self.pending[worker] = self.bandit.choose(batch_size)
        return self.plans[choice.arm]

    def decision(self, worker: int) -> dict:
        """Why the latest plan for ``worker``: its bucket, arm and whether it explored
        (a plain step above the threshold: arm ``"plain"``, no bucket)."""
        choice = self.pending.get(worker)
        if choice is None:
            return {"bucket": None, "arm": "plain", "explored": False}
        return {"bucket": choice.bucket, "arm": choice.arm, "explored": choice.explored}

    def observe(self, report: StepReport) -> None:
        """Feed the step's tokens per second to the bandit that chose it (plain steps and
        steps with no measurable time teach nothing)."""
        choice = self.pending.pop(report.worker, None)
        if choice is not None and report.elapsed_s > 0:
            self.bandit.update(choice, report.tokens / report.elapsed_s)

    def table(self) -> pd.DataFrame:
        """The bandit's state per bucket and arm (:meth:`BucketedBandit.table`)."""
        return self.bandit.table()
