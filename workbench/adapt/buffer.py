"""The drafter's training data during RL: this step's harvest plus last step's long tail.

Every rollout step harvests ``(tokens, policy states)`` pairs (``harvest=True``). The spot
trainer runs while the step's longest responses are still decoding, so it can only use the
requests that have already finished, which are the short ones. TLT's *one-step offset* fixes
that bias: the buffer also serves the previous step's longest sequences, whose states come from
a policy one update old but whose length is what the drafter must get right in the tail.

One step's harvest is narrow: a few hundred sequences of a few dozen prompts. Trained on it
alone, the head fits those prompts and loses acceptance on others (RESULTS.md,
``drafter_narrow_harvest``), so the buffer can also keep whole harvests of the last
``history_steps`` steps, from policies a few updates old but on many more prompts.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..checks import check_fraction, check_int

__all__ = ["DrafterBuffer", "BufferItem"]


@dataclass
class BufferItem:
    """One harvested sequence: its pair, when it finished on the step's clock, its length."""

    pair: tuple            # (tokens [L], states [L-1, H]) as harvest_pairs gives it
    end_s: float
    response_tokens: int


class DrafterBuffer:
    """This step's harvested sequences (available once finished) plus the carry: the longest
    ``carry_fraction`` of the previous step's; plus, with ``history_steps``, every sequence of
    the previous ``history_steps`` steps.

    Args:
        carry_fraction: share of a step's sequences, longest first, carried into the next step.
        max_items: cap on the sequences served at once (newest step first, then the carry, then
            the history); ``None``: no cap.
        history_steps: previous steps whose whole harvest is served too (0: TLT's buffer).
    """

    def __init__(self, carry_fraction: float = 0.25, max_items: int | None = None,
                 history_steps: int = 0):
        carry_fraction = check_fraction("carry_fraction", carry_fraction)
        max_items = check_int("max_items", max_items, 1, optional=True)
        history_steps = check_int("history_steps", history_steps, 0)
        self.carry_fraction, self.max_items = carry_fraction, max_items
        self.current: list[BufferItem] = []
        self.carry: list[BufferItem] = []
        self.history: deque[list[BufferItem]] = deque(maxlen=history_steps or None)
        self.history_steps = history_steps

    def add_step(self, result, pairs) -> None:
        """Start a new step's harvest: ``pairs`` (``harvest_pairs(result)``) with the end times
        of ``result``'s requests. The previous step's longest sequences become the carry."""
        if len(pairs) != len(result.requests):
            raise ValueError(f"{len(pairs)} pairs for {len(result.requests)} requests")
        self.end_step()
        self.current = [BufferItem(p, r.end_s, len(r.tokens))
                        for p, r in zip(pairs, result.requests)]

    def end_step(self) -> None:
        """Move this step's longest ``carry_fraction`` into the carry (the one-step offset)."""
        if not self.current:
            return
        n = math.ceil(self.carry_fraction * len(self.current))
        longest = sorted(self.current, key=lambda it: -it.response_tokens)
        if self.history_steps:
            self.history.appendleft(self.current)  # newest first
        self.carry, self.current = longest[:n], []

    def pairs(self, until_s: float = math.inf, harvest: list[BufferItem] | None = None) -> list:
        """Pairs to train on at time ``until_s`` of this step: the sequences of its harvest
        finished by then (``harvest``: as far as it has come back, in request order; default
        the whole step's, ``add_step``'s), the carry, and the history's other sequences."""
        harvest = self.current if harvest is None else harvest
        ready = [it for it in harvest if it.end_s <= until_s]
        # the carry is part of the newest history step; pairs keep their identity through a
        # checkpoint (one pickled graph), items do not
        carried = {id(it.pair) for it in self.carry}
        older = [it for step in self.history for it in step if id(it.pair) not in carried]
        items = ready + self.carry + older
        if self.max_items is not None:
            items = items[:self.max_items]
        return [it.pair for it in items]

    def state(self) -> dict:
        """Counts for the steps table and notebooks."""
        return {"buffer_current": len(self.current), "buffer_carry": len(self.carry),
                "buffer_history": sum(map(len, self.history))}
