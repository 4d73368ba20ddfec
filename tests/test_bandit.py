"""BEG-MAB and the adaptive schedule: the bandit on synthetic rewards (plain is an arm,
exploring stays within its time budget), lossless float64 rollouts under any mix of plain and
speculative steps whose steps table logs every decision, and the input checks."""
import pickle
import random

import pandas as pd
import pytest

from workbench.rollout import RolloutConfig, RolloutEngine, StepPlan, StepReport, Timeline
from workbench.rollout.schedule import PLAIN, Decision, ThresholdSchedule
from workbench.speculative import EagleDrafter, EagleHead
from workbench.speculative.bandit import (AdaptiveSchedule, BucketedBandit, Choice, parse_strategy,
                                          strategy_name)
from workbench.speculative.decisions import (DECIDED_COLUMNS, bandit_choices, bandit_decisions,
                                             explore_cost, plain_share)
from workbench.speculative.explore_budget import LEDGER_DECAY

from .helpers.models import MANY, PROMPTS, tiny_model


def pull(bandit, batch_size, medians, rng, n, seconds=None):
    """``n`` pulls at ``batch_size``, rewards noisy around ``medians[arm]``, each pull taking
    ``seconds[arm]`` (1 s by default); the choices."""
    choices = []
    for _ in range(n):
        c = bandit.choose(batch_size)
        bandit.update(c, medians[c.arm] + rng.gauss(0, 0.5), (seconds or {}).get(c.arm, 1.0))
        choices.append(c)
    return choices


# ---- the bandit -------------------------------------------------------------------------
def test_the_bandit_settles_on_the_best_arm_of_each_bucket_independently():
    bandit = BucketedBandit(["a", "b", "c"], epsilon=0.1, window=100, explore_budget=1.0,
                            seed=1)
    rng = random.Random(0)
    small = pull(bandit, 1, {"a": 1.0, "b": 3.0, "c": 2.0}, rng, 600)
    large = pull(bandit, 20, {"a": 3.0, "b": 1.0, "c": 2.0}, rng, 600)
    for choices, best, bucket in ((small, "b", "1"), (large, "a", "16-31")):
        assert {c.bucket for c in choices} == {bucket}
        assert max(bandit.arms, key=lambda a: bandit.value(bucket, a)) == best
        assert sum(c.arm == best for c in choices) > 0.7 * len(choices)
        teaching = sum(c.explored and not c.settling for c in choices)
        assert 0.05 * len(choices) < teaching < 0.2 * len(choices)  # epsilon = 0.1
        assert sum(c.explored for c in choices) < 2.5 * teaching  # runs of 6, 3 settling
    table = bandit.table()
    assert table["pulls"].sum() == 1200 and set(table["bucket"]) == {"1", "16-31"}
    assert [bandit.bucket(n) for n in (1, 2, 3, 4, 7, 8, 127, 128, 5000)] == \
        ["1", "2-3", "2-3", "4-7", "4-7", "8-15", "64-127", "128+", "128+"]


def test_epsilon_zero_never_explores_after_each_arm_was_tried_and_seeds_repeat():
    def run(seed, epsilon):
        bandit = BucketedBandit(["a", "b", "c"], epsilon=epsilon, explore_budget=1.0, seed=seed)
        return pull(bandit, 4, {"a": 2.0, "b": 1.0, "c": 1.5}, random.Random(3), 200)

    greedy = run(0, 0.0)
    # nothing measured: the first arm is the best; then the untried ones are explored, each
    # in a run of six pulls (the default) unless the arm becomes the best after its three
    # settling pulls
    assert [(c.arm, c.explored) for c in greedy[:11]] == \
        [("a", False)] + [("b", True)] * 6 + [("c", True)] * 4
    assert not any(c.explored for c in greedy[13:])
    assert run(5, 0.3) == run(5, 0.3)
    state = random.getstate()
    run(7, 0.5)
    assert random.getstate() == state  # the bandit draws from its own generator


def test_an_arm_whose_reward_drops_is_abandoned_once_the_window_turns_over():
    bandit = BucketedBandit(["a", "b"], epsilon=0.0, window=20, explore_budget=1.0)
    rng = random.Random(1)
    assert pull(bandit, 2, {"a": 10.0, "b": 5.0}, rng, 50)[-1].arm == "a"
    after = pull(bandit, 2, {"a": 1.0, "b": 5.0}, rng, 40)
    assert sum(c.arm == "a" for c in after) <= 20 // 2 + 1  # a's median falls past the middle
    assert all(c.arm == "b" for c in after[20:])


# ---- the adaptive schedule --------------------------------------------------------------
def test_exploring_stays_within_its_time_budget_however_slow_the_other_arms():
    """A 20x slower arm is still tried (and re-tried when stale), but what exploring lost
    against the best arm passes the budget's share of all the seconds by the first pull at
    most."""
    bandit = BucketedBandit(["plain", "slow"], epsilon=0.5, explore_budget=0.03, seed=2)
    choices = pull(bandit, 3, {"plain": 100.0, "slow": 20.0}, random.Random(0), 6000,
                   seconds={"plain": 0.01, "slow": 0.2})
    slow = [i for i, c in enumerate(choices) if c.arm == "slow"]
    assert len(slow) >= 2 and all(choices[i].explored for i in slow)
    spent = {"plain": 0.01, "slow": 0.2}
    lost = 0.2 - 20.0 * 0.2 / 100.0  # a slow pull's seconds beyond plain's for its tokens
    cost = sum(lost for c in choices if c.explored)
    assert cost <= 0.03 * sum(spent[c.arm] for c in choices) + lost
    ledger = bandit.budget
    assert ledger.explore_cost_s[0] <= 0.03 * ledger.observed_s[0] + 1e-12  # faded ledger
    assert ledger.arm_costs["slow"][0] == pytest.approx(lost, abs=0.02)  # as recorded
    assert bandit.expected_cost("1", "slow") == ledger.arm_cost("slow")  # known elsewhere
    assert BucketedBandit(["a", "b"]).expected_cost("1", "b") == 0.0  # nothing known: free
    assert bandit.best("2-3") == "plain" and bandit.table()["best"].sum() == 1
    zero = BucketedBandit(["plain", "slow"], epsilon=1.0, explore_budget=0.0)
    assert all(c.arm == "plain" for c in pull(zero, 1, {"plain": 1, "slow": 9},
                                              random.Random(0), 50))


def report(plan, worker=0, tokens=10, elapsed=0.01, decision=None):
    return StepReport(worker, plan, 4, tokens, 0, 0, 0.0, 0.0, elapsed, decision=decision)


def test_plain_is_an_arm_of_every_bucket_and_buckets_where_it_wins_stop_speculating():
    schedule = AdaptiveSchedule(arms=["chain:k=2", "chain:k=4"], epsilon=0.0,
                                explore_budget=1.0)
    assert schedule.threshold is None and list(schedule.plans) == ["plain", "chain:k=2",
                                                                   "chain:k=4"]
    # tokens per 10 ms step: SD wins at batch 1, plain wins at batch 40
    speeds = {(1, "plain"): 5, (1, "chain:k=2"): 8, (1, "chain:k=4"): 12,
              (40, "plain"): 60, (40, "chain:k=2"): 30, (40, "chain:k=4"): 20}
    first = {1: "plain",        # nothing measured anywhere: plain
             40: "chain:k=4"}   # a new bucket starts from its nearest measured neighbour's best
    for batch in (1, 40):
        for i in range(12):
            decision = schedule.decide(batch, 0)
            plan, d = decision.plan, decision.reasons
            assert d["bucket"] == schedule.bandit.bucket(batch)
            if i == 0:  # measured first, not an exploration
                assert d == {**d, "arm": first[batch], "explored": False}
            schedule.observe(report(plan, tokens=speeds[batch, d["arm"]], decision=decision))
    assert schedule.plan(1, 0) == StepPlan("speculative", 4)
    above = schedule.decide(40, 0)
    assert above.plan == PLAIN and above.reasons["explored"] is False
    learned = schedule.learned().set_index("bucket")
    assert learned.loc["1", "speculates"] and not learned.loc["32-63", "speculates"]
    assert learned.loc["1", "best_sd"] == "chain:k=4"
    assert learned.loc["1", "sd_speedup"] == pytest.approx(12 / 5)
    assert learned.loc["32-63", "sd_speedup"] == pytest.approx(30 / 60)
    assert learned.loc["32-63", "choice"] == "plain"
    # a fixed threshold (TLT's rule, for studies) is still there: plain above it, unlearned
    capped = AdaptiveSchedule(arms=["chain:k=4"], threshold=8)
    assert capped.plan(9, 0) == PLAIN
    above = capped.decide(9, 0)
    assert above.reasons == {"bucket": None, "arm": "plain", "explored": False,
                             "settling": False, "charged_to": None}
    capped.observe(report(PLAIN, decision=above))
    assert capped.table().empty  # steps above the threshold teach nothing
    assert ThresholdSchedule(k=4, max_batch=8).plan(8, 0) == StepPlan("speculative", 4)


def test_strategies_parse_to_plans_and_back():
    assert parse_strategy("chain:k=4") == StepPlan("speculative", 4)
    assert parse_strategy("tree: k=4, b=3, n=16") == StepPlan("speculative", 4, 3, 16)
    assert parse_strategy("tree:k=2,b=2") == StepPlan("speculative", 2, 2)
    for text in ("chain:k=6", "tree:k=4,b=3,n=16", "tree:k=2,b=2"):
        assert strategy_name(parse_strategy(text)) == text
    plan = StepPlan("speculative", 3)
    assert parse_strategy(plan) is plan
    assert parse_strategy("plain") == PLAIN and strategy_name(PLAIN) == "plain"


class RandomArms(AdaptiveSchedule):
    """Any mix: each step pulls plain or an SD arm at random (seeded), whatever it measured."""

    def decide(self, batch_size, worker):
        arm = self.bandit.rng.choice(list(self.plans))
        choice = Choice(self.bandit.bucket(batch_size), arm, True)
        return Decision(self.plans[arm], {"bucket": choice.bucket, "arm": arm,
                                          "explored": True}, choice)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_any_mix_of_plain_and_speculative_steps_is_lossless(tokenizer, temperature):
    """Plain and every SD arm drawn at random inside each bucket, on a ragged batch of
    requests that join and finish at different steps; greedy and coupled, float64: the tokens
    are the plain rollout's. The adaptive schedule itself, exploring often, likewise."""
    model = tiny_model("llama", tokenizer, seed=4)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=40, temperature=temperature, seed=9, max_batch_size=6,
                        spec_mode="coupled")
    plain = engine.rollout(MANY, cfg, progress=False)
    arms = ["chain:k=1", "chain:k=3", "tree:k=2,b=2"]
    for schedule in (RandomArms(arms=arms, seed=3),
                     AdaptiveSchedule(arms=arms, epsilon=0.5, explore_budget=1.0, seed=3)):
        res = engine.rollout(MANY, cfg, drafter=EagleDrafter(EagleHead(model), model),
                             schedule=schedule, progress=False)
        assert res.tokens == plain.tokens
        d = bandit_decisions(res.timeline)
        for bucket, rows in d.groupby("bucket"):
            if len(rows) >= 20:
                assert {"plain", *arms} <= set(rows["arm"])
        kinds = (d["plan_k"] > 0).astype(int).tolist()
        assert sum(a != b for a, b in zip(kinds, kinds[1:])) >= 4  # switches both ways
        assert 0 < plain_share(d) < 1


def test_an_adaptive_rollout_logs_one_decision_per_step(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, seed=4)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=40, seed=9, max_batch_size=6)
    schedule = AdaptiveSchedule(threshold=5, arms=["chain:k=1", "chain:k=3"], window=5,
                                explore_budget=1.0)
    res = engine.rollout(MANY, cfg, drafter=EagleDrafter(EagleHead(model), model),
                         schedule=schedule, progress=False)
    res.timeline.save(tmp_path / "tl")
    steps = Timeline.load(tmp_path / "tl").steps
    pd.testing.assert_frame_equal(steps, res.timeline.steps)
    assert steps.loc[steps["kind"] == "prefill", "decision"].isna().all()
    decided = steps[steps["decision"].notna()]
    for _, rows in decided.groupby(["worker", "decision"]):
        first = rows.iloc[0]
        assert list(rows["kind"]) in (["decode"], ["draft", "verify"])
        for col in ("plan_k", "bucket", "arm", "explored", "batch_size"):
            assert rows[col].nunique(dropna=False) == 1
        if first["kind"] == "decode":
            assert first["plan_k"] == 0 and first["arm"] == "plain"
        else:
            assert first["batch_size"] <= 5 and first["arm"] == f"chain:k={first['plan_k']}"
        if first["batch_size"] > 5:  # above the fixed threshold: plain, no bucket
            assert first["arm"] == "plain" and pd.isna(first["bucket"])
        else:
            assert first["bucket"] == schedule.bandit.bucket(int(first["batch_size"]))
    assert len(decided.groupby(["worker", "decision"])) == \
        steps["kind"].isin(["decode", "verify"]).sum()
    assert res.timeline.decision_columns == ["bucket", "arm", "explored", "settling",
                                             "charged_to"]
    assert {c: str(steps[c].dtype) for c in res.timeline.decision_columns} == \
        {"bucket": "string", "arm": "string", "explored": "boolean", "settling": "boolean",
         "charged_to": "Int64"}
    choices = bandit_choices(res.timeline)
    assert list(choices.columns) == ["bucket", "arm", "pulls", "explored", "tokens_per_s"]
    buckets = list(choices["bucket"].unique())
    assert len(buckets) >= 2 and buckets == sorted(buckets, key=lambda b: int(b.split("-")[0]))
    state = schedule.table()
    assert choices.set_index(["bucket", "arm"])["pulls"].sort_index().equals(
        state.set_index(["bucket", "arm"])["pulls"].sort_index())
    assert (choices["tokens_per_s"] > 0).all()
    d = bandit_decisions(res.timeline)
    assert list(d.columns) == DECIDED_COLUMNS
    assert len(d) == len(decided.groupby(["worker", "decision"]))


def test_explore_cost_is_the_time_exploring_lost_against_the_best_arm_in_hindsight():
    d = pd.DataFrame({"bucket": ["1"] * 6 + ["2-3"] * 4,
                      "arm": ["plain"] * 4 + ["sd"] * 2 + ["plain"] * 3 + ["sd"],
                      "explored": [False] * 4 + [True] * 2 + [False] * 3 + [True],
                      "plan_k": [0] * 4 + [4] * 2 + [0] * 3 + [4],
                      "tokens": [10] * 4 + [5] * 2 + [20] * 3 + [40],
                      "seconds": [1.0] * 10})
    # bucket 1: plain 10 tok/s is best, each sd step took 1 s for 5 tokens (0.5 s at best);
    # bucket 2-3: sd (one pull, 40 tok/s) is below min_pulls, so plain (20 tok/s) is the
    # best, and the sd step lost 1 - 40/20 = -1 s
    assert explore_cost(d) == pytest.approx((0.5 + 0.5 - 1.0) / 10)
    assert explore_cost(d, min_pulls=1) == pytest.approx((0.5 + 0.5 + 0.0) / 10)
    assert plain_share(d) == pytest.approx(0.7)


def test_tables_saved_before_the_decision_columns_still_load(tokenizer, tmp_path):
    """A plain rollout writes plan columns but no bandit columns (a plain schedule gives no
    reasons); a table saved before the plan columns loads with them NA, and the bandit's
    reader fills its own columns with NA."""
    res = RolloutEngine(tiny_model("llama", tokenizer), tokenizer).rollout(
        MANY[:3], max_new_tokens=6, progress=False)
    old = res.timeline
    assert old.decision_columns == []
    old.steps = old.steps.drop(columns=["decision", "plan_k"])
    old.steps.to_parquet(tmp_path / "steps.parquet")
    old.save(tmp_path / "tl")
    (tmp_path / "steps.parquet").replace(tmp_path / "tl" / "steps.parquet")
    loaded = Timeline.load(tmp_path / "tl")
    assert loaded.steps["decision"].isna().all() and bandit_choices(loaded).empty
    assert str(loaded.steps["plan_k"].dtype) == "Int64"
    assert list(bandit_decisions(loaded).columns) == DECIDED_COLUMNS


# ---- bad input --------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [0, -1, 2.5])
def test_a_bad_threshold_is_named(threshold):
    with pytest.raises(ValueError, match=f"threshold must be None .* or an integer >= 1.*"
                                         f"{threshold}"):
        AdaptiveSchedule(threshold=threshold, arms=["chain:k=2"])


@pytest.mark.parametrize("arm", ["beam:k=4", "chain:k=0", "tree:k=4", "chain:4"])
def test_an_unknown_strategy_is_named_with_the_accepted_forms(arm):
    with pytest.raises(ValueError, match=rf"unknown SD strategy '{arm}'.*'chain:k=K' or "
                                         r"'tree:k=K,b=B\[,n=N\]'"):
        AdaptiveSchedule(arms=["chain:k=2", arm])


def test_empty_or_repeated_arms_and_bad_bandit_settings_are_refused():
    with pytest.raises(ValueError, match="non-empty list of strategies"):
        AdaptiveSchedule(arms=[])
    with pytest.raises(ValueError, match="same strategy twice"):
        AdaptiveSchedule(arms=["chain:k=2", "chain: k=2"])
    with pytest.raises(ValueError, match="epsilon must be a number in"):
        BucketedBandit(["a"], epsilon=1.5)
    with pytest.raises(ValueError, match=r"explore_budget must be a number in \[0, 1\], got -0.1"):
        BucketedBandit(["a"], explore_budget=-0.1)
    with pytest.raises(ValueError, match="same strategy twice"):
        AdaptiveSchedule(arms=["plain", "chain:k=2", "plain"])
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        BucketedBandit(["a"], window=0)
    with pytest.raises(ValueError, match="bucket edges must be strictly increasing"):
        BucketedBandit(["a"], edges=(2, 4))


def test_an_arm_never_explored_is_expected_to_cost_what_the_costliest_did():
    """On a slow machine only the first exploration's cost is unknown: the next untried arm
    waits until the budget has room for what the first one cost."""
    bandit = BucketedBandit(["plain", "sd2", "sd4"], epsilon=0.0, explore_budget=0.02)
    rewards, seconds = {"plain": 100.0, "sd2": 10.0, "sd4": 5.0}, {"plain": 0.01, "sd2": 0.05,
                                                                   "sd4": 0.1}
    choices = pull(bandit, 1, rewards, random.Random(0), 1500, seconds=seconds)
    first_sd2 = next(i for i, c in enumerate(choices) if c.arm == "sd2")
    first_sd4 = next(i for i, c in enumerate(choices) if c.arm == "sd4")
    assert first_sd2 == 1  # plain, then the first unknown arm at once
    # sd4 waited until 2% of the (faded) observed seconds covered sd2's cost of 0.045 s twice
    # (in the ledger, and as what sd4 was expected to cost), both faded alike
    assert bandit.expected_cost("1", "sd4") == pytest.approx(bandit.budget.arm_cost("sd4"))
    assert first_sd4 > 300


NOTEBOOK_RATES = {"plain": 800.0, "chain2": 900.0, "chain4": 950.0, "tree": 700.0}  # tok/s
OUTLIER_S = 0.2  # chain2's first pull: 6 tokens in 0.2 s (a first call's compile, say)


def notebook_step(bandit, i):
    """Pull ``i`` of four workers taking turns at 3 live rows, 6 tokens a step."""
    c = bandit.choose(3, worker=i % 4)
    first = c.arm == "chain2" and bandit.pulls[c.bucket, c.arm] == 1
    seconds = OUTLIER_S if first else 6 / NOTEBOOK_RATES[c.arm]
    bandit.update(c, 6 / seconds, seconds)
    return c


def test_one_outlier_exploring_pull_does_not_stop_exploring_for_good():
    """Notebook 04's failure: chain2's first (exploring) pull lost more than any worker's
    budget can ever hold. Every untried arm used to be expected to cost that much, for good,
    so nothing was explored again and plain stayed the best. The recorded cost fades, so
    every arm is tried, the fastest is found, and exploring goes on to the end; a pickled
    bandit (a checkpoint keeps a schedule) carries on with the same choices."""
    bandit = BucketedBandit(list(NOTEBOOK_RATES), epsilon=0.1, explore_budget=0.02, seed=0)
    most = 0.02 * max(6 / r for r in NOTEBOOK_RATES.values()) / (1 - LEDGER_DECAY)
    assert OUTLIER_S - 6 / NOTEBOOK_RATES["plain"] > most  # the outlier's cost: past any budget
    choices = [notebook_step(bandit, i) for i in range(2000)]
    clone = pickle.loads(pickle.dumps(bandit))
    choices += [notebook_step(bandit, i) for i in range(2000, 4000)]
    assert [notebook_step(clone, i) for i in range(2000, 4000)] == choices[2000:]
    assert bandit.best("2-3") == "chain4"
    assert {c.arm for c in choices[3000:] if c.explored} == {"plain", "chain2", "tree"}


def test_a_bandit_pickled_before_the_ledger_and_runs_resumes_as_it_ran():
    """A TLT checkpoint pickles its schedule; one from before the budget's ledger and the
    exploring runs held the exploring share and cost sums on the bandit itself. Unpickled
    now, it keeps its rewards and sums, explores one step at a time as it did, and goes on
    choosing and learning (and pickles again in today's form)."""
    def step(bandit, i):  # four workers taking turns at 3 live rows, steady rates
        c = bandit.choose(3, worker=i % 4)
        bandit.update(c, NOTEBOOK_RATES[c.arm], 6 / NOTEBOOK_RATES[c.arm])
        return c
    bandit = BucketedBandit(list(NOTEBOOK_RATES), epsilon=0.1, explore_budget=0.02, seed=0)
    for i in range(300):
        step(bandit, i)
    state = dict(bandit.__dict__)
    budget = state.pop("budget")
    del state["runs"]
    state.update(explore_budget=0.02, observed_s=dict(budget.observed_s),
                 explore_cost_s=dict(budget.explore_cost_s),
                 last_cost={key: budget.expected_cost(*key) for key in budget.bucket_costs},
                 arm_cost={arm: budget.arm_cost(arm) for arm in budget.arm_costs})
    old = BucketedBandit.__new__(BucketedBandit)
    old.__dict__.update(state)  # the older form, as its pickle would hold it
    resumed = pickle.loads(pickle.dumps(old))
    assert (resumed.runs.length, resumed.runs.settle) == (1, 0)
    assert resumed.budget.share == 0.02 and resumed.budget.observed_s == budget.observed_s
    for key in budget.bucket_costs:
        assert resumed.expected_cost(*key) == pytest.approx(bandit.expected_cost(*key))
    assert resumed.value("2-3", "chain4") == bandit.value("2-3", "chain4")
    choices = [step(resumed, i) for i in range(300, 2300)]
    assert not any(c.settling for c in choices) and any(c.explored for c in choices)
    assert resumed.best("2-3") == "chain4"
    again = pickle.loads(pickle.dumps(resumed))
    assert [step(again, i) for i in range(2300, 2400)] == \
        [step(resumed, i) for i in range(2300, 2400)]


def test_an_expensive_stale_arm_blocks_only_itself_until_its_cost_fades():
    """Worker 1 tries each arm (cheap in a run of six; slow's run ends after one pull, which
    loses more than worker 1's budget holds, and more than worker 0's budget holds).
    Worker 0 still refreshes the cheap arm in turn (slow, the stalest, used to block every
    refresh), and re-tries slow once its recorded cost has faded to what the budget holds,
    never before."""
    bandit = BucketedBandit(["best", "cheap", "slow"], epsilon=0.2, explore_budget=0.02)
    rates, seconds = {"best": 100.0, "cheap": 99.0, "slow": 1.0}, {"best": 0.01, "cheap": 0.01,
                                                                   "slow": 1.0}

    def step(worker):
        affordable = bandit.may_explore(worker, bandit.expected_cost("1", "slow"))
        c = bandit.choose(1, worker)
        assert affordable or c.arm != "slow"
        bandit.update(c, rates[c.arm], seconds[c.arm])
        return c

    assert [step(1).arm for _ in range(8)] == ["best"] + ["cheap"] * 6 + ["slow"]
    first = [step(0) for _ in range(1000)]
    assert sum(c.arm == "cheap" for c in first) > 100 and not any(c.arm == "slow" for c in first)
    assert not bandit.may_explore(0, bandit.expected_cost("1", "slow"))  # slow: still blocked
    later = [step(0) for _ in range(3000)]
    assert any(c.arm == "slow" for c in later)


def test_a_steadily_slow_arm_is_re_tried_no_more_than_the_budget_allows():
    """A 10x slower arm, each pull losing 0.09 s, under half of what the budget holds (2% of
    a worker's faded ~10 s): re-tried again and again as its cost fades, but at every step
    the faded ledger stays within the share of the faded seconds (past it by one pull at
    most), and over the run what exploring lost stays within the share of all the seconds,
    plus one pull."""
    bandit = BucketedBandit(["plain", "slow"], epsilon=1.0, explore_budget=0.02)
    rates, seconds = {"plain": 100.0, "slow": 10.0}, {"plain": 0.01, "slow": 0.1}
    lost = 0.1 - 10.0 * 0.1 / 100.0
    ledger, total_s, explored = bandit.budget, 0.0, 0
    for _ in range(30000):
        c = bandit.choose(1)
        bandit.update(c, rates[c.arm], seconds[c.arm])
        total_s, explored = total_s + seconds[c.arm], explored + c.explored
        assert ledger.explore_cost_s[0] <= 0.02 * ledger.observed_s[0] + lost + 1e-12
    assert explored >= 20 and bandit.pulls["1", "slow"] == explored
    assert explored * lost <= 0.02 * total_s + lost


def test_absorbing_a_rollouts_steps_table_replays_what_its_schedule_learned(tokenizer):
    """What a Ray actor's copy of the schedule learns comes back as the steps table; replayed
    into a fresh schedule (worker by worker, decision by decision), a local rollout's table
    gives exactly the bandit state the live schedule learned: pulls, rewards (none from the
    runs' settling pulls), best arms and the exploring ledgers."""
    from workbench.speculative import NGramDrafter
    model = tiny_model("llama", tokenizer)
    arms = dict(arms=["chain:k=2", "chain:k=3"], seed=1, explore_budget=0.5)
    live, replayed = AdaptiveSchedule(**arms), AdaptiveSchedule(**arms)
    result = RolloutEngine(model, tokenizer).rollout(
        PROMPTS, RolloutConfig(max_new_tokens=16, workers=2), drafter=NGramDrafter(),
        schedule=live, progress=False)
    decided = result.timeline.steps.dropna(subset=["bucket"])
    assert decided["settling"].any() and (decided["explored"] & ~decided["settling"]).any()
    replayed.absorb(result.timeline.steps)
    assert live.table().equals(replayed.table()) and len(live.table()) >= 3
    assert live.bandit.budget.observed_s == replayed.bandit.budget.observed_s
    assert live.bandit.budget.explore_cost_s == replayed.bandit.budget.explore_cost_s
    assert live.bandit.budget.bucket_costs == replayed.bandit.budget.bucket_costs
    replayed.absorb(result.timeline.steps.drop(columns=["bucket", "arm", "explored",
                                                        "settling", "charged_to"]))
    assert live.table().equals(replayed.table())  # a table of another schedule teaches nothing


# ---- exploring runs and settling --------------------------------------------------------
def by_hand(bandit, rewards, seconds=None):
    """One pull at ``(batch_size, worker)``, its reward ``rewards[arm]`` (tokens per second) in
    ``seconds[arm]`` (1 s by default); the choice."""
    def step(batch_size, worker=0):
        c = bandit.choose(batch_size, worker)
        bandit.update(c, rewards[c.arm], (seconds or {}).get(c.arm, 1.0))
        return c
    return step


def test_an_exploring_pull_starts_a_run_in_its_bucket_whichever_worker_pulls():
    """Two workers alternate; the bucket that explores pulls the same arm for the run's
    length (every pull exploring, charged to the worker that started it), while pulls in
    another bucket go on as usual."""
    bandit = BucketedBandit(["a", "b"], epsilon=0.0, explore_budget=1.0, explore_run=4,
                            settle=1)
    step = by_hand(bandit, {"a": 10.0, "b": 5.0})
    warm = [step(1, w) for w in (0, 1, 0, 1, 0, 1, 0)]  # bucket 1: both arms tried
    assert [(c.arm, c.explored, c.worker) for c in warm] == \
        [("a", False, 0), ("a", False, 1)] + [("b", True, 0)] * 4 + [("a", False, 0)]
    assert [c.settling for c in warm] == [False, False, True, False, False, False, False]
    first = [step(4, 1), step(4, 0)]  # bucket 4-7: a (the neighbour's best), then b's run
    assert [(c.arm, c.explored) for c in first] == [("a", False), ("b", True)]
    clone = pickle.loads(pickle.dumps(bandit))  # a checkpoint keeps the open run
    assert [by_hand(clone, {"a": 10.0, "b": 5.0})(4, w).arm for w in (1, 0, 1, 0)] == \
        ["b", "b", "b", "a"]
    mixed = [step(batch, w) for w in (1, 0, 1) for batch in (1, 4)]
    assert [(c.bucket, c.arm, c.explored, c.worker) for c in mixed] == \
        [("1", "a", False, 1), ("4-7", "b", True, 0), ("1", "a", False, 0),
         ("4-7", "b", True, 0), ("1", "a", False, 1), ("4-7", "b", True, 0)]
    assert (step(4, 0).arm, step(4, 1).arm) == ("a", "a")  # the run is over


def test_a_run_ends_when_the_budget_no_longer_affords_its_next_pull():
    """b loses 0.9 s a pull against a; 20% of a's 10 s (and b's seconds) affords two pulls:
    the run stops there, and the ledger never passed its share."""
    bandit = BucketedBandit(["a", "b"], epsilon=0.0, explore_budget=0.2, explore_run=6,
                            settle=1)
    step = by_hand(bandit, {"a": 10.0, "b": 1.0}, {"a": 10.0, "b": 1.0})
    ledger, choices = bandit.budget, []
    for i in range(6):
        if i == 3:  # a third pull of b would pass the share
            assert not bandit.may_explore(0, bandit.expected_cost("1", "b"))
        choices.append(step(1))
        assert ledger.explore_cost_s[0] <= 0.2 * ledger.observed_s[0]
    assert [c.arm for c in choices] == ["a", "b", "b", "a", "a", "a"]
    assert bandit.pulls["1", "b"] == 2 and bandit.value("1", "b") == 1.0  # the 2nd taught


def test_a_runs_settling_pulls_are_charged_but_teach_nothing():
    """The first ``settle`` pulls of a run leave the arm's value and the best alone (even a
    reward that would win), count as pulls and are charged; the later ones enter the value."""
    bandit = BucketedBandit(["a", "b"], epsilon=0.0, explore_budget=1.0, explore_run=5,
                            settle=2)
    c = bandit.choose(1)
    bandit.update(c, 10.0, 1.0)
    rewards, values, costs, reference = [100.0, 2.0, 4.0, 6.0, 8.0], [], [], 0.0
    for i, reward in enumerate(rewards):
        c = bandit.choose(1)
        assert (c.arm, c.explored, c.settling) == ("b", True, i < 2)
        bandit.update(c, reward, 1.0)
        values.append(bandit.value("1", "b"))
        reference = LEDGER_DECAY * reference + max(0.0, 1.0 - reward / 10.0)
        costs.append(bandit.budget.explore_cost_s[0])
        assert costs[-1] == pytest.approx(reference, rel=1e-12)
        assert bandit.best("1") == "a" and bandit.pulls["1", "b"] == i + 1
        assert bandit.last_pull["1", "b"] == bandit.total_pulls - 1
    assert values == [float("-inf"), float("-inf"), 4.0, 5.0, 6.0]
    assert costs[1] > costs[0] == 0.0  # the winning settling pull cost nothing, the next 0.8 s
    assert bandit.choose(1).arm == "a"  # b tried: no run of it again (epsilon 0)


STEADY = {"sd": 1000.0, "plain": 1200.0}  # tok/s in a steady stream of one arm
SWITCH_SLOWDOWN = (1.5, 1.3, 1.15)  # the 1st, 2nd, 3rd step after a switch (bench_arm_switch)


def switching_machine(bandit, pulls):
    """``pulls`` decode steps of 6 tokens by two workers taking turns at one live row, on a
    machine where each arm has a steady rate but a step right after a pull of another arm
    (the bandit's previous pull) runs slower, fading over three steps; the choices."""
    choices, previous, since_switch = [], None, len(SWITCH_SLOWDOWN)
    for i in range(pulls):
        c = bandit.choose(1, worker=i % 2)
        since_switch = 0 if previous not in (None, c.arm) else since_switch + 1
        slowdown = SWITCH_SLOWDOWN[since_switch] if since_switch < len(SWITCH_SLOWDOWN) else 1.0
        seconds = 6 / STEADY[c.arm] * slowdown
        bandit.update(c, 6 / seconds, seconds)
        choices.append(c)
        previous = c.arm
    return choices


def test_runs_measure_the_steady_rate_where_single_steps_read_the_switch():
    """Notebook 04's failure, simulated: a bucket starts on SD (say, a neighbour's best), and
    plain is 1.2x faster in steady state. Explored one step at a time, every plain pull is a
    first step after a switch and reads 1.5x slow, so SD stays the best; explored in runs
    whose first pulls settle, plain's steady rate is measured and plain wins."""
    def run(**rule):
        bandit = BucketedBandit(["sd", "plain"], epsilon=0.1, explore_budget=0.02, seed=0,
                                **rule)
        return bandit, switching_machine(bandit, 4000)

    old, old_choices = run(explore_run=1, settle=0)
    new, new_choices = run()
    assert old.best("1") == "sd" and new.best("1") == "plain"
    assert sum(c.arm == "plain" for c in old_choices[2000:]) >= 20  # explored, misread
    assert old.value("1", "plain") == pytest.approx(STEADY["plain"] / 1.5)
    assert new.value("1", "plain") == pytest.approx(STEADY["plain"])
    assert any(c.arm == "sd" and c.explored for c in new_choices[2000:])  # still explores


@pytest.mark.parametrize("run, settle, bad", [(0, 0, "explore_run must be an integer >= 1, "
                                                     "got 0"),
                                              (2.5, 1, "explore_run must be an integer >= 1, "
                                                       "got 2.5"),
                                              (4, 4, r"settle \(with explore_run=4\) must be "
                                                     r"an integer in \[0, 3\], got 4"),
                                              (4, -1, r"settle \(with explore_run=4\) must be "
                                                      r"an integer in \[0, 3\], got -1")])
def test_bad_run_settings_are_refused_with_the_value_named(run, settle, bad):
    with pytest.raises(ValueError, match=bad):
        BucketedBandit(["a", "b"], explore_run=run, settle=settle)
    with pytest.raises(ValueError, match=bad):
        AdaptiveSchedule(arms=["chain:k=2"], explore_run=run, settle=settle)


def test_absorb_replays_runs_charged_across_workers_and_their_settling_pulls():
    """Worker 0 starts a run that worker 1's pulls finish (charged to worker 0, the first two
    settling): replayed from the decisions' columns, the state is the live one's; replayed
    as if nothing settled, it is not."""
    arms = dict(arms=["chain:k=2"], epsilon=0.0, explore_budget=1.0, explore_run=4, settle=2)
    live, replayed, unsettled = (AdaptiveSchedule(**arms) for _ in range(3))
    tokens, rows = {"plain": 5, "chain:k=2": 8}, []
    for worker, steps in ((0, 2), (1, 6)):
        for i in range(steps):
            decision = live.decide(1, worker)
            live.observe(report(decision.plan, worker, tokens[decision.reasons["arm"]], 0.01,
                                decision))
            rows.append({"worker": worker, "decision": i, **decision.reasons,
                         "tokens": tokens[decision.reasons["arm"]], "start_s": 0.0,
                         "end_s": 0.01})
    steps = pd.DataFrame(rows)
    assert list(steps["settling"]) == [False, True, True, False, False, False, False, False]
    assert list(steps["charged_to"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    replayed.absorb(steps)
    assert live.table().equals(replayed.table())
    for ledger in ("observed_s", "explore_cost_s", "bucket_costs"):
        assert getattr(live.bandit.budget, ledger) == getattr(replayed.bandit.budget, ledger)
    unsettled.absorb(steps.drop(columns=["settling"]))
    assert not live.table().equals(unsettled.table())
