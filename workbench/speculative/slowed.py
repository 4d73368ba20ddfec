"""A drafter made slower on purpose (:class:`SlowedDrafter`): a hostile machine on which SD
cannot pay, for the tests and benchmarks of the adaptive engine."""
from __future__ import annotations

import time

from ..checks import check_non_negative

__all__ = ["SlowedDrafter"]


class SlowedDrafter:
    """``drafter`` made slower by ``delay_s`` seconds per drafted depth (a chain of ``k``
    drafts, or a tree ``k`` deep, waits ``k * delay_s`` more): a hostile machine on which SD
    cannot pay, for the tests and benchmarks of the adaptive engine. Its tokens, and every
    other hook of the :class:`Drafter` protocol (``head``, ``module``, ``begin``...), are the
    wrapped drafter's, delegated one by one; any other attribute is the wrapped drafter's too."""

    members = main = None  # one drafter, never a set (refused below)

    def __init__(self, drafter, delay_s: float):
        delay_s = self.check_delay(delay_s)
        if drafter.members is not None:  # its members would draft unslowed
            raise ValueError("SlowedDrafter wraps one drafter, not a DrafterSet; slow its "
                             "members instead: DrafterSet({name: SlowedDrafter(d, delay_s)})")
        self.drafter, self.delay_s = drafter, delay_s

    @staticmethod
    def check_delay(delay_s) -> float:
        """``delay_s`` as a float, or ``ValueError`` unless it is a finite number of seconds
        >= 0 (an infinite delay would hang the rollout)."""
        return check_non_negative("delay_s (seconds)", delay_s)

    def __getattr__(self, name):
        if "drafter" not in self.__dict__:  # while unpickling
            raise AttributeError(name)
        return getattr(self.__dict__["drafter"], name)

    name = property(lambda self: self.drafter.name)
    needs_hidden = property(lambda self: self.drafter.needs_hidden)
    supports_trees = property(lambda self: self.drafter.supports_trees)
    module = property(lambda self: self.drafter.module)
    head = property(lambda self: self.drafter.head)

    def check_compatible(self, policy, tokenizer) -> None:
        self.drafter.check_compatible(policy, tokenizer)

    def begin(self) -> None:
        self.drafter.begin()

    def keep_rows(self, rows: list[int]) -> None:
        self.drafter.keep_rows(rows)

    def add_rows(self, n: int) -> None:
        self.drafter.add_rows(n)

    def draft(self, ctx, k):
        self._wait(ctx, k)
        return self.drafter.draft(ctx, k)

    def draft_tree(self, ctx, k, branch):
        self._wait(ctx, k)
        return self.drafter.draft_tree(ctx, k, branch)

    def _wait(self, ctx, k: int) -> None:
        """``k`` delays on the worker's clock (``DraftInput.wait``: charged on the sim
        clock, slept on the wall clock); slept where the context has no clock."""
        getattr(ctx, "wait", time.sleep)(k * self.delay_s)
