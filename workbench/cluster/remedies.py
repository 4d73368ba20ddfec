"""The long-tail remedies on the cluster simulator: over-provisioning, APRIL, partial rollouts
and tail batching replayed over a run's steps from the per-request lengths a plain run logged.

Why a model of its own: these remedies change *which* requests a step runs and when its
rollout ends, and they carry state from one step to the next (carried groups, the tail
queue), so a step is no longer one layout simulated on its own. Each step here follows
``rl.remedies.Sampler.sample`` (the harness notebook 11 runs) line by line:

1. **groups**: the groups carried from the last step (oldest first), topped up with fresh
   groups from the run's stream to ``P + extra_groups`` slots. With partial rollouts a
   carried group still growing waits beside the slots (only a carried group that finished
   holds one). Tail batching: once ``P`` deferred prompts wait, the step is a *long round*
   of those alone, sampled afresh, run to their end (no over-provisioning, no cut).
2. **requests**: one per live response, its remaining tokens capped at the rest of its
   budget and at ``segment_tokens`` with partial rollouts; dealt round-robin over the
   workers in group order (request ``i`` to worker ``i mod N``).
3. **the end of the rollout**: with over-provisioning, the time the ``P``-th group finished
   (all ``G`` responses done); the tokens after it are never decoded. Else the last
   request's end.
4. **growth**: each response takes the tokens it had at the end (a request ends at a
   worker's step end; a step running at the cut emits nothing, ``rl.remedies.cut``).
5. **split**: at most ``P`` finished groups are trained (with over-provisioning the first
   to finish, else the first drawn); the rest are carried (``carry``), dropped (``abort``)
   or dropped with their unfinished prompts deferred to the tail queue (``defer``).

The rollout of one step: each worker decodes its requests plainly, at most ``max_batch``
rows at once (None: all at once, ``simulate.simulate_rollout``'s assumption, which this
loop reproduces exactly); a finished row's slot is refilled at once with the next waiting
request, its prefill one step of the admitted rows (the engine's continuous batching with
``refill_slots`` 1). A step costs ``StepCost.seconds`` at its live batch.

What the lengths are: a fresh group's responses have the lengths the plain run logged for
that prompt, drawn in the stream's order (group ``d`` is the ``d``-th logged group, the
stream wrapping around at its end), and a deferred prompt resampled in a long round has the
lengths it had (the same prompt: that is why it ran long). The lengths a changed policy
would give (APRIL's and partial rollouts' stale tokens, async's older policy) are not
modelled: these remedies change which policy produced the tokens a step trains on
(``offpolicy_token_share``, counted here), which is a trade in learning, not in time.

Glossary: ``P`` the groups a step trains on, ``G`` the responses of a group, ``E``
(``extra_groups``) the groups sampled beyond ``P``. The remedies by name are notebook 11's
variants (``rl.variants``): ``overprovision`` (E = max(1, P // 2), abort), ``april`` (E,
carry), ``partial`` (segment max_new_tokens // 4, carry) and ``tail_batching`` (E, defer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..checks import check_choice, check_int
from .cost import StepCost

__all__ = ["RemedyModel", "REMEDY_MODELS", "remedy_model", "RolloutRun", "run_rollout",
           "simulate_remedy", "remedy_steps", "remedy_speedups", "groups_of_timeline",
           "inferred_max_batch", "trace_steps", "remedy_whatif", "padded_work", "update_fit"]

LEFTOVERS = ("abort", "carry", "defer")
REMEDY_MODELS = ("overprovision", "april", "partial", "tail_batching")
"""The remedies this module models, by notebook 11's variant names (``rl.variants``)."""
_EPS = 1e-9


@dataclass(frozen=True)
class RemedyModel:
    """One remedy's switches, as ``rl.remedies.RemedyConfig``'s: ``extra_groups`` (E),
    ``leftover`` (``abort``, ``carry`` or ``defer``), ``segment_tokens`` (None: off)."""

    name: str
    extra_groups: int = 0
    leftover: str = "abort"
    segment_tokens: int | None = None

    def __post_init__(self):
        check_int("RemedyModel.extra_groups", self.extra_groups, 0)
        check_choice("RemedyModel.leftover", self.leftover, LEFTOVERS)
        check_int("RemedyModel.segment_tokens", self.segment_tokens, 1, optional=True)


def remedy_model(name: str, prompts_per_step: int, max_new_tokens: int) -> RemedyModel:
    """Notebook 11's variant ``name`` (``REMEDY_MODELS``) at ``P`` and the length cap, with
    ``rl.variants``' settings: E = max(1, P // 2); partial's segment max_new_tokens // 4."""
    name = check_choice("remedy", name, REMEDY_MODELS)
    extra = max(1, check_int("prompts_per_step", prompts_per_step, 1) // 2)
    if name == "partial":
        return RemedyModel(name, 0, "carry", max(1, check_int("max_new_tokens", max_new_tokens, 1) // 4))
    return RemedyModel(name, extra, {"overprovision": "abort", "april": "carry",
                                     "tail_batching": "defer"}[name])


# ---- one rollout: plain decoding, continuous batching up to max_batch ---------------------------
@dataclass
class RolloutRun:
    """One simulated rollout of requests (``tokens`` each, dealt ``worker``): each request's
    ``end`` (seconds), and what ``tokens_at`` needs (each worker's decode segments, each
    request's join time and the decode steps its worker had done when it joined)."""

    tokens: np.ndarray
    worker: np.ndarray
    end: np.ndarray
    join: np.ndarray
    steps_before: np.ndarray
    first: np.ndarray  # tokens a request's prefill emitted (1 with a prefill cost, else 0)
    segments: list  # per worker: arrays (start, seconds per step, steps)

    @property
    def makespan(self) -> float:
        return float(self.end.max()) if len(self.end) else 0.0

    def _done_steps(self, w: int, t: float) -> float:
        start, sec, n = self.segments[w]
        if not len(start):
            return 0.0
        return float(np.clip(np.floor((t - start) / sec + _EPS), 0, n).sum())

    def tokens_at(self, t: float) -> np.ndarray:
        """Tokens each request had emitted by ``t``: none before its prefill ended, then one
        per decode step of its worker that ended by ``t`` (a step running at ``t`` emits
        nothing), at most its own."""
        out = np.zeros(len(self.tokens), np.int64)
        for i in range(len(self.tokens)):
            if self.end[i] <= t + _EPS:
                out[i] = self.tokens[i]
            elif self.join[i] <= t + _EPS:
                done = self._done_steps(int(self.worker[i]), t) - self.steps_before[i]
                out[i] = min(self.tokens[i], int(self.first[i] + done))
        return out


def run_rollout(tokens, workers: int, cost: StepCost, max_batch: int | None = None) -> RolloutRun:
    """Requests of ``tokens`` response tokens each, in order, dealt round-robin over
    ``workers`` (request ``i`` to worker ``i mod N``), each worker decoding plainly at most
    ``max_batch`` rows at once (module docstring)."""
    tokens = np.asarray(tokens, np.int64)
    n = check_int("workers", workers, 1)
    cap = check_int("max_batch", max_batch, 1, optional="no cap")
    prefill = cost.has("prefill")
    worker = np.arange(len(tokens)) % n
    end, join = np.zeros(len(tokens)), np.zeros(len(tokens))
    before = np.zeros(len(tokens))
    segments = []
    for w in range(n):
        queue = list(np.flatnonzero(worker == w))
        live: dict[int, int] = {}
        t, done_steps = 0.0, 0
        starts, secs, counts = [], [], []
        while queue or live:
            if queue and (cap is None or len(live) < cap):  # admit into the free slots
                k = len(queue) if cap is None else min(cap - len(live), len(queue))
                admitted, queue = queue[:k], queue[k:]
                if prefill:
                    t += float(cost.seconds("prefill", [k])[0])
                for i in admitted:
                    join[i], before[i] = t, done_steps
                    left = int(tokens[i]) - (1 if prefill else 0)
                    if left <= 0:
                        end[i] = t
                    else:
                        live[i] = left
                if not live:
                    continue
            b = len(live)
            sec = float(cost.seconds("plain", [b])[0])
            steps = min(live.values())
            starts.append(t), secs.append(sec), counts.append(steps)
            t += steps * sec
            done_steps += steps
            for i in list(live):
                live[i] -= steps
                if live[i] <= 0:
                    end[i] = t
                    del live[i]
        segments.append((np.array(starts), np.array(secs), np.array(counts)))
    first = np.full(len(tokens), 1 if prefill else 0)
    return RolloutRun(tokens, worker, end, join, before, first, segments)


# ---- the steps of a run with a remedy ----------------------------------------------------------
@dataclass
class _Group:
    lengths: np.ndarray            # each response's full length (tokens)
    drawn: int
    got: np.ndarray = None         # tokens each response has
    done: np.ndarray = None        # whether each response finished
    versions: list = field(default_factory=list)  # per response: [(step, tokens), ...]

    def __post_init__(self):
        self.lengths = np.asarray(self.lengths, np.int64)
        self.got = np.zeros(len(self.lengths), np.int64)
        self.done = np.zeros(len(self.lengths), bool)
        self.versions = [[] for _ in self.lengths]

    @property
    def finished(self) -> bool:
        return bool(self.done.all())

    def fresh(self) -> "_Group":
        return _Group(self.lengths, self.drawn)


def simulate_remedy(stream: list, prompts_per_step: int, steps: int, remedy: RemedyModel | None,
                    workers: int, cost: StepCost, max_new_tokens: int,
                    max_batch: int | None = None) -> pd.DataFrame:
    """``steps`` RL steps with ``remedy`` (None: plain GRPO, each step the next ``P`` groups
    run to their end), fresh groups drawn from ``stream`` (a list of arrays, each group's
    response lengths, wrapping around). One row per step: ``rollout_s`` (its rollout's end),
    ``groups_trained``, ``carried_groups``, ``aborted_tokens``, ``long_round``,
    ``offpolicy_token_share`` (trained tokens sampled in an earlier step: by an older policy),
    ``trained_tokens``, ``trained_rows`` (responses trained) and ``trained_longest`` (the
    longest of them: with ``trained_rows``, the padded batch a trainer that pads pays for)."""
    P = check_int("prompts_per_step", prompts_per_step, 1)
    remedy = remedy or RemedyModel("plain")
    E, leftover, segment = remedy.extra_groups, remedy.leftover, remedy.segment_tokens
    pool, tail, drawn, rows = [], [], 0, []
    for step in range(check_int("steps", steps, 1)):
        long_round = len(tail) >= P                                         # 1) groups
        if long_round:
            groups, tail = tail[:P], tail[P:]
        else:
            groups = list(pool)
            held = sum(1 for g in groups if g.finished or segment is None)
            for _ in range(P + E - held):
                groups.append(_Group(stream[drawn % len(stream)], drawn))
                drawn += 1
        live = [(g, j) for g in groups for j in np.flatnonzero(~g.done)]    # 2) requests
        want = np.array([min(g.lengths[j] - g.got[j],
                             max_new_tokens - g.got[j] if segment is None
                             else min(max_new_tokens - g.got[j], segment))
                         for g, j in live], np.int64)
        run = run_rollout(want, workers, cost, max_batch)
        completes = np.array([g.got[j] + w >= g.lengths[j] for (g, j), w in zip(live, want)], bool)
        finish = {id(g): 0.0 for g in groups}                               # 3) the end
        for (g, _), e, c in zip(live, run.end, completes):
            finish[id(g)] = max(finish[id(g)], e if c else math.inf)
        done_at = sorted(t for t in finish.values() if t < math.inf)
        cut = E > 0 and not long_round and len(done_at) >= P
        end_s = done_at[P - 1] if cut else run.makespan
        got = run.tokens_at(end_s) if cut else want
        for (g, j), e, k, c in zip(live, run.end, got, completes):           # 4) growth
            if k:
                g.got[j] += k
                g.versions[j].append((step, int(k)))
            g.done[j] |= bool(c and e <= end_s + _EPS)
        ends = {id(g): 0.0 for g in groups}                                 # 5) split
        for (g, _), e in zip(live, run.end):
            ends[id(g)] = max(ends[id(g)], e)
        first = (lambda g: ends[id(g)]) if E else (lambda g: g.drawn)
        finished = sorted((g for g in groups if g.finished), key=first)
        trained, rest = finished[:P], finished[P:]
        rest += [g for g in groups if not g.finished]
        rest.sort(key=lambda g: g.drawn)
        pool = rest if leftover == "carry" else []
        dropped = [] if leftover == "carry" else rest
        if leftover == "defer":
            tail += [g.fresh() for g in dropped if not g.finished]
        rows.append(_step_row(step, end_s, long_round, trained, pool, dropped))  # 6) row
    return pd.DataFrame(rows)


def _step_row(step, end_s, long_round, trained, pool, dropped) -> dict:
    """A step's row of :func:`simulate_remedy`: what it trained (tokens sampled in an earlier
    step count as off-policy, an older policy's), carried to the next step and aborted."""
    tokens = [k for g in trained for v in g.versions for _, k in v]
    stale = [k for g in trained for v in g.versions for s, k in v if s < step]
    return {"step": step, "rollout_s": end_s, "groups_trained": len(trained),
            "carried_groups": len(pool), "aborted_tokens": int(sum(g.got.sum() for g in dropped)),
            "long_round": long_round, "trained_tokens": int(sum(tokens)),
            "trained_rows": int(sum(len(g.lengths) for g in trained)),
            "trained_longest": int(max((g.lengths.max() for g in trained), default=0)),
            "offpolicy_token_share": sum(stale) / sum(tokens) if sum(tokens) else 0.0}


def remedy_steps(step_groups: list, workers: int, cost: StepCost, max_new_tokens: int | None = None,
                 max_batch: int | None = None, remedies=REMEDY_MODELS) -> pd.DataFrame:
    """The logged steps (``step_groups``: per step, its groups' response lengths) replayed
    plain and with each of ``remedies``: one row per step and remedy, ``remedy`` (``plain``
    too), ``simulate_remedy``'s columns and ``ratio`` (the remedy's rollout time over the
    plain one of the same step). P: the median groups per logged step; the length cap: the
    longest logged response where ``max_new_tokens`` is not given."""
    if not step_groups or not all(len(s) for s in step_groups):
        raise ValueError("step_groups needs at least one step, each with at least one group "
                         "of response lengths")
    stream = [np.asarray(g, np.int64) for s in step_groups for g in s]
    P = int(np.median([len(s) for s in step_groups]))
    cap = max_new_tokens or int(max(g.max() for g in stream))
    plain = pd.DataFrame([{"step": k, "rollout_s": run_rollout(
        np.concatenate(s), workers, cost, max_batch).makespan, "groups_trained": len(s),
        "carried_groups": 0, "aborted_tokens": 0, "long_round": False,
        "trained_tokens": int(sum(np.sum(g) for g in s)), "offpolicy_token_share": 0.0,
        "trained_rows": int(sum(len(g) for g in s)),
        "trained_longest": int(max(np.max(g) for g in s))}
        for k, s in enumerate(step_groups)])
    out = [plain.assign(remedy="plain", ratio=1.0)]
    for name in remedies:
        r = simulate_remedy(stream, P, len(step_groups), remedy_model(name, P, cap), workers,
                            cost, cap, max_batch)
        out.append(r.assign(remedy=name, ratio=r["rollout_s"] / plain["rollout_s"]))
    return pd.concat(out, ignore_index=True)


def remedy_speedups(steps: pd.DataFrame, rest_s=None) -> pd.DataFrame:
    """Per remedy of ``remedy_steps``' table: ``rollout_speedup`` (summed plain rollouts over
    summed remedy ones), ``e2e_speedup`` (the same with ``rest_s``, each step's time outside
    the rollout, added to both; 0 when None), and the means of ``groups_trained``,
    ``offpolicy_token_share``, ``aborted_tokens`` and the share of long rounds."""
    plain = steps[steps["remedy"] == "plain"].set_index("step")["rollout_s"]
    rest = pd.Series(0.0 if rest_s is None else np.asarray(rest_s, float), index=plain.index)
    rows = []
    for name, r in steps[steps["remedy"] != "plain"].groupby("remedy", sort=False):
        r = r.set_index("step")
        rows.append({"remedy": name,
                     "rollout_speedup": float(plain.sum() / r["rollout_s"].sum()),
                     "e2e_speedup": float((plain + rest).sum() / (r["rollout_s"] + rest).sum()),
                     "groups_trained": float(r["groups_trained"].mean()),
                     "offpolicy_token_share": float(r["offpolicy_token_share"].mean()),
                     "aborted_tokens": float(r["aborted_tokens"].mean()),
                     "long_rounds": float(r["long_round"].mean())})
    return pd.DataFrame(rows)


# ---- the update a remedy's step trains -----------------------------------------------------------
def padded_work(steps: pd.DataFrame) -> np.ndarray:
    """Each step's padded batch (``simulate_remedy``'s rows): the responses trained x the
    longest of them, what a trainer that pads to the longest response pays for."""
    return (steps["trained_rows"] * steps["trained_longest"]).to_numpy(float)


def update_fit(work, seconds) -> tuple[float, float]:
    """``(intercept, slope)`` of ``seconds ~ intercept + slope x work`` over a run's steps
    (least squares), the slope at least 0 and the intercept at least 0 (then a fit through 0);
    ``(mean, 0)``, an update that does not move with the batch, where the work never varies."""
    w, y = np.asarray(work, float), np.asarray(seconds, float)
    ok = np.isfinite(w) & np.isfinite(y)
    w, y = w[ok], y[ok]
    if len(np.unique(w)) < 2:
        return (float(y.mean()) if len(y) else 0.0), 0.0
    slope, intercept = np.polyfit(w, y, 1)
    if slope <= 0:
        return float(y.mean()), 0.0
    if intercept < 0:
        return 0.0, float(w @ y / (w @ w))
    return float(intercept), float(slope)


# ---- what-ifs at cluster scale ----------------------------------------------------------------
def trace_steps(source, prompts_per_step: int, steps: int, samples_per_prompt: int = 8,
                seed: int = 0) -> list[list[np.ndarray]]:
    """``steps`` RL steps of ``prompts_per_step`` groups each, drawn with replacement
    (seeded): whole groups of a recorded ``Trace`` (its ``group`` column), or groups of
    ``samples_per_prompt`` independent draws of a fitted ``LengthModel`` (a group's shared
    difficulty then not modelled)."""
    from .fit import LengthModel
    P, K = check_int("prompts_per_step", prompts_per_step, 1), check_int("steps", steps, 1)
    rng = np.random.default_rng(seed)
    if isinstance(source, LengthModel):
        G = check_int("samples_per_prompt", samples_per_prompt, 1)
        return [[source.sample(G, rng).astype(np.int64) for _ in range(P)] for _ in range(K)]
    r = source.requests
    groups = [g["response_tokens"].to_numpy(np.int64) for _, g in r.groupby("group", sort=False)]
    return [[groups[i] for i in rng.integers(0, len(groups), P)] for _ in range(K)]


def remedy_whatif(source, cost: StepCost, workers, prompts_per_step: int, steps: int = 8,
                  samples_per_prompt: int = 8, max_new_tokens: int | None = None,
                  max_batch: int | None = None, update_s: float = 0.0, seed: int = 0,
                  remedies=REMEDY_MODELS) -> pd.DataFrame:
    """Each remedy at every N of ``workers``: ``remedy_speedups`` of ``steps`` steps of
    ``prompts_per_step`` groups (``trace_steps``, the same draws at every N) replayed on N
    workers, each step's time outside the rollout ``update_s``; one row per N and remedy,
    with ``workers``."""
    stream = trace_steps(source, prompts_per_step, steps, samples_per_prompt, seed)
    rows = []
    for n in workers:
        table = remedy_steps(stream, check_int("workers", n, 1), cost, max_new_tokens,
                             max_batch, remedies)
        rows.append(remedy_speedups(table, [update_s] * steps).assign(workers=n))
    return pd.concat(rows, ignore_index=True)


# ---- reading a workbench rollout ---------------------------------------------------------------
def groups_of_timeline(timeline) -> list[np.ndarray]:
    """A plain rollout's groups (``prompt_id``, in order), each its responses' lengths in
    ``sample_idx`` order."""
    r = timeline.requests.sort_values(["prompt_id", "sample_idx"], kind="stable")
    return [g["response_tokens"].to_numpy(np.int64) for _, g in r.groupby("prompt_id", sort=True)]


def inferred_max_batch(timeline) -> int | None:
    """The rows a worker decoded at once, where the rollout capped them: the largest live
    batch of its decode steps when some worker held more requests than that; None (no cap
    seen) otherwise."""
    s = timeline.steps[timeline.steps["kind"].isin(["decode", "verify"])]
    if not len(s):
        return None
    biggest = int(s["batch_size"].max())
    held = int(timeline.requests.groupby("worker").size().max())
    return biggest if held > biggest else None
