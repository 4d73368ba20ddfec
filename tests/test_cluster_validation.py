"""The simulator's validation: the workers' spread recovered from a timeline whose spread is
known, stragglers lengthening the predicted makespan with N, real tiny-model rollouts
calibrated and predicted end to end (each held-out run with the costs of the passes that
bracket it, the pooled lengths, an SD strategy's costs from a drafter), and bad plans refused
before anything runs."""
import math

import numpy as np
import pandas as pd
import pytest

from workbench.cluster import Layout, StepCost, layout, simulate_rollout, trace_from_timeline
from workbench.cluster.validation import (VALIDATION_COLUMNS, RunSpec, predicted_makespan,
                                          run_validation, worker_spread)
from workbench.rollout import RolloutConfig
from workbench.speculative import NGramDrafter

from .helpers.models import MANY, tiny_model

COST = StepCost(pd.DataFrame({"batch_size": [1, 8], "kind": "plain", "seconds": [0.01, 0.02],
                              "tau": 1.0}))


def uniform_layout(workers: int, per_worker: int = 4, length: int = 30) -> Layout:
    shape = (workers, per_worker)
    return Layout(np.full(shape, length, np.int64), np.full(shape, 5, np.int64))


def test_the_spread_of_simulated_stragglers_is_recovered():
    # 400 identical workers slowed by known factors: their log-speeds' spread is 0.3
    recorded = simulate_rollout(uniform_layout(400), COST, spread=0.3, seed=5)
    assert worker_spread([recorded], COST) == pytest.approx(0.3, rel=0.1)
    assert worker_spread([simulate_rollout(uniform_layout(400), COST)], COST) == pytest.approx(0)
    assert worker_spread([simulate_rollout(uniform_layout(1), COST)], COST) == 0.0


def test_stragglers_lengthen_the_predicted_makespan_more_at_larger_n():
    alike = simulate_rollout(uniform_layout(4), COST).makespan_s
    small = predicted_makespan(simulate_rollout(uniform_layout(4), COST), COST, spread=0.3)
    large = predicted_makespan(simulate_rollout(uniform_layout(64), COST), COST, spread=0.3)
    assert predicted_makespan(simulate_rollout(uniform_layout(4), COST), COST) == alike
    # the expected slowest of N workers: about e^(0.3 x 1.03 - 0.045) at 4, e^(0.3 x 2.4 -
    # 0.045) at 64
    assert alike < small < large
    assert large / alike == pytest.approx(math.exp(0.3 * 2.4 - 0.045), rel=0.1)


@pytest.fixture(scope="module")
def validated(tokenizer):
    model = tiny_model("llama", tokenizer)
    config = RolloutConfig(max_new_tokens=12, temperature=1.0, samples_per_prompt=2)
    calibration = [RunSpec("calibration", 2, 4, 0), RunSpec("calibration", 2, 1, 0)]
    held_out = [RunSpec("seed", 2, 4, 1), RunSpec("N=4", 4, 2, 2)]
    return run_validation(model, tokenizer, MANY, calibration, held_out, config,
                          drafter=NGramDrafter(), repeats=2)


def test_held_out_runs_are_predicted_from_their_lengths_and_the_calibration(validated):
    v = validated
    table = v.table
    assert list(table.columns) == list(VALIDATION_COLUMNS)
    assert table["run"].tolist() == ["seed", "N=4"] and set(table["clock"]) == {"sim"}
    assert table[["workers", "per_worker", "seed", "repeats"]].values.tolist() == [
        [2, 4, 1, 2], [4, 2, 2, 2]]
    for name, repeats in v.held_out.items():
        # the repeats decode the same tokens; each is predicted with its own passes' costs
        assert len(repeats) == 2
        assert len({tuple(t.requests["response_tokens"]) for t in repeats}) == 1
        row = table.set_index("run").loc[name]
        measured = [t.makespan_s for t in repeats]
        predicted = [predicted_makespan(t, c, v.spread) for t, c in zip(repeats, v.costs[name])]
        errors = [(p - m) / m for p, m in zip(predicted, measured)]
        assert row["measured_s"] == pytest.approx(np.median(measured), rel=1e-12)
        assert row["predicted_s"] == pytest.approx(np.median(predicted), rel=1e-12)
        assert row["error"] == pytest.approx(np.median(errors), rel=1e-12)
        assert (row["error_low"], row["error_high"]) == (min(errors), max(errors))
    # the mean worker's busy time: the cost model's own error, per repeat, then the median
    busy, replayed = [], []
    for t, cost in zip(v.held_out["seed"], v.costs["seed"]):
        busy.append(t.worker_summary()["busy_s"].mean())
        replay = simulate_rollout(layout(trace_from_timeline(t)), cost)
        replayed.append(replay.worker_summary()["busy_s"].mean())
    row = table.set_index("run").loc["seed"]
    assert row["measured_busy_s"] == pytest.approx(np.median(busy), rel=1e-12)
    assert row["predicted_busy_s"] == pytest.approx(np.median(replayed), rel=1e-12)
    assert row["busy_error"] == pytest.approx(
        np.median([(p - m) / m for p, m in zip(replayed, busy)]), rel=1e-12)
    # steps of a tiny model last about a millisecond: within a factor of two is all a busy
    # machine's timer noise allows to assert here (the notebook reports the real errors)
    assert (table["error"].abs() < 1.0).all()
    assert v.median_error("sim") == table["error"].abs().median()
    assert math.isnan(v.median_error("wall"))
    m = v.metrics()
    assert m["sim_error_small_n"] == v.median_error("sim") and math.isnan(m["sim_error_wall"])
    assert m["worker_spread"] == v.spread and m["validation_runs"] == 2
    assert m["busy_error_small_n"] == table["busy_error"].abs().median()
    usage = [t.usage_s() for runs in v.held_out.values() for t in runs]
    assert m["disturbed_share_small_n"] == pytest.approx(
        sum(u["disturbed_s"] for u in usage) / sum(u["measured_s"] for u in usage))
    assert math.isnan(m["disturbed_share_wall"])


def test_each_held_out_run_is_bracketed_by_its_own_calibration_passes(validated):
    v = validated
    # five plain passes of the two calibration runs (one first, then one after each of the
    # four held-out repeats), then the runs with the n-gram drafter on every decode step,
    # first and last
    assert len(v.calibration) == 5 * 2 + 2 * 2
    verifies = [bool((t.steps["kind"] == "verify").any()) for t in v.calibration]
    assert verifies == [False] * 10 + [True] * 4
    for i, cost in enumerate(v.costs["seed"] + v.costs["N=4"]):  # pass i before, i + 1 after
        pd.testing.assert_frame_equal(cost.table, StepCost.from_timelines(
            v.calibration[2 * i:2 * i + 4]).table)
    assert v.costs["seed"][0].kinds == ["plain", "prefill"]
    # the what-ifs' costs pool everything, the drafter's strategy included
    assert {"plain", "prefill", "chain:k=4"} <= set(v.cost.kinds)
    assert (v.cost.tau("chain:k=4", [1, 4]) >= 1).all()
    pd.testing.assert_frame_equal(v.cost.table, StepCost.from_timelines(v.calibration).table)
    # the workers' spread from the plain runs alone: SD runs also differ in acceptance
    assert v.spread == worker_spread(v.calibration[:10], v.cost)
    # every plain run's requests pooled, groups kept apart by run
    lengths = v.lengths()
    assert len(lengths.requests) == 2 * 4 + 2 * 4 + 4 * 2  # one repeat of each held-out run
    assert lengths.requests["group"].str.split("/").str[0].nunique() == 3


def test_bad_plans_are_refused_before_anything_runs(tokenizer):
    config = RolloutConfig(max_new_tokens=4, samples_per_prompt=2)
    run = lambda cal, held, pool=MANY: run_validation(None, tokenizer, pool, cal, held, config)
    ok = RunSpec("calibration", 2, 2)
    with pytest.raises(ValueError, match=r"run 'odd': 1 x 3 = 3 requests must be a multiple"):
        run([ok], [RunSpec("odd", 1, 3)])
    with pytest.raises(ValueError, match=r"need at most 2 prompts"):
        run([ok], [RunSpec("big", 4, 4)], MANY[:2])
    with pytest.raises(ValueError, match=r"calibration needs at least one run, all on the local"):
        run([RunSpec("calibration", 2, 2, 0, "ray")], [])
    with pytest.raises(ValueError, match=r"held-out runs need distinct names"):
        run([ok], [RunSpec("a", 2, 2, 1), RunSpec("a", 2, 2, 2)])
    with pytest.raises(ValueError, match=r"RunSpec.backend must be one of"):
        RunSpec("x", 1, 2, backend="slurm")
