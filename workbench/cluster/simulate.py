"""The cluster simulator's core: one synchronous RL step on N virtual workers, replayed from
response lengths and measured step costs, and read with ``rollout.timeline.Timeline``'s own
measures (makespan, idle fraction, tail share, idle windows), never redefined here.

A worker decodes its requests in one batch (no continuous batching): a ``prefill`` step if
the costs have one (it emits each row's first token), then decode steps, each costing the
StepCost at the live batch size. Under the threshold rule a step is speculative (``strategy``)
while the live batch is below ``threshold`` B, plain otherwise (B = 0: always plain). A
speculative step emits tau tokens per row, tau's *expected value*: a row of r tokens left
needs ceil(r / tau) such steps (the spread of accepted lengths is not drawn). Under the
bandit rule each step takes the arm with the fewest seconds per token at its live batch
(``StepCost.best_arm``), the adaptive engine's limit.

Event-driven: between two events (a row finishing on a worker) a worker's live batch, and so
its step kind, cost and tau, stay fixed, so the steps up to its next event are counted at
once; each event loop turn advances every worker together (numpy over workers), at most one
turn per request slot. The steps table gets one row per such run of identical steps (a
*segment*: ``batch_size`` its live batch, ``tokens`` the tokens it emitted), which is all
the Timeline measures need.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..checks import check_choice, check_int, check_non_negative, check_positive
from ..rollout.timeline import Timeline
from .cost import StepCost, UpdateCost
from .trace import Trace

__all__ = ["Layout", "layout", "simulate_rollout", "simulate", "Prediction", "RULES",
           "worker_speeds", "plain_makespan"]

_EPS = 1e-9
RULES = ("threshold", "bandit")


@dataclass(frozen=True)
class Layout:
    """Requests laid out on workers: ``response`` and ``prompt`` token counts, both
    [N workers, R slots] int64; a slot with response 0 holds no request."""

    response: np.ndarray
    prompt: np.ndarray

    @property
    def workers(self) -> int:
        return self.response.shape[0]


def _as_trace_layout(trace: Trace) -> Layout:
    r = trace.requests
    n, slots = int(r["worker"].max()) + 1, int(r.groupby("worker").size().max())
    slot = r.groupby("worker").cumcount().to_numpy()
    response, prompt = np.zeros((n, slots), np.int64), np.zeros((n, slots), np.int64)
    response[r["worker"], slot] = r["response_tokens"]
    prompt[r["worker"], slot] = r["prompt_tokens"]
    return Layout(response, prompt)


def layout(trace: Trace, workers: int | None = None, per_worker: int | None = None,
           seed: int = 0) -> Layout:
    """The requests of one RL step on ``workers`` x ``per_worker`` slots. Without
    ``workers``: the trace's own (its ``worker`` column, replayed as recorded). With them:
    whole groups drawn from the trace with replacement (seeded) until there are enough
    requests, dealt round-robin like the engine's sharding (request i to worker i mod N)."""
    if workers is None:
        if not trace.has_workers:
            raise ValueError("this trace names no worker per request: give workers= and "
                             "per_worker= to lay its requests out")
        return _as_trace_layout(trace)
    n = check_int("workers", workers, 1)
    per = check_int("per_worker", per_worker, 1)
    r = trace.requests.sort_values("group", kind="stable")
    _, first, sizes = np.unique(r["group"].to_numpy(str), return_index=True, return_counts=True)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(sizes), int(np.ceil(n * per / sizes.mean())) + len(sizes))
    while sizes[picks].sum() < n * per:  # the expected count fell short: draw more
        picks = np.concatenate([picks, rng.integers(0, len(sizes), len(sizes))])
    # the rows of each picked group, in order: its first row's index plus 0..size-1
    counts = sizes[picks]
    rows = np.repeat(first[picks] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    rows = rows[:n * per]
    deal = lambda col: r[col].to_numpy(np.int64)[rows].reshape(per, n).T.copy()
    return Layout(deal("response_tokens"), deal("prompt_tokens"))


def _threshold_plan(cost: StepCost, threshold: int, strategy: str | None):
    """The threshold rule: ``strategy`` while the live batch is below ``threshold``."""
    def plan(b):
        sd = (b > 0) & (b < threshold) if strategy else np.zeros(len(b), bool)
        sec = np.where(sd, cost.seconds(strategy, b) if strategy else 0, cost.seconds("plain", b))
        return sec, np.where(sd, cost.tau(strategy, b) if strategy else 1, 1.0), sd
    return plan


def _bandit_plan(cost: StepCost):
    """The bandit's limit: at each live batch the arm with the fewest seconds per token."""
    arms = cost.arms
    def plan(b):
        b = np.maximum(b, 1)  # a finished worker's row is never used
        sec = np.stack([cost.seconds(k, b) for k in arms])
        tau = np.stack([cost.tau(k, b) for k in arms])
        best = (sec / tau).argmin(0)
        cols = np.arange(len(b))
        return sec[best, cols], tau[best, cols], best > 0
    return plan


def worker_speeds(workers: int, spread: float, seed: int) -> np.ndarray:
    """Each worker's step-time factor [N]: exp(spread z - spread^2 / 2), z standard normal
    (seeded), so factors have mean 1 and log-spread ``spread`` (0: every worker alike)."""
    z = np.random.default_rng(seed).standard_normal(workers)
    return np.exp(spread * z - spread ** 2 / 2)


def _segments(lay: Layout, cost: StepCost, plan, speed: np.ndarray):
    """Run the event loop under ``plan`` (live batch per worker -> seconds, tau and whether
    speculative, per worker), every step of worker i taking ``speed[i]`` times its cost:
    (segment columns, each request's end time [N, R])."""
    n = lay.workers
    rem = lay.response.astype(float)
    live = lay.response > 0
    t, end = np.zeros(n), np.full(rem.shape, np.nan)
    cols = {k: [] for k in ("worker", "kind", "start_s", "end_s", "batch_size", "tokens")}

    def record(mask, kind, start, stop, batch, tokens):
        idx = np.flatnonzero(mask)
        for name, v in (("worker", idx), ("start_s", start[idx]), ("end_s", stop[idx]),
                        ("batch_size", batch[idx]), ("tokens", tokens[idx])):
            cols[name].append(v)
        cols["kind"].append(np.where(kind[idx], "verify", "decode") if kind is not None
                            else np.full(len(idx), "prefill"))

    if cost.has("prefill"):
        b = live.sum(1)
        t = np.where(b > 0, cost.seconds("prefill", b) * speed, 0.0)
        record(b > 0, None, np.zeros(n), t, b, b.astype(float))
        rem = rem - live
    end[live & (rem <= _EPS)] = np.broadcast_to(t[:, None], rem.shape)[live & (rem <= _EPS)]
    live &= rem > _EPS
    while live.any():
        b = live.sum(1)
        active = b > 0
        sec, tau, sd = plan(b)
        sec = sec * speed
        sd = sd & active
        steps = np.where(active, np.ceil(np.where(live, rem, np.inf).min(1) / tau - _EPS), 0)
        stop = t + steps * sec
        emitted = np.where(live, np.minimum(rem, (steps * tau)[:, None]), 0.0)
        record(active, sd, t, stop, b, emitted.sum(1))
        rem = rem - emitted
        done = live & (rem <= _EPS)
        end[done] = np.broadcast_to(stop[:, None], rem.shape)[done]
        live &= ~done
        t = np.where(active, stop, t)
    return {k: np.concatenate(v) if v else np.array([]) for k, v in cols.items()}, end


def simulate_rollout(lay: Layout, cost: StepCost, threshold: int = 0,
                     strategy: str | None = None, rule: str = "threshold",
                     spread: float = 0.0, seed: int = 0) -> Timeline:
    """One simulated rollout step as a Timeline on the *sim* clock (steps rows are segments,
    see the module docstring). ``rule`` ``"threshold"``: speculative ``strategy`` below
    batch ``threshold`` B; ``"bandit"``: at each live batch the arm with the fewest seconds
    per token (``StepCost.best_arm``: the adaptive engine's limit), no threshold or strategy
    given. ``spread``: stragglers, each worker's steps ``worker_speeds(N, spread, seed)``
    times their cost (0: identical workers). The requests table's ``prompt_id`` is the
    request's slot on its worker (lengths alone carry no prompt), and every request starts at
    0 (one batch per worker)."""
    threshold = check_int("threshold", threshold, 0)
    rule = check_choice("rule", rule, RULES)
    spread = check_non_negative("spread", spread)
    if rule == "bandit" and (threshold or strategy is not None):
        raise ValueError(f"rule 'bandit' picks its arms itself; got threshold {threshold} and "
                         f"strategy {strategy!r} (accepted: 0 and None)")
    if threshold > 0 and strategy is None:
        raise ValueError(f"threshold {threshold} needs a strategy (a speculative kind of the "
                         f"step costs: {cost.arms[1:]})")
    cost.seconds("plain", [1])  # names the missing kind before anything runs
    if strategy is not None:
        cost.seconds(strategy, [1])
    plan = (_bandit_plan(cost) if rule == "bandit"
            else _threshold_plan(cost, threshold, strategy))
    seg, end = _segments(lay, cost, plan, worker_speeds(lay.workers, spread, seed))
    steps = pd.DataFrame({**seg, "step": pd.Series(seg["worker"]).groupby(seg["worker"])
                          .cumcount().to_numpy(), "forward_s": seg["end_s"] - seg["start_s"],
                          "clock": "sim"})
    steps = steps.astype({"worker": int, "batch_size": int})
    steps["tokens"] = np.round(steps["tokens"]).astype(int)
    w, s = np.nonzero(lay.response > 0)
    zeros = np.zeros(len(w), np.int64)
    requests = pd.DataFrame({
        "worker": w, "uid": np.arange(len(w), dtype=np.int64), "prompt_id": s,
        "sample_idx": zeros, "start_s": 0.0, "end_s": end[w, s],
        "prompt_tokens": lay.prompt[w, s], "response_tokens": lay.response[w, s],
        "finish": "eos", "verify_steps": zeros, "drafted": zeros, "accepted": zeros,
        "emitted": lay.response[w, s], "reward": np.nan})
    return Timeline(steps, requests, lay.workers, "sim")


def plain_makespan(lay: Layout, cost: StepCost, spread: float = 0.0, seed: int = 0) -> float:
    """The makespan of ``simulate_rollout(lay, cost, spread=spread, seed=seed)`` (plain
    decoding) without building its Timeline: what many draws of the workers' speeds need."""
    cost.seconds("plain", [1])
    speed = worker_speeds(lay.workers, check_non_negative("spread", spread), seed)
    seg, _ = _segments(lay, cost, _threshold_plan(cost, 0, None), speed)
    return float(seg["end_s"].max()) if len(seg["end_s"]) else 0.0


@dataclass
class Prediction:
    """One synchronous RL step predicted three ways: ``plain`` (every decode step plain, no
    drafter), ``tlt`` (the threshold rule's speculative steps, the drafter trained in the
    idle windows) and ``bandit`` (each step the cheapest arm per token: the adaptive engine's
    limit), each followed by the policy update of ``update_s`` on every worker."""

    plain: Timeline
    tlt: Timeline
    update_s: float
    drafter_step_s: float | None
    bandit: Timeline | None = None

    @property
    def drafter_steps(self) -> int:
        """Drafter training steps the TLT rollout's idle windows hold (all-idle rule: every
        finished worker trains until the last one ends; each window holds floor(window /
        drafter step time) steps). 0 without a drafter step time."""
        if self.drafter_step_s is None:
            return 0
        return int(sum(np.floor(w.seconds / self.drafter_step_s + _EPS)
                       for w in self.tlt.idle_windows()))

    def gpu_hours(self, timeline: Timeline) -> float:
        """GPU-hours of one RL step: N workers held for the rollout's makespan and the update."""
        return timeline.num_workers * (timeline.makespan_s + self.update_s) / 3600.0

    def summary(self) -> dict[str, float]:
        """The step's predicted scalars (the Timeline measures of every rollout); the bandit's
        are there when it was simulated. ``e2e_speedup``: the plain step's time (rollout and
        update) over TLT's."""
        plain, tlt = self.plain, self.tlt
        out = {
            "workers": plain.num_workers, "requests": int(len(plain.requests)),
            "makespan_plain_s": plain.makespan_s, "makespan_tlt_s": tlt.makespan_s,
            "idle_fraction_plain": plain.idle_fraction(), "idle_fraction_tlt": tlt.idle_fraction(),
            "tail_share_plain": plain.tail_share(), "tail_share_tlt": tlt.tail_share(),
            "sd_speedup": _ratio(plain.makespan_s, tlt.makespan_s),
            "update_s": self.update_s,
            "step_s_plain": plain.makespan_s + self.update_s,
            "step_s_tlt": tlt.makespan_s + self.update_s,
            "e2e_speedup": _ratio(plain.makespan_s + self.update_s, tlt.makespan_s + self.update_s),
            "drafter_steps": self.drafter_steps,
            "gpu_hours_plain": self.gpu_hours(plain), "gpu_hours_tlt": self.gpu_hours(tlt)}
        if self.bandit is not None:
            out.update(makespan_bandit_s=self.bandit.makespan_s,
                       idle_fraction_bandit=self.bandit.idle_fraction(),
                       sd_speedup_bandit=_ratio(plain.makespan_s, self.bandit.makespan_s),
                       gpu_hours_bandit=self.gpu_hours(self.bandit))
        return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0


def simulate(trace: Trace | Layout, cost: StepCost, workers: int | None = None,
             per_worker: int | None = None, threshold: int = 0, strategy: str | None = None,
             update_s: float | UpdateCost = 0.0, drafter_step_s: float | None = None,
             seed: int = 0, bandit: bool = False, spread: float = 0.0) -> Prediction:
    """Predict one RL step: the trace's requests laid out (``layout``; a Layout passes
    through) on ``workers`` x ``per_worker``, rolled out plain and under the threshold rule
    (speculative ``strategy`` below batch ``threshold``), and with ``bandit`` under the
    bandit's limit too, then the policy update: ``update_s`` seconds, or an ``UpdateCost``
    at this N. ``spread``: stragglers (``simulate_rollout``), the same workers slow in every
    rollout. Deterministic under ``seed`` (it draws the layout and the workers' speeds)."""
    if not isinstance(update_s, UpdateCost):
        update_s = check_non_negative("update_s (seconds or an UpdateCost)", update_s)
    drafter_step_s = check_positive("drafter_step_s", drafter_step_s, optional="no drafter")
    lay = trace if isinstance(trace, Layout) else layout(trace, workers, per_worker, seed)
    update = (update_s.seconds(lay.workers) if isinstance(update_s, UpdateCost)
              else update_s)
    run = lambda **kw: simulate_rollout(lay, cost, spread=spread, seed=seed, **kw)
    return Prediction(run(), run(threshold=threshold, strategy=strategy), update, drafter_step_s,
                      run(rule="bandit") if bandit else None)
