"""The exploring budget of TLT's bandit (``speculative/bandit.py``): what exploring lost, per
worker, against what it may lose, and what exploring each arm is expected to lose.

A bandit learns only by pulling arms other than its best, and each such pull may lose time
against the best arm. The budget caps that loss at a share of each worker's observed seconds.
Both sides of the ledger fade by ``LEDGER_DECAY`` per observation, so that credit left unspent
for long cannot be spent in one burst; the expected cost of an arm (what its latest exploring
pull lost) fades by the same factor per observation since it was recorded, because it is one
sample: a pull slowed by something else (a first call's compile, a pause) would otherwise price
the arm out for good, since only pulling it again could correct the estimate.
"""
from __future__ import annotations

from ..checks import check_fraction

__all__ = ["ExploreBudget", "LEDGER_DECAY"]

LEDGER_DECAY = 0.999  # per observation: a worker's budget remembers its last ~1000 steps


class ExploreBudget:
    """Per-worker ledgers of seconds observed and lost to exploring, and the faded cost of
    each arm's latest exploring pull, per bucket and per arm.

    Args:
        share: the largest share of a worker's (faded) observed seconds that exploring may
            lose against the best arms; 0 never explores.
    """

    def __init__(self, share: float):
        self.share = check_fraction("explore_budget", share)
        self.observations = 0  # every worker's, in the order they came: the estimates' clock
        self.observed_s: dict[int, float] = {}   # per worker: (faded) seconds observed
        self.explore_cost_s: dict[int, float] = {}  # per worker: (faded) cost of exploring
        # (bucket, arm) -> (cost of its latest exploring pull, observations counted with it), and
        # arm -> the same whatever the bucket
        self.bucket_costs: dict[tuple[str, str], tuple[float, int]] = {}
        self.arm_costs: dict[str, tuple[float, int]] = {}

    def _faded(self, recorded: tuple[float, int]) -> float:
        cost, at = recorded
        return cost * LEDGER_DECAY ** (self.observations - at)

    def arm_cost(self, arm: str) -> float | None:
        """The faded cost of ``arm``'s latest exploring pull in any bucket (None before any)."""
        recorded = self.arm_costs.get(arm)
        return None if recorded is None else self._faded(recorded)

    def expected_cost(self, bucket: str, arm: str) -> float:
        """What an exploring pull of ``arm`` in ``bucket`` is expected to cost: its latest
        cost in the bucket, else in any bucket, faded; an arm never explored is expected to
        cost as much as the costliest arm explored so far, faded too (0 before any), so that
        a slow machine pays for one unknown arm, not for all of them at once, and one outlier
        does not price every unknown arm out for good."""
        recorded = self.bucket_costs.get((bucket, arm), self.arm_costs.get(arm))
        if recorded is not None:
            return self._faded(recorded)
        return max(map(self._faded, self.arm_costs.values()), default=0.0)

    def may_explore(self, worker: int = 0, cost: float = 0.0) -> bool:
        """Whether ``worker`` exploring at ``cost`` more seconds stays within the budget: its
        exploring cost at most ``share`` of its observed seconds (and some were; a share of 0
        never explores)."""
        observed = self.observed_s.get(worker, 0.0)
        return (self.share > 0 and observed > 0
                and self.explore_cost_s.get(worker, 0.0) + cost <= self.share * observed)

    def observe(self, worker: int, seconds: float, explored: tuple[str, str] | None = None,
                cost: float = 0.0) -> None:
        """Count one pull of ``worker`` that took ``seconds``; an exploring one (``explored``
        = its ``(bucket, arm)``) lost ``cost`` seconds, charged to the worker and recorded as
        the arm's latest cost."""
        self.observations += 1
        if explored is not None:
            self.bucket_costs[explored] = self.arm_costs[explored[1]] = (cost, self.observations)
        self.observed_s[worker] = LEDGER_DECAY * self.observed_s.get(worker, 0.0) + seconds
        self.explore_cost_s[worker] = LEDGER_DECAY * self.explore_cost_s.get(worker, 0.0) + cost
