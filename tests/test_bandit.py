"""BEG-MAB and the adaptive schedule: the bandit on synthetic rewards, the schedule's rule, a
lossless float64 rollout whose steps table logs every decision, and the input checks."""
import random

import pandas as pd
import pytest

from workbench.rollout import RolloutConfig, RolloutEngine, StepPlan, StepReport, Timeline
from workbench.rollout.schedule import ThresholdSchedule
from workbench.speculative import EagleDrafter, EagleHead
from workbench.speculative.bandit import (AdaptiveSchedule, BucketedBandit, parse_strategy,
                                          strategy_name)

from .conftest import tiny_model
from .test_engine import MANY


def pull(bandit, batch_size, medians, rng, n):
    """``n`` pulls at ``batch_size``, rewards noisy around ``medians[arm]``; the choices."""
    choices = []
    for _ in range(n):
        c = bandit.choose(batch_size)
        bandit.update(c, medians[c.arm] + rng.gauss(0, 0.5))
        choices.append(c)
    return choices


# ---- the bandit -------------------------------------------------------------------------
def test_the_bandit_settles_on_the_best_arm_of_each_bucket_independently():
    bandit = BucketedBandit(["a", "b", "c"], epsilon=0.1, window=100, seed=1)
    rng = random.Random(0)
    small = pull(bandit, 1, {"a": 1.0, "b": 3.0, "c": 2.0}, rng, 600)
    large = pull(bandit, 20, {"a": 3.0, "b": 1.0, "c": 2.0}, rng, 600)
    for choices, best, bucket in ((small, "b", "1"), (large, "a", "16-31")):
        assert {c.bucket for c in choices} == {bucket}
        assert max(bandit.arms, key=lambda a: bandit.value(bucket, a)) == best
        assert sum(c.arm == best for c in choices) > 0.8 * len(choices)
        explored = sum(c.explored for c in choices)
        assert 0.05 * len(choices) < explored < 0.2 * len(choices)  # epsilon = 0.1
    table = bandit.table()
    assert table["pulls"].sum() == 1200 and set(table["bucket"]) == {"1", "16-31"}
    assert [bandit.bucket(n) for n in (1, 2, 3, 4, 7, 8, 127, 128, 5000)] == \
        ["1", "2-3", "2-3", "4-7", "4-7", "8-15", "64-127", "128+", "128+"]


def test_epsilon_zero_never_explores_after_each_arm_was_tried_and_seeds_repeat():
    def run(seed, epsilon):
        bandit = BucketedBandit(["a", "b", "c"], epsilon=epsilon, seed=seed)
        return pull(bandit, 4, {"a": 2.0, "b": 1.0, "c": 1.5}, random.Random(3), 200)

    greedy = run(0, 0.0)
    assert [c.arm for c in greedy[:3]] == ["a", "b", "c"] and all(c.explored for c in greedy[:3])
    assert not any(c.explored for c in greedy[3:])
    assert run(5, 0.3) == run(5, 0.3)
    state = random.getstate()
    run(7, 0.5)
    assert random.getstate() == state  # the bandit draws from its own generator


def test_an_arm_whose_reward_drops_is_abandoned_once_the_window_turns_over():
    bandit = BucketedBandit(["a", "b"], epsilon=0.0, window=20)
    rng = random.Random(1)
    assert pull(bandit, 2, {"a": 10.0, "b": 5.0}, rng, 50)[-1].arm == "a"
    after = pull(bandit, 2, {"a": 1.0, "b": 5.0}, rng, 40)
    assert sum(c.arm == "a" for c in after) <= 20 // 2 + 1  # a's median falls past the middle
    assert all(c.arm == "b" for c in after[20:])


# ---- the adaptive schedule --------------------------------------------------------------
def report(plan, worker=0, tokens=10, elapsed=0.01):
    return StepReport(worker, plan, 4, tokens, 0, 0, 0.0, 0.0, elapsed)


def test_adaptive_schedule_is_plain_above_the_threshold_and_learns_at_or_below_it():
    schedule = AdaptiveSchedule(threshold=8, arms=["chain:k=2", "chain:k=4"], epsilon=0.0)
    assert schedule.plan(9, 0) == StepPlan()
    assert schedule.decision(0) == {"bucket": None, "arm": "plain", "explored": False}
    schedule.observe(report(StepPlan()))
    assert schedule.table().empty  # plain steps teach nothing
    speeds = {2: 1000.0, 4: 3000.0}
    for _ in range(10):
        plan = schedule.plan(8, 0)
        assert plan.speculative and schedule.decision(0)["bucket"] == "8-15"
        schedule.observe(report(plan, tokens=int(speeds[plan.k] / 100)))
    assert schedule.plan(8, 0) == StepPlan("speculative", 4)
    assert schedule.decision(0) == {"bucket": "8-15", "arm": "chain:k=4", "explored": False}
    one = AdaptiveSchedule(threshold=8, arms=["chain:k=4"])
    like = ThresholdSchedule(k=4, max_batch=8)
    assert all(one.plan(n, 0) == like.plan(n, 0) for n in range(1, 40))


def test_strategies_parse_to_plans_and_back():
    assert parse_strategy("chain:k=4") == StepPlan("speculative", 4)
    assert parse_strategy("tree: k=4, b=3, n=16") == StepPlan("speculative", 4, 3, 16)
    assert parse_strategy("tree:k=2,b=2") == StepPlan("speculative", 2, 2)
    for text in ("chain:k=6", "tree:k=4,b=3,n=16", "tree:k=2,b=2"):
        assert strategy_name(parse_strategy(text)) == text
    plan = StepPlan("speculative", 3)
    assert parse_strategy(plan) is plan


def test_an_adaptive_rollout_is_lossless_and_logs_one_decision_per_step(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, seed=4)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=40, seed=9, max_batch_size=6)
    plain = engine.rollout(MANY, cfg, progress=False)
    schedule = AdaptiveSchedule(threshold=5, arms=["chain:k=1", "chain:k=3"], window=5)
    res = engine.rollout(MANY, cfg, drafter=EagleDrafter(EagleHead(model), model),
                         schedule=schedule, progress=False)
    assert res.tokens == plain.tokens
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
            assert first["batch_size"] > 5 and first["plan_k"] == 0 and first["arm"] == "plain"
        else:
            assert first["batch_size"] <= 5 and first["arm"] == f"chain:k={first['plan_k']}"
            assert first["bucket"] == schedule.bandit.bucket(int(first["batch_size"]))
    assert len(decided.groupby(["worker", "decision"])) == \
        steps["kind"].isin(["decode", "verify"]).sum()
    choices = res.timeline.bandit_choices()
    assert list(choices.columns) == ["bucket", "arm", "pulls", "explored", "tokens_per_s"]
    buckets = list(choices["bucket"].unique())
    assert len(buckets) >= 2 and buckets == sorted(buckets, key=lambda b: int(b.split("-")[0]))
    state = schedule.table()
    assert choices.set_index(["bucket", "arm"])["pulls"].sort_index().equals(
        state.set_index(["bucket", "arm"])["pulls"].sort_index())
    assert (choices["tokens_per_s"] > 0).all()


def test_tables_saved_before_the_decision_columns_still_load(tokenizer, tmp_path):
    res = RolloutEngine(tiny_model("llama", tokenizer), tokenizer).rollout(
        MANY[:3], max_new_tokens=6, progress=False)
    old = res.timeline
    old.steps = old.steps.drop(columns=["decision", "plan_k", "bucket", "arm", "explored"])
    old.steps.to_parquet(tmp_path / "steps.parquet")
    old.save(tmp_path / "tl")
    (tmp_path / "steps.parquet").replace(tmp_path / "tl" / "steps.parquet")
    loaded = Timeline.load(tmp_path / "tl")
    assert loaded.steps["arm"].isna().all() and loaded.bandit_choices().empty
    assert str(loaded.steps["plan_k"].dtype) == "Int64"


# ---- bad input --------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [0, -1, 2.5])
def test_a_bad_threshold_is_named(threshold):
    with pytest.raises(ValueError, match=f"threshold must be an integer >= 1.*{threshold}"):
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
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        BucketedBandit(["a"], window=0)
    with pytest.raises(ValueError, match="bucket edges must be strictly increasing"):
        BucketedBandit(["a"], edges=(2, 4))
