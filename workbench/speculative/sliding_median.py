"""The value of an arm in TLT's bandit (``speculative/bandit.py``): the median of its latest
rewards, which shrugs off a step slowed by something else and forgets a drafter that has since
improved or degraded."""
from __future__ import annotations

import bisect
from collections import deque

__all__ = ["SlidingMedian"]


class SlidingMedian:
    """The median of the latest ``window`` values, kept sorted as they come and go, so that
    reading it costs nothing: the bandit reads every arm's median before every decode step."""

    def __init__(self, window: int):
        self.window, self.recent, self.ordered = window, deque(), []

    def append(self, value: float) -> None:
        if len(self.recent) == self.window:
            del self.ordered[bisect.bisect_left(self.ordered, self.recent.popleft())]
        self.recent.append(value)
        bisect.insort(self.ordered, value)

    def __len__(self) -> int:
        return len(self.recent)

    @property
    def median(self) -> float:
        """The median (the mean of the middle two for an even count); -inf when empty."""
        n = len(self.ordered)
        if not n:
            return float("-inf")
        mid = n // 2
        return self.ordered[mid] if n % 2 else (self.ordered[mid - 1] + self.ordered[mid]) / 2
