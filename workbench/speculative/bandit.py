"""BEG-MAB: TLT's bucketed epsilon-greedy bandit, and the adaptive schedule built on it.

Where speculative decoding pays depends on the machine: the same drafter at the same batch
size can double decoding on one CPU and barely gain on another of the same kind (RESULTS.md:
``sd_eagle_batch``, ``sd_threshold``, ``tlt_hostile``), because cheap batched arithmetic leaves
less per-call overhead for SD to save. So the adaptive engine assumes nothing and learns, per
batch-size bucket, on the worker's own clock, which of its arms emits the most tokens per
second. **Plain decoding is one of the arms**, in every bucket: where no SD strategy pays, the
engine stops speculating there by itself (the learned threshold); where one does, it picks the
best draft depth or tree for that batch size and for how well the drafter currently matches a
policy that changes every RL step.

Glossary:

arm         plain decoding (``"plain"``) or an SD strategy, the :class:`StepPlan` a step runs.
bucket      a range of live batch sizes with its own bandit (lower edges; the default
            ``(1, 2, 4, ..., 128)`` gives ``1``, ``2-3``, ``4-7``, ..., ``128+``).
reward      tokens the step committed over the step's seconds (draft + verify + bookkeeping),
            on the worker's clock: TLT's (mean accepted + 1) x batch / elapsed.
value       median reward of an arm over its sliding window of latest rewards in a bucket (the
            median shrugs off a step slowed by something else; the window forgets a drafter
            that has since improved or degraded); a settling pull's reward stays out of it.
best        the arm of highest value in the bucket; in a bucket where nothing is measured
            yet, the best arm of the nearest bucket that has measurements (neighbouring batch
            sizes behave alike), else ``plain`` (the arm that needs nothing to work).
exploring   pulling an arm other than the best, among the other arms the budget affords: an
            untried one (the first in arm order), or with probability epsilon divided by the
            pulls of a run that teach the *stalest* (the one pulled longest ago), so that
            estimates that went stale are refreshed in turn and about epsilon of the pulls
            teach something of another arm, as when each exploring step did. An arm the
            budget cannot afford blocks only itself. Each exploring pull starts a run.
run         ``explore_run`` consecutive pulls of the explored arm in its bucket, whichever
            worker pulls (a process backend's copies keep their own runs), all charged to the
            worker that started it (so that a worker whose budget is spent cannot cut the
            runs the others start before they teach); other buckets go on as usual. A step
            right after an arm switch runs slower (``speculative/explore_runs.py``), so an arm
            explored one step at a time would be under-valued. A run ends early when the
            budget no longer affords its next pull (checked before each) or the arm became
            the best. ``explore_run=1, settle=0`` explores one step at a time.
settling    the first ``settle`` pulls of a run count as pulls and are charged, but teach
            nothing (their rewards move neither the arm's value nor the best), unless the
            budget would not afford another pull at what this one cost (where an arm costs too
            much to run, a reading slowed by the switch beats none). The best arm's first
            pulls after a run do not settle: its window of rewards absorbs them.
cost        what an exploring pull (settling or not) lost against the best arm: its seconds
            minus the best arm's for the same tokens (0 when it did better).
budget      an exploring pull (each pull of a run) is made only if the worker's exploring cost
            so far, with what this pull is expected to cost, stays at most ``explore_budget`` of
            the worker's seconds observed. The expected cost is the arm's latest cost in this
            bucket, else in any; an arm never explored is expected to cost what the costliest
            explored arm did, so only the very first exploration's cost is unknown. Exploring an
            arm that does as well as the best is free, so a machine where SD pays learns it
            fast; an arm much slower than the best costs each worker about that share of its
            rollout time. The two sums, and each recorded cost, fade by ``LEDGER_DECAY`` per
            observation (``speculative/explore_budget.py``): credit left unspent for long cannot
            be spent in one burst, and one outlier pull (a first call's compile, a pause) cannot
            price an arm, or every untried arm, out for good, since only pulling the arm again
            would correct its estimate. The price of that forgetting: an arm one of whose pulls
            loses more than the worker's whole budget holds (more than some twenty of the best
            arm's steps, at the default budget) is re-tried once the ledger has forgotten its
            last pull, so it may cost a few times the share.

Arms are named by strategy strings (``speculative/strategies.py``: ``"plain"``, ``"chain:k=K"``,
``"tree:k=K,b=B[,n=N]"``, ``"sibling:k=K"``, or a plugin's, ``speculative.arms.ARMS``) in the
bandit's state, its tables, the steps table's ``arm`` column and a pickled schedule (a
checkpoint; an older version's resumes: ``speculative/bandit_resume.py``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from ..checks import check_fraction, check_int
from ..rollout.schedule import PLAIN, Decision, Schedule, StepPlan, StepReport
from .arms import arm_forms
from .bandit_resume import resumed_state
from .explore_budget import ExploreBudget
from .explore_runs import ExploreRuns
from .sliding_median import SlidingMedian
from .strategies import PLAIN_ARM, parse_strategy, strategy_name

__all__ = ["BucketedBandit", "AdaptiveSchedule", "parse_strategy", "strategy_name"]

DEFAULT_BUCKET_EDGES = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_ARMS = ("chain:k=2", "chain:k=4", "chain:k=6", "tree:k=4,b=3,n=16")


def _bucket_labels(edges: tuple[int, ...]) -> list[str]:
    """``["1", "2-3", ..., "128+"]`` for lower edges ``(1, 2, ..., 128)``."""
    labels = [str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])]
    return labels + [f"{edges[-1]}+"]


@dataclass(frozen=True)
class Choice:
    """One pull: the bucket whose bandit chose, the arm, whether it explored (pulled an arm
    other than the bucket's best), the worker whose budget it was charged to (a run's pulls:
    the run's first puller's), and whether it settles (its reward teaches nothing: module
    docstring, "settling")."""

    bucket: str
    arm: str
    explored: bool
    worker: int = 0
    settling: bool = False


class BucketedBandit:
    """One epsilon-greedy bandit per batch-size bucket over the same named arms, exploring
    within a budget on what exploring loses (module docstring, "cost" and "budget").

    Args:
        arms: arm names; the first is the best of a bucket where nothing is measured yet, and
            untried arms are explored in this order.
        edges: lower edges of the buckets, strictly increasing from 1 (module docstring).
        epsilon: about the share of pulls that explore the stalest affordable other arm and
            teach (when no untried arm is affordable, a run starts with probability epsilon /
            (explore_run - settle)).
        window: observations per arm and bucket whose median is the arm's value.
        explore_budget: the largest share of a worker's observed seconds that exploring may
            lose against the best arms.
        seed: of the bandit's own ``random.Random`` (never the global generator), so that a
            seeded run repeats its choices.
        explore_run: consecutive pulls of an explored arm in its bucket (module docstring,
            "run"), at least 1.
        settle: the first pulls of a run that teach nothing, in ``[0, explore_run)``.
    """

    def __init__(self, arms: Sequence[str], edges: Sequence[int] = DEFAULT_BUCKET_EDGES,
                 epsilon: float = 0.1, window: int = 300, explore_budget: float = 0.02,
                 seed: int = 0, explore_run: int = 6, settle: int = 3):
        self.arms = list(arms)
        if not self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms must be a non-empty list of distinct names, got {arms!r}")
        self.edges = tuple(check_int(f"each bucket edge (of {edges!r})", e, 1) for e in edges)
        if (not self.edges or self.edges[0] != 1
                or any(b <= a for a, b in zip(self.edges, self.edges[1:]))):
            raise ValueError(f"bucket edges must be strictly increasing integers starting at 1 "
                             f"(lower edges, e.g. {DEFAULT_BUCKET_EDGES}), got {edges!r}")
        self.epsilon = check_fraction("epsilon", epsilon)
        self.budget = ExploreBudget(explore_budget)
        self.runs = ExploreRuns(explore_run, settle)
        self.window = check_int("window", window, 1)
        self.labels = _bucket_labels(self.edges)
        self.rng = random.Random(check_int("seed", seed, 0))
        self.rewards = {(b, a): SlidingMedian(window) for b in self.labels for a in self.arms}
        self.pulls = {key: 0 for key in self.rewards}
        self.last_pull = {key: -1 for key in self.rewards}  # pull counter at the latest pull
        self.total_pulls = 0
        self.best_of: dict[str, str] = {}  # bucket with a reward -> its best arm (kept on update)
        self._bucket_of: dict[int, str] = {}
        # each bucket's buckets nearest first (itself, then neighbours, the smaller on ties)
        self.nearest = {b: [self.labels[j] for j in sorted(range(len(self.labels)),
                                                           key=lambda j: (abs(j - i), j))]
                        for i, b in enumerate(self.labels)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(resumed_state(state))  # an older checkpoint's bandit too

    def bucket(self, batch_size: int) -> str:
        """The label of the bucket ``batch_size`` falls in."""
        label = self._bucket_of.get(batch_size) if type(batch_size) is int else None
        if label is None:  # once per batch size: this runs before every decode step
            check_int("batch_size", batch_size, 1)
            label = self._bucket_of[batch_size] = \
                self.labels[sum(e <= batch_size for e in self.edges) - 1]
        return label

    def best(self, bucket: str) -> str:
        """The arm of highest value in ``bucket`` (the first of equals); in a bucket with no
        reward yet, the best of the nearest bucket that has one (the smaller on ties), else
        the first arm."""
        for near in self.nearest[bucket]:
            best = self.best_of.get(near)
            if best is not None:
                return best
        return self.arms[0]

    def expected_cost(self, bucket: str, arm: str) -> float:
        """What an exploring pull of ``arm`` in ``bucket`` is expected to cost
        (:meth:`ExploreBudget.expected_cost`: its latest cost, faded)."""
        return self.budget.expected_cost(bucket, arm)

    def may_explore(self, worker: int = 0, cost: float = 0.0) -> bool:
        """Whether ``worker`` exploring at ``cost`` more seconds stays within the budget
        (:meth:`ExploreBudget.may_explore`)."""
        return self.budget.may_explore(worker, cost)

    def choose(self, batch_size: int, worker: int = 0) -> Choice:
        """Pull an arm in ``batch_size``'s bucket: the next of the bucket's exploring run, else
        the best (in a new bucket, measured first), unless the budget allows exploring
        (module docstring, "exploring" and "run")."""
        bucket = self.bucket(batch_size)
        best = self.best(bucket)
        arm = self._running(bucket, best)
        payer = worker if arm is None else self.runs.payer(bucket)
        if arm is None and len(self.arms) > 1 and self.pulls[bucket, best] \
                and self.may_explore(worker):
            arm = self._explored(bucket, best, worker)
        settling = self.runs.pull(bucket, arm, payer) if arm is not None else False
        choice = Choice(bucket, arm or best, arm is not None, payer, settling)
        self.count_pull(choice)
        return choice

    def _running(self, bucket: str, best: str) -> str | None:
        """The arm of ``bucket``'s open run if its payer's budget affords the next pull; else
        the run ends (that, or its arm became the best)."""
        arm = self.runs.arm(bucket)
        if arm is not None and (arm == best or not self.may_explore(
                self.runs.payer(bucket), self.expected_cost(bucket, arm))):
            self.runs.stop(bucket)
            return None
        return arm

    def _explored(self, bucket: str, best: str, worker: int) -> str | None:
        """The arm ``worker`` explores in ``bucket`` now, if any: among the other arms the
        budget affords, the first untried, else with probability epsilon over the pulls of a
        run that teach the stalest."""
        affordable = [a for a in self.arms if a != best
                      and self.may_explore(worker, self.expected_cost(bucket, a))]
        untried = [a for a in affordable if self.pulls[bucket, a] == 0]
        if untried:
            return untried[0]
        if affordable and self.rng.random() < self.epsilon / self.runs.teaching:
            return min(affordable, key=lambda a: self.last_pull[bucket, a])
        return None

    def count_pull(self, choice: Choice) -> None:
        """Count ``choice`` as pulled now (``choose`` does; a replay of pulls made elsewhere,
        ``AdaptiveSchedule.absorb``, too)."""
        self.pulls[choice.bucket, choice.arm] += 1
        self.last_pull[choice.bucket, choice.arm] = self.total_pulls
        self.total_pulls += 1

    def value(self, bucket: str, arm: str) -> float:
        """Median reward of ``arm`` over its window in ``bucket`` (-inf before any reward)."""
        return self.rewards[bucket, arm].median

    def update(self, choice: Choice, reward: float, seconds: float = 0.0) -> None:
        """Record the ``seconds`` a pull took, charge an exploring pull's cost to its worker's
        ledger, and record its reward (tokens per second) unless it settles and the budget
        affords another pull at its cost (module docstring, "settling")."""
        cost, explored = 0.0, None
        if choice.explored:
            best_rate = self.value(choice.bucket, self.best(choice.bucket))
            lost = seconds - reward * seconds / best_rate if best_rate > 0 else seconds
            cost, explored = max(0.0, lost), (choice.bucket, choice.arm)
        self.budget.observe(choice.worker, seconds, explored, cost)
        if not choice.settling or not self.may_explore(choice.worker, cost):
            self.rewards[choice.bucket, choice.arm].append(float(reward))
            self.best_of[choice.bucket] = max(
                self.arms, key=lambda a: self.rewards[choice.bucket, a].median)

    def table(self) -> pd.DataFrame:
        """The bandit's state: one row per (bucket, arm) pulled at least once, with
        ``pulls``, ``median_reward`` (over the window), ``observed`` (rewards in it) and
        ``best`` (whether it is the bucket's best arm now)."""
        rows = [{"bucket": b, "arm": a, "pulls": self.pulls[b, a],
                 "median_reward": self.value(b, a), "observed": len(self.rewards[b, a]),
                 "best": a == self.best(b)}
                for b in self.labels for a in self.arms if self.pulls[b, a]]
        return pd.DataFrame(rows, columns=["bucket", "arm", "pulls", "median_reward",
                                           "observed", "best"])


class AdaptiveSchedule(Schedule):
    """TLT's adaptive engine as a step schedule: in each batch-size bucket the bucket's bandit
    picks plain decoding or an SD strategy, and the step's tokens per second are its reward.

    Args:
        arms: the SD strategies (strings naming registered decoding arms, arms, or
            speculative StepPlans); ``"plain"`` is always an arm besides them (first: a
            bucket with nothing measured decodes plain). Arms that name a drafter
            (``"sibling:k=4"``) need a rollout drafter that has it (``speculative.DrafterSet``).
        threshold: ``None`` (the default): every bucket learns whether to speculate. An
            integer: the largest live batch that may speculate (TLT's fixed rule, for studies).
        epsilon, window, explore_budget, buckets, seed, explore_run, settle: of the
            :class:`BucketedBandit` (``buckets`` = lower edges).
    """

    needs_drafter = True

    def __init__(self, arms: Sequence = DEFAULT_ARMS, threshold: int | None = None,
                 epsilon: float = 0.1, window: int = 300, explore_budget: float = 0.02,
                 buckets: Sequence[int] = DEFAULT_BUCKET_EDGES, seed: int = 0,
                 explore_run: int = 6, settle: int = 3):
        threshold = check_int("threshold", threshold, 1, optional="learned per bucket")
        if isinstance(arms, str) or not list(arms):
            raise ValueError(f"arms must be a non-empty list of strategies ({arm_forms()}), "
                             f"got {arms!r}")
        plans = [parse_strategy(a) for a in arms]
        named = [strategy_name(p) for p in plans]
        if len(set(named)) != len(named):
            raise ValueError(f"arms name the same strategy twice: {list(arms)!r}")
        self.plans = {PLAIN_ARM: PLAIN, **{n: p for n, p in zip(named, plans)}}
        self.threshold = threshold
        self.bandit = BucketedBandit(list(self.plans), buckets, epsilon, window, explore_budget,
                                     seed, explore_run, settle)

    @property
    def needs_trees(self) -> bool:
        """Whether an arm drafts a tree: the worker then refuses a chain-only drafter before
        the rollout's first forward, not when the bandit first pulls that arm."""
        return any(plan.tree for plan in self.plans.values())

    @property
    def drafter_names(self) -> frozenset:
        """The drafters the arms name (``"sibling"``): the worker refuses a rollout's drafter
        without them before the first forward."""
        return frozenset(p.drafter for p in self.plans.values() if p.drafter is not None)

    def plan(self, batch_size: int, worker: int) -> StepPlan:
        return self.decide(batch_size, worker).plan

    def decide(self, batch_size: int, worker: int) -> Decision:
        """The bucket's bandit's choice for ``worker``'s next step, with why: its bucket, arm,
        whether it explored, whether it settles and the worker whose budget it is charged to
        (a plain step above a fixed threshold: arm ``"plain"``, no bucket, nothing to learn or
        charge). The steps table keeps the reasons as decision columns (read back by
        ``speculative.decisions``, replayed by :meth:`absorb`); the choice comes back on the
        step's report to :meth:`observe`."""
        if self.threshold is not None and batch_size > self.threshold:
            return Decision(PLAIN, {"bucket": None, "arm": PLAIN_ARM, "explored": False,
                                    "settling": False, "charged_to": None})
        choice = self.bandit.choose(batch_size, worker)
        reasons = {"bucket": choice.bucket, "arm": choice.arm, "explored": choice.explored,
                   "settling": choice.settling, "charged_to": choice.worker}
        return Decision(self.plans[choice.arm], reasons, choice)

    def observe(self, report: StepReport) -> None:
        """Feed the step's tokens per second to the bandit that chose it (steps above a fixed
        threshold and steps with no measurable time teach nothing)."""
        choice = report.decision.choice if report.decision is not None else None
        if choice is not None:
            self._learn(choice, report.tokens, report.elapsed_s)

    def _learn(self, choice: Choice, tokens: int, elapsed_s: float) -> None:
        """The one reward, here and in :meth:`absorb`: the step's tokens per second on the
        worker's clock; a step with no measurable time teaches nothing."""
        if elapsed_s > 0:
            self.bandit.update(choice, tokens / elapsed_s, elapsed_s)

    def table(self) -> pd.DataFrame:
        """The bandit's state per bucket and arm (:meth:`BucketedBandit.table`)."""
        return self.bandit.table()

    def absorb(self, steps: pd.DataFrame) -> None:
        """Learn what copies of this schedule learned where they ran: a backend of processes
        (``Backend.runs_copies``) plans each worker's decode steps with a copy, whose learning
        stays behind. The steps table brings back every decision (its ``decision``, ``bucket``,
        ``arm``, ``explored``, ``settling`` and ``charged_to`` columns; a table without them
        settled nothing and charged each step's own worker) with its rows' tokens and seconds,
        so each is replayed here as the pull and the reward ``observe`` would have fed: worker
        by worker, decision by decision (the order the local backend learns in, so a replay of
        a local rollout's table gives its bandit state). Steps above a fixed threshold (no
        bucket) teach nothing, as in ``observe``. Runs still open in a copy end with it: the
        replay opens none."""
        if "bucket" not in steps.columns:
            return
        decided = steps[steps["decision"].notna() & steps["bucket"].notna()]
        for (worker, _), rows in decided.groupby(["worker", "decision"], sort=True):
            first = rows.iloc[0]
            choice = Choice(first["bucket"], first["arm"], bool(first["explored"]),
                            int(first.get("charged_to", worker)),
                            bool(first.get("settling", False)))
            self.bandit.count_pull(choice)
            self._learn(choice, int(rows["tokens"].sum()),
                        float(rows["end_s"].max() - rows["start_s"].min()))

    def learned(self) -> pd.DataFrame:
        """What the engine has learned of this machine, one row per bucket it decoded in:
        ``plain_tokens_per_s`` (plain's value), ``best_sd`` and ``sd_tokens_per_s`` (the SD arm
        of highest value), ``sd_speedup`` (their ratio), ``choice`` (the bucket's best arm now)
        and ``speculates`` (whether that is an SD arm). The largest bucket that speculates is
        the threshold the engine learned."""
        b, rows = self.bandit, []
        for bucket in b.labels:
            if not any(b.pulls[bucket, a] for a in b.arms):
                continue
            sd = [a for a in b.arms if a != PLAIN_ARM]
            best_sd = max(sd, key=lambda a: b.value(bucket, a)) if sd else None
            plain = b.value(bucket, PLAIN_ARM)
            sd_rate = b.value(bucket, best_sd) if best_sd else float("-inf")
            known = plain > float("-inf") and sd_rate > float("-inf")
            choice = b.best(bucket)
            rows.append({"bucket": bucket, "plain_tokens_per_s": _finite(plain),
                         "best_sd": best_sd if sd_rate > float("-inf") else None,
                         "sd_tokens_per_s": _finite(sd_rate),
                         "sd_speedup": sd_rate / plain if known and plain > 0 else float("nan"),
                         "choice": choice, "speculates": choice != PLAIN_ARM})
        return pd.DataFrame(rows, columns=["bucket", "plain_tokens_per_s", "best_sd",
                                           "sd_tokens_per_s", "sd_speedup", "choice",
                                           "speculates"])


def _finite(x: float) -> float:
    return x if x > float("-inf") else float("nan")
