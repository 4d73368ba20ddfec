"""Dynamic dispatch on the cluster simulator: requests placed when a worker frees, in an order
a policy gives, and Seer's divided rollout (arXiv 2511.14617), against static placement.

Why: ``simulate`` and ``remedies.run_rollout`` deal a step's requests round-robin and each
worker decodes its own share: which worker gets the long requests is luck. Seer's answer to
the tail is placement: the longest predicted requests first, from one shared queue, and a
running request moved to an idle worker. This module replays one rollout under each
placement policy (:data:`POLICIES`), so that the what-if can ask "Seer's scheduling, TLT, or
both?" at any N (:func:`seer_whatif`).

The rollout (one synchronous RL step, an event loop in sim time):

- each worker decodes at most ``max_batch`` rows at once (None: its round-robin share,
  ``ceil(R / N)``, so every request starts at once as ``simulate_rollout`` assumes); a
  finished row's slot is refilled at once with the next waiting request, whose prefill is
  one step of the rows admitted together (``StepCost`` ``prefill`` at their count, which
  emits each row's first token), as ``remedies.run_rollout`` does;
- a step costs ``StepCost.seconds`` at its live batch and emits one token per row
  (``rule="plain"``), or, under TLT's adaptive engine at its limit (``rule="bandit"``), the
  arm with the fewest seconds per token at that batch, emitting its tau per row (tau's
  expected value, as ``simulate`` takes it);
- the workers advance in sim-time order: the worker whose next event (a row finishing, a
  prefill ending) comes first goes next (ties: the lower worker), as ``LocalBackend.
  map_steps`` orders the harness's workers.

The policies (the requests *as drawn* are whole groups in order, request ``i`` the ``i``-th):

- ``static`` (the default): dealt round-robin as drawn (request ``i`` to worker ``i mod
  N``), each worker its own queue: today's layout, the same numbers as ``simulate_rollout``
  (no cap) and ``remedies.run_rollout`` (a cap);
- ``as_drawn``: the first batch of each worker dealt round-robin as drawn, the rest in one
  shared queue: the next request goes to the first worker to free a slot;
- ``longest_first``: the same, the order by predicted length, longest first (Seer's
  context-aware scheduling; the harness's ``seer_schedule`` keeps per-worker queues dealt in
  that order, which ``schedule_queues=True`` replays);
- ``divided``: ``longest_first``, and when a worker holds nothing while the queue is empty,
  it takes running requests of the worker that runs the most (two rows at least): of the
  moves of that worker's ``k`` longest predicted unmoved rows (``k`` up to half its rows),
  the one that ends both workers soonest, when that is sooner than the source alone would
  end (predicted lengths; decode steps at the cost curve; the re-prefill of the moved rows'
  prompts and tokens at ``prefill_per_token`` seconds per context token). The source lets
  them go after its step in flight; the receiving worker re-prefills them from then (that
  step emits no token), and each request moves at most once: the harness's ``seer_divided``
  (``DividedDispatch.worth_moving``).

Predictions (:func:`predicted_lengths`): the true length times log-normal noise
(``oracle``), or the mean of the group's other responses (``siblings``: Seer's observation
that a group's responses run alike; the harness's predictor learns them online as siblings
finish, which this static stand-in knows from the start).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..checks import check_choice, check_int, check_non_negative
from .cost import StepCost, UpdateCost
from .simulate import worker_speeds

__all__ = ["POLICIES", "RULES", "PREDICTORS", "DispatchRun", "predicted_lengths",
           "prefill_per_token", "simulate_dispatch", "SEER_SETTINGS", "seer_whatif",
           "seer_answer", "seer_metrics"]

POLICIES = ("static", "as_drawn", "longest_first", "divided")
"""The placement policies of :func:`simulate_dispatch` (module docstring); ``static`` is
today's layout."""
RULES = ("plain", "bandit")
"""How a step decodes: plain, or the bandit's limit (TLT's adaptive engine, ``StepCost.
best_arm``)."""
PREDICTORS = ("oracle", "siblings")
"""The length predictors of :func:`predicted_lengths`."""
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
    workers of ``max_batch`` rows, placed by ``policy`` (:data:`POLICIES`, module docstring)
    and decoded by ``rule`` (:data:`RULES`). ``predicted``: each request's predicted length
    (``longest_first`` and ``divided``; :func:`predicted_lengths`); ``prompt_tokens`` (per
    request or one number; 0 when None) and ``prefill_per_token`` (seconds per context token;
    default :func:`prefill_per_token` of the costs) charge ``divided``'s re-prefills.
    ``schedule_queues``: ``longest_first`` with per-worker queues dealt in that order (the
    harness's ``seer_schedule``) instead of one shared queue. ``spread``: stragglers, each
    worker's steps (prefills and re-prefills too) ``simulate.worker_speeds(N, spread, seed)``
    times their cost, as ``simulate_rollout`` takes them (0: every worker alike)."""
    tokens = np.asarray(tokens, np.int64)
    n, R = check_int("workers", workers, 1), len(tokens)
    policy = check_choice("policy", policy, POLICIES)
    rule = check_choice("rule", rule, RULES)
    cap = check_int("max_batch", max_batch, 1, optional="each worker's share")
    cap = cap if cap is not None else max(1, math.ceil(R / n))
    cost.seconds("plain", [1])  # names the missing kind before anything runs
    prompts = np.broadcast_to(np.asarray(0 if prompt_tokens is None else prompt_tokens, float),
                              (R,))
    if policy in ("longest_first", "divided"):
        if predicted is None:
            raise ValueError(f"policy {policy!r} needs predicted= (a length per request)")
        predicted = np.asarray(predicted, float)
        order = sorted(range(R), key=lambda i: (-predicted[i], i))
    else:
        predicted = tokens.astype(float) if predicted is None else np.asarray(predicted, float)
        order = list(range(R))
    if policy == "divided" and prefill_per_token is None:
        prefill_per_token = globals()["prefill_per_token"](cost, prompts.mean() if R else 0.0)
    per_worker = policy == "static" or (policy == "longest_first" and schedule_queues)
    dealt = [order[w::n] for w in range(n)]
    if per_worker:
        queues, shared = [deque(d) for d in dealt], None
    else:
        first = [d[:cap] for d in dealt]
        placed = {i for f in first for i in f}
        queues, shared = [deque(f) for f in first], deque(i for i in order if i not in placed)
    speed = worker_speeds(n, check_non_negative("spread", spread), seed)
    return _Loop(tokens, n, cap, cost, _Plan(cost, rule), queues, shared, predicted, prompts,
                 prefill_per_token if policy == "divided" else None, speed).run()


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


# ---- the what-if: Seer's scheduling, TLT, or both -----------------------------------------------
SEER_SETTINGS = {"static": ("static", "plain"), "tlt": ("static", "bandit"),
                 "seer_schedule": ("longest_first", "plain"),
                 "seer_divided": ("divided", "plain"), "tlt+seer_divided": ("divided", "bandit")}
"""The settings :func:`seer_whatif` compares, each ``(policy, rule)``: today's static layout
plain, TLT (the bandit's limit) on it, Seer's scheduling (shared queue, longest first), Seer's
divided rollout, and both."""


def seer_whatif(source, cost: StepCost, per_worker: int, max_batch: int | None,
                workers=(8, 16, 32, 64, 128, 256, 512, 1024), samples_per_prompt: int = 8,
                predictor: str = "siblings", noise: float = 0.0,
                update: float | UpdateCost = 0.0, prompt_tokens: float | None = None,
                prefill_per_token: float | None = None, spread: float = 0.0,
                seed: int = 0, draws: int = 1) -> pd.DataFrame:
    """Seer's scheduling, TLT, or both at every N of ``workers``: one RL step of ``N x
    per_worker`` requests (whole groups of a ``Trace`` or a ``LengthModel``'s draws,
    ``remedies.trace_steps``, seeded), each worker ``max_batch`` rows at once, replayed under
    each of :data:`SEER_SETTINGS` (predictions by ``predictor``, :func:`predicted_lengths`).
    One row per N: ``makespan_<setting>_s``, ``idle_fraction_<setting>``, ``moves`` and
    ``reprefill_s`` of ``seer_divided``, each the mean over ``draws`` steps (seeds ``seed``,
    ``seed + 1``, ...: their lengths and slow workers), and ``speedup_<setting>``, the mean
    static plain step's time (rollout and ``update``) over the setting's. Prompt tokens: the
    trace's mean where not given (a ``LengthModel``: 0 unless given). ``spread``: stragglers
    (``simulate_dispatch``), the same slow workers under every setting of a draw."""
    per_worker = check_int("per_worker", per_worker, 1)
    G = check_int("samples_per_prompt", samples_per_prompt, 1)
    draws = check_int("draws", draws, 1)
    if prompt_tokens is None:
        prompt_tokens = (float(source.requests["prompt_tokens"].mean())
                         if hasattr(source, "requests") else 0.0)
    rows = []
    for n in workers:
        n = check_int("workers", n, 1)
        update_s = update.seconds(n) if isinstance(update, UpdateCost) else float(update)
        step = pd.DataFrame([_seer_step(source, cost, n, per_worker, max_batch, G, predictor,
                                        noise, prompt_tokens, prefill_per_token, spread, s)
                             for s in range(seed, seed + draws)]).mean()
        row = {"workers": n, "requests": n * per_worker, "draws": draws, "update_s": update_s,
               **step.to_dict()}
        base = row["makespan_static_s"] + update_s
        for name in SEER_SETTINGS:
            row[f"speedup_{name}"] = base / (row[f"makespan_{name}_s"] + update_s)
        rows.append(row)
    return pd.DataFrame(rows)


def _seer_step(source, cost, n, per_worker, max_batch, G, predictor, noise, prompt_tokens,
               prefill_per_token, spread, seed) -> dict:
    """One drawn step of ``seer_whatif`` at N = ``n`` under every setting."""
    from .remedies import trace_steps
    need = n * per_worker
    groups = trace_steps(source, math.ceil(need / G) + 1, 1, G, seed)[0]
    while sum(len(g) for g in groups) < need:  # a trace's groups may be smaller than G
        groups += trace_steps(source, len(groups), 1, G, seed + len(groups))[0]
    tokens = np.concatenate(groups)[:need]
    labels = np.repeat(np.arange(len(groups)), [len(g) for g in groups])[:need]
    guess = predicted_lengths(tokens, labels, predictor, noise, seed)
    out = {}
    for name, (policy, rule) in SEER_SETTINGS.items():
        run = simulate_dispatch(tokens, n, cost, max_batch, policy, guess, prompt_tokens,
                                rule, prefill_per_token, spread=spread, seed=seed)
        out[f"makespan_{name}_s"] = run.makespan
        out[f"idle_fraction_{name}"] = run.idle_fraction()
        if name == "seer_divided":
            out["moves"], out["reprefill_s"] = run.moves, run.reprefill_s
    return out


def _row(table: pd.DataFrame, workers: int) -> pd.Series:
    rows = table[table["workers"] == workers]
    if len(rows) != 1:
        raise ValueError(f"the table has no row at N={workers}; its N: "
                         f"{table['workers'].tolist()}")
    return rows.iloc[0]


def seer_metrics(table: pd.DataFrame, workers: int = 64) -> dict[str, float]:
    """notebook 10's figures at ``workers`` (a row of :func:`seer_whatif`'s table): each
    setting's predicted speedup over the static plain step, keyed
    ``predicted_speedup_<setting>_{workers}``, and the divided rollout's moves."""
    r = _row(table, workers)
    out = {f"predicted_speedup_{k}_{workers}": float(r[f"speedup_{k}"])
           for k in SEER_SETTINGS if k != "static"}
    out[f"predicted_moves_seer_divided_{workers}"] = float(r["moves"])
    return out


def seer_answer(table: pd.DataFrame, workers: int, tie: float = 0.005) -> str:
    """The answer at ``workers`` (a row of :func:`seer_whatif`'s table), from its numbers:
    which of TLT, Seer (its divided rollout) and both is fastest (those within ``tie``, a
    relative margin, of the fastest tie with it), each one's speedup over the static plain
    step, and whether TLT still pays beside Seer and Seer beside TLT."""
    r = _row(table, workers)
    s = {k: float(r[f"speedup_{k}"]) for k in ("tlt", "seer_schedule", "seer_divided",
                                                "tlt+seer_divided")}
    names = {"tlt": "TLT", "seer_divided": "Seer", "tlt+seer_divided": "TLT with Seer"}
    top = max(s[k] for k in names)
    leaders = [names[k] for k in names if s[k] >= top / (1 + tie)]
    lead = (f"{leaders[0]} is fastest" if len(leaders) == 1
            else " and ".join(leaders) + " tie for fastest")
    pays = lambda gain: (f"still pays ({gain:.2f}x)" if gain > 1 + tie
                         else f"adds nothing ({gain:.3f}x)")
    return (f"N={workers}: {lead} (speedup over static plain: TLT {s['tlt']:.2f}x, Seer's "
            f"scheduling {s['seer_schedule']:.2f}x, Seer divided {s['seer_divided']:.2f}x, "
            f"both {s['tlt+seer_divided']:.2f}x); TLT beside Seer "
            f"{pays(s['tlt+seer_divided'] / s['seer_divided'])}, Seer beside TLT "
            f"{pays(s['tlt+seer_divided'] / s['tlt'])}")
