"""The event loop of ``cluster.dispatch``: one rollout replayed in sim time under a placement
policy's deal (``cluster.placement``), each worker decoding its live rows, refilling freed
slots from its queue or the shared one, and, under ``divided``, idle workers taking running
rows while a move pays (the model: ``cluster.dispatch``'s docstring).

Why its own module: the loop is the same for every policy; what they differ in, the order
and the queues, comes in from ``cluster.placement``, and the what-if table
(``cluster.seer_table``) only calls :func:`simulate_dispatch`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import check_choice, check_int, check_non_negative
from . import placement
from .cost import StepCost
from .placement import POLICIES, RULES
from .simulate import worker_speeds

__all__ = ["DispatchRun", "simulate_dispatch"]

_EPS = 1e-9


@dataclass(frozen=True)
class DispatchRun:
    """One simulated rollout under a placement policy: per request (as drawn) its ``worker``
    (where it ended), ``join`` (its first admission) and ``end`` seconds, and whether it
    ``moved``; ``busy`` each worker's seconds of prefill, re-prefill and decode;
    ``reprefill_s`` the re-prefills' seconds in all."""

    end: np.ndarray
    join: np.ndarray
    worker: np.ndarray
    moved: np.ndarray
    busy: np.ndarray
    reprefill_s: float

    @property
    def makespan(self) -> float:
        """The last request's end (seconds)."""
        return float(self.end.max()) if len(self.end) else 0.0

    @property
    def moves(self) -> int:
        """Requests moved mid-generation."""
        return int(self.moved.sum())

    def idle_fraction(self) -> float:
        """The share of the N workers' seconds up to the makespan that no work filled."""
        span = self.makespan * len(self.busy)
        return float(1.0 - self.busy.sum() / span) if span > 0 else 0.0


class _Plan:
    """A step's seconds and tau at a live batch under ``rule`` (cached per batch size)."""

    def __init__(self, cost: StepCost, rule: str):
        self.cost, self.rule, self.memo = cost, rule, {}

    def __call__(self, b: int) -> tuple[float, float]:
        if b not in self.memo:
            arm = str(self.cost.best_arm([b])[0]) if self.rule == "bandit" else "plain"
            self.memo[b] = (float(self.cost.seconds(arm, [b])[0]),
                            float(self.cost.tau(arm, [b])[0]))
        return self.memo[b]

    def finish(self, left) -> float:
        """Seconds until rows of ``left`` tokens each all end, decoded together."""
        lengths = np.sort(np.asarray(left, float))[::-1]
        seconds, done = 0.0, 0.0
        for b in range(len(lengths), 0, -1):  # b rows live until the b-th longest ends
            sec, tau = self(b)
            seconds += math.ceil((lengths[b - 1] - done) / tau - _EPS) * sec
            done = max(done, lengths[b - 1])
        return seconds


def simulate_dispatch(tokens, workers: int, cost: StepCost, max_batch: int | None = None,
                      policy: str = "static", predicted=None, prompt_tokens=None,
                      rule: str = "plain", prefill_per_token: float | None = None,
                      schedule_queues: bool = False, spread: float = 0.0,
                      seed: int = 0) -> DispatchRun:
    """One rollout of requests of ``tokens`` response tokens each (as drawn) on ``workers``
    workers of ``max_batch`` rows, placed by ``policy`` (``POLICIES``, ``cluster.dispatch``'s
    docstring) and decoded by ``rule`` (``RULES``). ``predicted``: each request's predicted
    length (``longest_first`` and ``divided``; ``predicted_lengths``); ``prompt_tokens`` (per
    request or one number; 0 when None) and ``prefill_per_token`` (seconds per context token;
    default ``placement.prefill_per_token`` of the costs) charge ``divided``'s re-prefills.
    ``schedule_queues``: ``longest_first`` with per-worker queues dealt in that order (the
    harness's ``seer_schedule``) instead of one shared queue. ``spread``: stragglers, each
    worker's steps (prefills and re-prefills too) ``simulate.worker_speeds(N, spread, seed)``
    times their cost, as ``simulate_rollout`` takes them (0: every worker alike)."""
    tokens = np.asarray(tokens, np.int64)                                       # 1) the inputs
    n, R = check_int("workers", workers, 1), len(tokens)
    policy = check_choice("policy", policy, POLICIES)
    rule = check_choice("rule", rule, RULES)
    cap = check_int("max_batch", max_batch, 1, optional="each worker's share")
    cap = cap if cap is not None else max(1, math.ceil(R / n))
    cost.seconds("plain", [1])  # names the missing kind before anything runs
    prompts = np.broadcast_to(np.asarray(0 if prompt_tokens is None else prompt_tokens, float),
                              (R,))
    predicted, order = placement.request_order(policy, tokens, predicted)       # 2) the deal
    per_worker = policy == "static" or (policy == "longest_first" and schedule_queues)
    queues, shared = placement.deal(order, n, cap, per_worker)
    per_token = None                                                            # 3) re-prefills
    if policy == "divided":
        per_token = (prefill_per_token if prefill_per_token is not None else
                     placement.prefill_per_token(cost, prompts.mean() if R else 0.0))
    speed = worker_speeds(n, check_non_negative("spread", spread), seed)        # 4) the loop
    return _Loop(tokens, n, cap, cost, _Plan(cost, rule), queues, shared, predicted, prompts,
                 per_token, speed).run()


class _Loop:
    """The event loop of :func:`simulate_dispatch`: per worker its live rows (request ->
    tokens left at its segment's start), the segment's start, step seconds and tau."""

    def __init__(self, tokens, n, cap, cost, plan, queues, shared, predicted, prompts, per_token,
                 speed):
        self.tokens, self.n, self.cap, self.plan = tokens, n, cap, plan
        self.queues, self.shared, self.predicted, self.prompts = queues, shared, predicted, prompts
        self.per_token, self.prefill, self.speed = per_token, cost.has("prefill"), speed
        self.cost = cost
        R = len(tokens)
        self.end, self.join = np.full(R, np.nan), np.full(R, np.nan)
        self.worker, self.moved = np.full(R, -1), np.zeros(R, bool)
        self.busy, self.reprefill_s = np.zeros(n), 0.0
        self.live = [dict() for _ in range(n)]
        self.start = np.zeros(n)  # the running segment's start (its prefill ended)
        self.sec, self.tau = np.ones(n), np.ones(n)
        self.next = np.full(n, np.inf)

    def run(self) -> DispatchRun:
        for w in range(self.n):
            self._admit(w, 0.0)
        while True:
            w = int(np.argmin(self.next))
            t = float(self.next[w])
            if not math.isfinite(t):
                break
            self._advance(w, t)
            for i, left in list(self.live[w].items()):
                if left <= _EPS:
                    self.end[i] = t
                    del self.live[w][i]
            self._admit(w, t)
            if self.per_token is not None and not self.live[w]:
                self._divide(t)
        return DispatchRun(self.end, self.join, self.worker, self.moved, self.busy,
                           self.reprefill_s)

    def _queue(self, w):
        return self.queues[w] if self.queues[w] or self.shared is None else self.shared

    def _steps_by(self, w, t) -> float:
        """Decode steps worker ``w``'s segment has finished by ``t`` (a step in flight: 0)."""
        return max(0.0, math.floor((t - self.start[w]) / self.sec[w] + _EPS))

    def _advance(self, w, t) -> None:
        """Move worker ``w``'s rows and segment start to ``t``, a step end."""
        steps = self._steps_by(w, t)
        for i in self.live[w]:
            self.live[w][i] = max(0.0, self.live[w][i] - steps * self.tau[w])
        self.busy[w] += steps * self.sec[w]
        self.start[w] = t

    def _segment(self, w, t) -> None:
        """Worker ``w`` decodes its live rows from ``t``: its next event, a row's end."""
        self.start[w] = t
        if not self.live[w]:
            self.next[w] = np.inf
            return
        sec, self.tau[w] = self.plan(len(self.live[w]))
        self.sec[w] = sec * self.speed[w]
        steps = math.ceil(min(self.live[w].values()) / self.tau[w] - _EPS)
        self.next[w] = t + steps * self.sec[w]

    def _admit(self, w, t) -> None:
        queue = self._queue(w)
        if queue and len(self.live[w]) < self.cap:
            k = min(self.cap - len(self.live[w]), len(queue))
            admitted = [queue.popleft() for _ in range(k)]
            if self.prefill:
                sec = float(self.cost.seconds("prefill", [k])[0]) * self.speed[w]
                t += sec
                self.busy[w] += sec
            for i in admitted:
                self.join[i], self.worker[i] = t, w
                left = float(self.tokens[i]) - (1 if self.prefill else 0)
                if left <= _EPS:
                    self.end[i] = t
                else:
                    self.live[w][i] = left
            if not self.live[w]:
                return self._admit(w, t)
        self._segment(w, t)

    def _divide(self, now) -> None:
        """Idle workers (nothing live or queued) take running rows while a move pays."""
        while True:
            idle = [w for w in range(self.n) if not self.live[w] and not self._queue(w)]
            donors = [w for w in range(self.n) if len(self.live[w]) >= 2
                      and any(not self.moved[i] for i in self.live[w])]
            if not idle or not donors:
                return
            source = max(donors, key=lambda w: (len(self.live[w]), -w))
            to = min(idle)
            take = self._worth_moving(source, to, now)
            if not take:
                return
            self._move(source, to, take, now)

    def _left_at(self, w, t) -> dict:
        """Worker ``w``'s rows' true tokens left after its step in flight at ``t``."""
        steps = math.ceil((t - self.start[w]) / self.sec[w] - _EPS) if t > self.start[w] else 0
        return {i: max(0.0, left - steps * self.tau[w]) for i, left in self.live[w].items()}

    def _worth_moving(self, source, to, now) -> list:
        left = self._left_at(source, now)
        done = {i: self.tokens[i] - left[i] for i in left}
        guess = {i: max(1.0, self.predicted[i] - done[i]) for i in left}
        free = sorted((i for i in left if not self.moved[i]), key=lambda i: (-guess[i], i))
        alone = self.plan.finish(list(guess.values())) * self.speed[source]
        best, best_end = [], alone
        for k in range(1, max(1, len(left) // 2) + 1):
            moved = free[:k]
            stay = [guess[i] for i in left if i not in moved]
            context = sum(self.prompts[i] + done[i] for i in moved)
            end = max(self.plan.finish(stay) * self.speed[source],
                      (self.per_token * context + self.plan.finish([guess[i] for i in moved]))
                      * self.speed[to])
            if end < best_end - _EPS:
                best, best_end = moved, end
        return best

    def _move(self, source, to, take, now) -> None:
        """``take`` leaves ``source`` after its step in flight and is re-prefilled on ``to``."""
        s = self.start[source]
        release = s + math.ceil((now - s) / self.sec[source] - _EPS) * self.sec[source] \
            if now > s else s
        self._advance(source, release)
        for i in list(self.live[source]):  # rows that ended with the step in flight
            if self.live[source][i] <= _EPS:
                self.end[i] = release
                del self.live[source][i]
        rows = {i: self.live[source].pop(i) for i in take if i in self.live[source]}
        self._segment(source, release)
        begin = max(now, release)
        context = sum(self.prompts[i] + self.tokens[i] - left for i, left in rows.items())
        seconds = self.per_token * context * self.speed[to]
        self.busy[to] += seconds
        self.reprefill_s += seconds
        for i in rows:
            self.moved[i], self.worker[i] = True, to
        self.live[to] = rows
        self._segment(to, begin + seconds)
