"""Which request goes where under each placement policy of ``cluster.dispatch``: the
policies, decode rules and length predictors it names, the predicted lengths, the price of a
re-prefill, and a policy's deal (the order and the queues its rollout starts from).

Why its own module: the placement is what the policies differ in; the event loop that
replays them (``cluster.dispatch_loop``) is the same for all, and reads only the deal."""
from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from ..checks import check_choice, check_non_negative
from .cost import StepCost

__all__ = ["POLICIES", "RULES", "PREDICTORS", "predicted_lengths", "prefill_per_token",
           "request_order", "deal"]

POLICIES = ("static", "as_drawn", "longest_first", "divided")
"""The placement policies of ``simulate_dispatch`` (``cluster.dispatch``'s docstring);
``static`` is today's layout."""
RULES = ("plain", "bandit")
"""How a step decodes: plain, or the bandit's limit (TLT's adaptive engine, ``StepCost.
best_arm``)."""
PREDICTORS = ("oracle", "siblings")
"""The length predictors of :func:`predicted_lengths`."""


def predicted_lengths(tokens, groups=None, predictor: str = "oracle", noise: float = 0.0,
                      seed: int = 0) -> np.ndarray:
    """Each request's predicted response length: ``oracle``, its true length times
    ``exp(noise z - noise^2 / 2)`` (z standard normal, seeded; noise 0: exact); ``siblings``,
    the mean true length of the other requests of its group (``groups``: a label per request;
    a request alone in its group gets the mean of all)."""
    tokens = np.asarray(tokens, float)
    predictor = check_choice("predictor", predictor, PREDICTORS)
    noise = check_non_negative("noise", noise)
    if predictor == "oracle":
        z = np.random.default_rng(seed).standard_normal(len(tokens))
        return tokens * np.exp(noise * z - noise ** 2 / 2)
    if groups is None:
        raise ValueError("predictor 'siblings' needs groups= (a group label per request)")
    g = pd.Series(tokens).groupby(np.asarray(groups))
    total, count = g.transform("sum").to_numpy(), g.transform("count").to_numpy()
    alone = tokens.mean() if len(tokens) else 0.0
    return np.where(count > 1, (total - tokens) / np.maximum(count - 1, 1), alone)


def prefill_per_token(cost: StepCost, prompt_tokens: float) -> float:
    """A re-prefill's seconds per context token from the step costs: one prefill of a single
    row (``StepCost`` ``prefill`` at batch 1) over the ``prompt_tokens`` it read."""
    if not cost.has("prefill"):
        raise ValueError(f"the step costs have no prefill (measured kinds: {cost.kinds}); give "
                         "prefill_per_token= (seconds per context token) for divided")
    return float(cost.seconds("prefill", [1])[0]) / max(float(prompt_tokens), 1.0)


def request_order(policy: str, tokens: np.ndarray, predicted) -> tuple[np.ndarray, list]:
    """The predictions a policy works from and the order it places requests in: by predicted
    length, longest first (ties: as drawn), for ``longest_first`` and ``divided``, which
    therefore need ``predicted``; as drawn for the others (their predictions, the true
    lengths where not given, matter to no placement of theirs)."""
    R = len(tokens)
    if policy in ("longest_first", "divided"):
        if predicted is None:
            raise ValueError(f"policy {policy!r} needs predicted= (a length per request)")
        predicted = np.asarray(predicted, float)
        return predicted, sorted(range(R), key=lambda i: (-predicted[i], i))
    predicted = tokens.astype(float) if predicted is None else np.asarray(predicted, float)
    return predicted, list(range(R))


def deal(order: list, workers: int, cap: int, per_worker: bool) -> tuple[list, deque | None]:
    """The queues a rollout starts from: ``order`` dealt round-robin to the ``workers``, each
    worker its own queue (``per_worker``: ``static``, and ``longest_first`` replaying the
    harness's per-worker queues), or only each worker's first ``cap`` requests dealt and the
    rest in one shared queue (``None`` where there is none), which the first worker to free a
    slot draws from."""
    dealt = [order[w::workers] for w in range(workers)]
    if per_worker:
        return [deque(d) for d in dealt], None
    first = [d[:cap] for d in dealt]
    placed = {i for f in first for i in f}
    return [deque(f) for f in first], deque(i for i in order if i not in placed)
