"""Several drafters over one batch, so that a schedule can choose, step by step, which drafts.

The adaptive engine's bandit weighs strategies against each other, and some strategies are
another drafter's: ``"sibling:k=4"`` (:class:`~workbench.speculative.sibling.SiblingDrafter`)
beside the EAGLE chains and trees. A worker has one drafter, so the choice is a set of them:
every member hears every ``begin``, ``keep_rows`` and ``add_rows`` and so keeps its per-row
state in step with the policy's batch, while only the member that a step's plan names
(``StepPlan.drafter``; the main member when it names none) drafts; the decoder picks it
(``rollout.plan.serving_drafter``). A member that skipped rounds catches up when it next
drafts, as after plain steps: an EAGLE head on the policy states the decoder keeps for it
(the set ``needs_hidden`` when a member does, and the states accumulate until that member
drafts), a model-free drafter on the committed sequences.
"""
from __future__ import annotations

from .drafters import Drafter

__all__ = ["DrafterSet"]


class DrafterSet(Drafter):
    """``members`` (``{name: drafter}``) over one batch; ``main`` (default: the first name)
    drafts the steps whose plan names no member, and is the set's trainable ``module`` (what
    a backend's ``update_weights`` loads) and tree drafter."""

    name = "set"

    def __init__(self, members: dict, main: str | None = None):
        if not isinstance(members, dict) or not members:
            raise ValueError(f"members must be a non-empty dict of {{name: drafter}}, got "
                             f"{members!r}")
        bad = [n for n in members if not isinstance(n, str) or not n]
        if bad:
            raise ValueError(f"member names must be non-empty strings, got {bad!r}")
        nested = [n for n, d in members.items() if d.members is not None]
        if nested:
            raise ValueError(f"members {nested} are drafter sets themselves; accepted: "
                             "drafters, one set of them")
        main = next(iter(members)) if main is None else main
        if main not in members:
            raise ValueError(f"main {main!r} is not a member; accepted: {list(members)}")
        self.members, self.main = dict(members), main

    @property
    def needs_hidden(self) -> bool:
        return any(d.needs_hidden for d in self.members.values())

    @property
    def supports_trees(self) -> bool:
        return self.members[self.main].supports_trees

    @property
    def module(self):
        return self.members[self.main].module

    def check_compatible(self, policy, tokenizer) -> None:
        for drafter in self.members.values():
            drafter.check_compatible(policy, tokenizer)

    def begin(self) -> None:
        for drafter in self.members.values():
            drafter.begin()

    def keep_rows(self, rows: list[int]) -> None:
        for drafter in self.members.values():
            drafter.keep_rows(rows)

    def add_rows(self, n: int) -> None:
        for drafter in self.members.values():
            drafter.add_rows(n)

    def draft(self, ctx, k: int):
        return self.members[self.main].draft(ctx, k)

    def draft_tree(self, ctx, k: int, branch: int):
        return self.members[self.main].draft_tree(ctx, k, branch)
