"""A bandit pickled by an older version (a TLT checkpoint), brought to today's state so that
the run resumes: before the budget's ledger (``speculative/explore_budget.py``) a bandit held
its exploring share and cost sums itself, and before exploring runs
(``speculative/explore_runs.py``) it explored one step at a time. The resumed bandit keeps
its rewards, pulls and sums, and explores as it did (one step at a time); its recorded costs
fade from the resume on."""
from __future__ import annotations

from .explore_budget import ExploreBudget
from .explore_runs import ExploreRuns

__all__ = ["resumed_state"]

_OLD_LEDGER = ("last_cost", "arm_cost", "observed_s", "explore_cost_s")  # an older ledger


def resumed_state(state: dict) -> dict:
    """``BucketedBandit``'s ``__dict__`` from a pickled one, today's unchanged; an older one
    with its ledger moved into an :class:`ExploreBudget` and, lacking runs, runs of one pull
    that settle none (the rule it ran under)."""
    state = dict(state)
    if "budget" not in state:
        budget = ExploreBudget(state.pop("explore_budget"))
        old = {name: state.pop(name, {}) for name in _OLD_LEDGER}
        budget.observed_s = dict(old["observed_s"])
        budget.explore_cost_s = dict(old["explore_cost_s"])
        budget.bucket_costs = {key: (cost, 0) for key, cost in old["last_cost"].items()}
        budget.arm_costs = {arm: (cost, 0) for arm, cost in old["arm_cost"].items()}
        state["budget"] = budget
    state.setdefault("runs", ExploreRuns(1, 0))
    return state
