"""The exploring runs of TLT's bandit (``speculative/bandit.py``): which arm each bucket is
exploring now, and whether its next pull still settles.

A decode step right after the engine switches arms runs slower than the same step in a steady
stream (RESULTS.md ``bench_arm_switch``: on the compiled path the first plain step after SD
steps takes some 1.5x, fading over about four steps). An arm explored one step at a time
between steps of the best arm would only ever be measured in that transient, and
under-valued by as much. So an exploring pull commits its bucket to the arm for a run of
consecutive pulls, and the first of them (the settling pulls) teach nothing about its value.
"""
from __future__ import annotations

from ..checks import check_int

__all__ = ["ExploreRuns"]


class ExploreRuns:
    """The open exploring run of each bucket, at most one: its arm, the pulls it made and the
    worker whose budget pays for it (the one that started it).

    Args:
        length: pulls in a run (``explore_run``), the first included; 1 explores one step at
            a time.
        settle: the first pulls of a run whose rewards teach nothing (the switch's
            transient); ``0 <= settle < length``, so that a run that is not cut short
            measures its arm at least once.
    """

    def __init__(self, length: int, settle: int):
        self.length = check_int("explore_run", length, 1)
        self.settle = check_int(f"settle (with explore_run={length})", settle, 0,
                                self.length - 1)
        # bucket -> (its run's arm, pulls made, the worker whose budget pays)
        self.open: dict[str, tuple[str, int, int]] = {}

    @property
    def teaching(self) -> int:
        """The pulls of a run not cut short that teach: ``length - settle``, at least 1."""
        return self.length - self.settle

    def arm(self, bucket: str) -> str | None:
        """The arm ``bucket``'s open run explores (None: no run is open there)."""
        run = self.open.get(bucket)
        return None if run is None else run[0]

    def payer(self, bucket: str) -> int:
        """The worker whose budget pays for ``bucket``'s open run (one must be open)."""
        return self.open[bucket][2]

    def stop(self, bucket: str) -> None:
        """End ``bucket``'s run before its length (the budget no longer affords its arm, or
        the arm became the best)."""
        self.open.pop(bucket, None)

    def pull(self, bucket: str, arm: str, payer: int) -> bool:
        """Count an exploring pull of ``arm`` in ``bucket``: the next of the bucket's open run
        of ``arm``, else the first of a new one paid by ``payer``; whether it settles (teaches
        nothing). The run closes at its length."""
        made = self.open[bucket][1] if self.arm(bucket) == arm else 0
        if made + 1 < self.length:
            self.open[bucket] = (arm, made + 1, payer)
        else:
            self.open.pop(bucket, None)
        return made < self.settle
