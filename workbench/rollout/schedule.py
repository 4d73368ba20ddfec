"""Step schedules: at every decode step of every worker, plain or speculative, and how.

The engine asks ``schedule.plan(batch_size, worker)`` before each decode step and answers
with ``schedule.observe(report)`` after it. Every hook the rollout layer calls is declared, with
its default, by :class:`Schedule`, which every schedule subclasses: callers read the hooks
directly, so a misspelled override is the only way to lose one, and the engine refuses an
object that is not a ``Schedule`` before its first step (:func:`check_schedule`). A schedule may change its mind at every step of
the same batch: plain and speculative steps leave the batch in the same state (one emitted,
unfed token per row), and the output is lossless either way, so a schedule decides speed
only, never what is sampled. TLT's adaptive engine (a bandit per batch-size bucket that picks
plain decoding or an SD strategy from what each has measured on this machine) is one such
schedule; the static ones here reproduce plain decoding, the fixed-``k`` SD of
``rollout(..., drafter=d)`` and a fixed threshold.

With the local backend every worker consults the same schedule object, one after another. A
backend whose workers live in other processes hands each worker its own copy; its reports are
the worker's to keep, and the steps table holds every step's figures for the driver.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..checks import check_int
from .plan import PLAIN, StepPlan
from .timeline import RESERVED_STEP_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["StepPlan", "StepReport", "Decision", "Schedule", "PlainSchedule", "StaticSchedule",
           "ThresholdSchedule", "check_schedule"]

SCALARS = (bool, int, float, str, type(None))  # what a decision column may hold


@dataclass(frozen=True)
class StepReport:
    """What one decode step did, as the schedule sees it.

    ``rows`` is the live batch size the step ran at; ``tokens`` the response tokens it
    emitted over all rows (after cuts at EOS or the length cap); ``drafted``/``accepted`` the
    draft tokens proposed and kept over all rows (0 for a plain step); ``draft_s`` the
    drafter's seconds, ``forward_s`` the policy forward's, ``elapsed_s`` the whole step's
    (drafting, verification and bookkeeping) on the worker's clock; ``drafter`` the name of
    the drafter that drafted (``plan.serving_drafter``; ``None`` when none did).
    """

    worker: int
    plan: StepPlan
    rows: int
    tokens: int
    drafted: int
    accepted: int
    draft_s: float
    forward_s: float
    elapsed_s: float
    drafter: str | None = None
    decision: "Decision | None" = None


@dataclass(frozen=True)
class Decision:
    """A schedule's answer for one decode step: the ``plan``, the ``reasons`` for it (scalars
    under names of the schedule's own choosing: the steps table's decision columns) and a
    ``choice`` the rollout layer never reads, which comes back to the schedule on the step's
    :class:`StepReport` (``report.decision``), so that what it learns from needs no state kept
    between its calls."""

    plan: StepPlan
    reasons: dict = field(default_factory=dict)
    choice: object = None


class Schedule(ABC):
    """The step-schedule protocol: every hook the rollout layer calls, with its default.

    Required: ``plan(batch_size, worker) -> StepPlan``, the plan of ``worker``'s next decode
    step at live batch ``batch_size``. The rest have defaults a schedule overrides as needed:

    ``decide(batch_size, worker) -> Decision``: what the worker calls: the plan with its
    reasons and a choice to learn from (:class:`Decision`). Default: ``plan``'s, with none.
    Each reason becomes a steps-table column beside the plan's (timeline.py, "decision
    columns"), written on the rows of that decode step; the rollout layer keeps them and never
    reads them, the schedule's own layer does (the bandit's: speculative/decisions.py).

    ``needs_drafter``: whether any plan may be speculative (the worker then refuses a rollout
    without a drafter). Default True: a schedule is there to decide when to speculate.

    ``needs_trees``: whether any plan may draft a tree, and ``drafter_names``: the drafters
    the plans name (``StepPlan.drafter``); the worker refuses a chain-only drafter, or one
    without those members, before the rollout's first forward. Defaults: False and none
    (every plan is still checked when it is drafted).

    ``observe(report)``: what the step did (:class:`StepReport`, its ``decision`` the one
    ``decide`` gave), e.g. as a bandit's reward.

    ``absorb(steps)``, for a schedule that learns: on a backend whose workers run copies
    (``Backend.runs_copies``: Ray actors), each copy learns alone and is then dropped, so the
    engine hands the rollout's steps table to ``absorb``, which learns from the decisions
    recorded there what the copies learned. Default: nothing to learn.

    ``learned() -> DataFrame | None``: what the schedule has learned of this machine, one
    row per batch-size bucket (``AdaptiveSchedule.learned``); ``None`` (the default): it
    learns nothing.
    """

    needs_drafter: bool = True
    needs_trees: bool = False
    drafter_names: frozenset = frozenset()

    @abstractmethod
    def plan(self, batch_size: int, worker: int) -> StepPlan: ...

    def decide(self, batch_size: int, worker: int) -> Decision:
        return Decision(self.plan(batch_size, worker))

    def observe(self, report: StepReport) -> None:
        pass

    def absorb(self, steps: "pd.DataFrame") -> None:
        pass

    def learned(self) -> "pd.DataFrame | None":
        return None


def check_schedule(schedule) -> Schedule:
    """``schedule`` when it is a :class:`Schedule`; else ``TypeError`` naming its type and
    the protocol's hooks (its hooks are read directly, so a schedule that merely looks like one
    would fail at its first missing hook, mid-rollout)."""
    if isinstance(schedule, Schedule):
        return schedule
    raise TypeError(f"schedule {type(schedule).__name__} ({schedule!r:.80}) is not a "
                    "workbench.rollout.schedule.Schedule: subclass it and define plan(batch_size, "
                    "worker); the hooks needs_drafter, needs_trees, drafter_names, observe, "
                    "decision, absorb and learned have defaults there")


class PlainSchedule(Schedule):
    """Every step plain: the policy alone."""

    needs_drafter = False

    def plan(self, batch_size: int, worker: int) -> StepPlan:
        return PLAIN


class StaticSchedule(PlainSchedule):
    """Every step speculative with the same draft depth ``k`` (a chain; a tree with
    ``branch > 1`` or a ``verify_budget``, see :class:`StepPlan`)."""

    needs_drafter = True

    def __init__(self, k: int = 4, branch: int = 1, verify_budget: int | None = None):
        self.step = StepPlan("speculative", k, branch, verify_budget)
        self.needs_trees = self.step.tree

    def plan(self, batch_size: int, worker: int) -> StepPlan:
        return self.step


class ThresholdSchedule(StaticSchedule):
    """Speculative with depth ``k`` once the live batch has at most ``max_batch`` rows,
    plain before: TLT's rule that SD pays in the long tail, when few requests remain. Where
    the rule pays depends on the machine, so there is no default: measure it (notebook 02's
    speedup-against-batch curve) or let :class:`~workbench.speculative.bandit.AdaptiveSchedule`
    learn it."""

    def __init__(self, k: int, max_batch: int):
        super().__init__(k)
        self.max_batch = check_int("max_batch", max_batch, 1)

    def plan(self, batch_size: int, worker: int) -> StepPlan:
        return self.step if batch_size <= self.max_batch else PLAIN


def plan_columns(plan: StepPlan, decision: int, drafter: str | None = None) -> dict:
    """The steps-table columns of decode step number ``decision`` that ran ``plan``, drafted
    by the drafter named ``drafter`` (``None``: none drafted)."""
    return {"decision": decision, "plan_k": plan.k if plan.speculative else 0,
            "plan_branch": plan.branch, "plan_budget": plan.verify_budget,
            "plan_drafter": drafter}


def checked_reasons(schedule: Schedule, decision: Decision) -> dict:
    """``decision``'s reasons, checked: scalar values under names that are not the rollout's
    own columns."""
    reasons = decision.reasons
    taken = RESERVED_STEP_COLUMNS.intersection(reasons)
    if taken:
        raise ValueError(f"{type(schedule).__name__}.decide() gave reasons under the names "
                         f"{sorted(taken)}, which are the rollout's own steps columns; use "
                         "other names")
    bad = {k: v for k, v in reasons.items() if not isinstance(v, SCALARS)}
    if bad:
        raise ValueError(f"{type(schedule).__name__}.decide() gave reasons {bad!r}; accepted "
                         "values: bool, int, float, str or None")
    return reasons
