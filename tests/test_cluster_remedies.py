"""The long-tail remedies on the cluster simulator (workbench.cluster.remedies, remedy_check):
tiny hand-built length distributions whose answer is computed by hand in each test, at a flat
step cost of 1 s (no prefill) so that a request of n tokens alone on its worker ends at n s."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.cluster.cost import StepCost
from workbench.cluster.remedies import (RemedyModel, groups_of_timeline, inferred_max_batch,
                                        remedy_model, remedy_speedups, remedy_steps,
                                        run_rollout, simulate_remedy)
from workbench.cluster.remedy_check import check_remedies, remedy_check_metrics
from workbench.cluster.simulate import Layout, simulate_rollout

FLAT = StepCost(pd.DataFrame({"batch_size": [1, 64], "kind": "plain", "seconds": 1.0, "tau": 1.0}))
MEASURED = StepCost(pd.DataFrame({"batch_size": [1, 8, 1, 8],
                                  "kind": ["plain", "plain", "prefill", "prefill"],
                                  "seconds": [0.01, 0.02, 0.005, 0.03], "tau": 1.0}))


def _g(*lengths):
    return np.array(lengths, np.int64)


def test_without_a_cap_the_rollout_is_the_simulators_own():
    tokens = np.random.default_rng(0).integers(1, 300, 37)
    run = run_rollout(tokens, 4, MEASURED)
    per = int(np.ceil(len(tokens) / 4))
    response = np.zeros(4 * per, np.int64)
    response[:len(tokens)] = tokens
    response = response.reshape(per, 4).T.copy()  # request i on worker i mod 4, as dealt
    t = simulate_rollout(Layout(response, np.zeros_like(response)), MEASURED)
    assert run.makespan == pytest.approx(t.makespan_s)
    r = t.requests.set_index(["worker", "prompt_id"])["end_s"]
    assert run.end == pytest.approx([r[(i % 4, i // 4)] for i in range(len(tokens))])


def test_a_capped_worker_refills_a_finished_rows_slot_and_counts_tokens_from_its_join():
    run = run_rollout([3, 5], 1, FLAT, max_batch=1)
    assert run.end.tolist() == [3.0, 8.0]  # the second waits for the first's slot
    assert run.tokens_at(6.0).tolist() == [3, 3] and run.tokens_at(2.5).tolist() == [2, 0]
    assert run_rollout([3, 5], 1, FLAT, max_batch=2).end.tolist() == [3.0, 5.0]


def test_over_provisioning_ends_at_the_pth_groups_finish_and_aborts_the_rest():
    """P 2, E 1, every request on its own worker: groups finish at 5, 10 and 4 s, so the
    rollout ends at 5 s (the 2nd finish); the 10-token response had 5 tokens then, its
    sibling its 2: 7 tokens aborted. Plain GRPO's step 0 (the first two groups) ends at 10."""
    stream = [_g(3, 5), _g(10, 2), _g(4, 4)]
    model = remedy_model("overprovision", 2, 10)
    assert (model.extra_groups, model.leftover) == (1, "abort")
    r = simulate_remedy(stream, 2, 1, model, 6, FLAT, 10).iloc[0]
    assert r["rollout_s"] == 5.0 and r["groups_trained"] == 2
    assert r["aborted_tokens"] == 7 and r["carried_groups"] == 0
    plain = simulate_remedy(stream, 2, 1, None, 6, FLAT, 10).iloc[0]
    assert plain["rollout_s"] == 10.0 and plain["aborted_tokens"] == 0


def test_april_carries_the_unfinished_response_and_trains_its_stale_tokens():
    """Step 0 as above, the 10-token group carried (5 + 2 tokens of policy 0). Step 1: it
    resumes its 5 tokens beside two fresh groups (6, 1 and, the stream wrapping, 3, 5): the
    carried group and the wrapped one both finish at 5 s and are trained; 7 of their 20
    tokens were sampled by the older policy."""
    stream = [_g(3, 5), _g(10, 2), _g(4, 4), _g(6, 1)]
    r = simulate_remedy(stream, 2, 2, remedy_model("april", 2, 10), 6, FLAT, 10)
    assert r["carried_groups"].tolist() == [1, 1] and r["aborted_tokens"].tolist() == [0, 0]
    assert r["rollout_s"].tolist() == [5.0, 5.0]
    assert r["trained_tokens"].iloc[1] == 20
    assert r["offpolicy_token_share"].tolist() == [0.0, pytest.approx(7 / 20)]


def test_partial_rollouts_cap_each_steps_growth_and_resume_next_step():
    """A segment of 4 tokens: a 9-token response grows 4, 4, 1 over three steps, so each
    step's rollout ends at 4 s (plain: 9 s) and its group trains at step 2, 11 of its 12
    tokens from older policies."""
    stream = [_g(3, 9)]
    r = simulate_remedy(stream, 1, 3, RemedyModel("partial", 0, "carry", 4), 4, FLAT, 16)
    assert r["rollout_s"].tolist() == [4.0, 4.0, 4.0]
    assert r["groups_trained"].tolist() == [0, 0, 1]
    assert r["offpolicy_token_share"].iloc[2] == pytest.approx(11 / 12)
    assert remedy_model("partial", 8, 128).segment_tokens == 32  # notebook 11's quarter


def test_tail_batching_moves_the_long_group_into_a_round_of_its_own():
    """P 1, E 1: the 20-token group is cut at 2 s (2 + 2 tokens aborted) and deferred; the
    next step is its long round (run to its end, 20 s), and the one after is short again:
    the 3-token group and the wrapped 2-token one, cut at 2 s, the 3-token one aborted with
    2 + 2 tokens."""
    stream = [_g(2, 2), _g(20, 20), _g(3, 3)]
    r = simulate_remedy(stream, 1, 3, remedy_model("tail_batching", 1, 20), 4, FLAT, 20)
    assert r["long_round"].tolist() == [False, True, False]
    assert r["rollout_s"].tolist() == [2.0, 20.0, 2.0]
    assert r["aborted_tokens"].tolist() == [4, 0, 4] and r["groups_trained"].tolist() == [1, 1, 1]


def test_remedy_steps_sets_each_remedy_beside_the_plain_step_and_sums_the_speedups():
    steps = [[_g(3, 5), _g(10, 2)], [_g(4, 4), _g(6, 1)]]
    table = remedy_steps(steps, 6, FLAT, max_new_tokens=10)
    plain = table[table["remedy"] == "plain"]
    assert plain["rollout_s"].tolist() == [10.0, 6.0]
    over = table[table["remedy"] == "overprovision"]
    assert over["ratio"].tolist() == pytest.approx(over["rollout_s"].to_numpy() / [10.0, 6.0])
    s = remedy_speedups(table, rest_s=[2.0, 2.0]).set_index("remedy")
    assert set(s.index) == {"overprovision", "april", "partial", "tail_batching"}
    assert s.loc["overprovision", "e2e_speedup"] == pytest.approx(
        20.0 / (over["rollout_s"].sum() + 4.0))
    with pytest.raises(ValueError, match="at least one step"):
        remedy_steps([], 6, FLAT)


def _nb11_run(folder, measured):
    """A notebook 11 run folder: the baseline's saved timelines (2 workers, 4 groups of 2,
    one row at a time) and history.csv with every variant's step times of seed 0."""
    rng = np.random.default_rng(1)
    rows = []
    for step in range(3):
        lay = Layout(rng.integers(5, 60, (2, 4)), np.zeros((2, 4), np.int64))
        t = simulate_rollout(lay, MEASURED)
        t.save(folder / "timelines" / "baseline-seed0" / f"step{step:02d}")
        for variant, speed in measured.items():
            rows.append({"variant": variant, "seed": 0, "step": step,
                         "rollout_s": t.makespan_s * speed, "update_sim_s": 0.1,
                         "step_s": t.makespan_s * speed + 0.1})
    pd.DataFrame(rows).to_csv(folder / "history.csv", index=False)


def test_remedy_check_predicts_each_remedy_from_the_baseline_beside_the_measured(tmp_path):
    _nb11_run(tmp_path, {"baseline": 1.0, "overprovision": 0.5, "april": 0.8, "async": 0.7})
    check = check_remedies(tmp_path, cost=MEASURED)  # simulated timelines measure no step
    table = check.table.set_index("variant")
    assert list(table.index) == ["overprovision", "april"]  # async: not the model's
    assert table.loc["overprovision", "measured"] > 1
    assert table["error"].tolist() == pytest.approx((table["predicted"] / table["measured"] - 1).tolist())
    metrics = check.metrics()
    assert metrics["remedy_sim_error_april"] == table.loc["april", "error"]
    assert remedy_check_metrics(tmp_path, ["baseline", "tlt"]) == {}
    assert check.table["rollout_error"].tolist() == pytest.approx(
        (table["rollout_predicted"] / table["rollout_measured"] - 1).tolist())
    padded = check_remedies(tmp_path, cost=MEASURED, update="padded")
    assert padded.table["rollout_predicted"].tolist() == check.table["rollout_predicted"].tolist()
    assert "remedy_sim_error_april_padded_update" in padded.metrics()
    with pytest.raises(ValueError, match="update"):
        check_remedies(tmp_path, cost=MEASURED, update="tokens")
    with pytest.raises(ValueError, match="no saved timelines of 'baseline'"):
        check_remedies(tmp_path / "nothing")


def test_a_timelines_groups_and_its_cap_are_read_back():
    lay = Layout(np.array([[3, 5], [4, 6]]), np.zeros((2, 2), np.int64))
    t = simulate_rollout(lay, FLAT)
    assert [g.tolist() for g in groups_of_timeline(t)] == [[3, 4], [5, 6]]
    assert inferred_max_batch(t) is None  # every worker's requests decoded at once


def test_a_whatif_replays_every_remedy_at_each_n_from_a_traces_groups():
    from workbench.cluster.fit import fit_lengths
    from workbench.cluster.remedies import remedy_whatif, trace_steps
    from workbench.cluster.trace import Trace
    rng = np.random.default_rng(3)
    trace = Trace(pd.DataFrame({"prompt_tokens": 10, "response_tokens": rng.integers(5, 400, 64),
                                "group": np.repeat(np.arange(16), 4).astype(str)}))
    steps = trace_steps(trace, 8, 3)
    assert len(steps) == 3 and all(len(s) == 8 and all(len(g) == 4 for g in s) for s in steps)
    model = fit_lengths(trace.requests["response_tokens"])
    assert [len(g) for g in trace_steps(model, 2, 1, samples_per_prompt=5)[0]] == [5, 5]
    w = remedy_whatif(trace, MEASURED, [4, 16], 8, steps=4, update_s=0.5)
    assert len(w) == 8 and set(w["workers"]) == {4, 16}
    # the time outside the rollout pulls the speedup toward 1: between 1 and the rollout's
    assert ((w["e2e_speedup"] - 1).abs() <= (w["rollout_speedup"] - 1).abs() + 1e-12).all()
    assert (np.sign(w["e2e_speedup"] - 1) == np.sign(w["rollout_speedup"] - 1)).all()


def test_the_update_fit_keeps_its_fixed_part_and_never_a_negative_one():
    from workbench.cluster.remedies import update_fit
    assert update_fit([1, 2, 3], [2, 3, 4]) == pytest.approx((1.0, 1.0))
    assert update_fit([5, 5], [1.0, 3.0]) == (2.0, 0.0)       # the batch never varied
    assert update_fit([1, 2, 3], [3, 2, 1]) == (2.0, 0.0)       # no slope to move by
    a, b = update_fit([1, 2, 3], [0.5, 2.0, 3.5])             # a negative intercept: through 0
    assert a == 0.0 and b == pytest.approx((0.5 + 4 + 10.5) / 14)


# ---- TLT beside a remedy, the stale update and one-step async (cluster.composed) ---------------
def test_tlt_at_its_limit_decodes_every_remedys_replay_at_its_cheapest_arm_per_token():
    """An SD arm half plain's seconds per token at every batch: the bandit's curve is that
    half, prefill as it was, and each remedy replayed on it ends its rollout at exactly half
    the time, having trained the same groups (the cut falls at the same tokens)."""
    from workbench.cluster.composed import bandit_cost
    sd = StepCost(pd.DataFrame({"batch_size": [1, 64, 1, 64], "kind": ["plain", "plain", "chain:k=4",
                                                                   "chain:k=4"],
                                "seconds": [1.0, 1.0, 2.0, 2.0], "tau": [1.0, 1.0, 4.0, 4.0]}))
    fast = bandit_cost(sd)
    assert fast.kinds == ["plain"] and fast.seconds("plain", [1, 7, 64]).tolist() == [0.5] * 3
    assert bandit_cost(FLAT) is None and bandit_cost(MEASURED) is None  # no SD arm measured
    assert bandit_cost(StepCost(pd.concat([sd.table, MEASURED.table[MEASURED.table["kind"] == "prefill"]]))
                       ).seconds("prefill", [8]).tolist() == [0.03]
    steps = [[_g(3, 9), _g(2, 2), _g(7, 1)], [_g(4, 4), _g(1, 12), _g(5, 6)]]
    plain = remedy_steps(steps, 2, FLAT, 12)
    tlt = remedy_steps(steps, 2, fast, 12)
    assert (tlt["rollout_s"] * 2).tolist() == plain["rollout_s"].tolist()
    assert tlt["groups_trained"].tolist() == plain["groups_trained"].tolist()


def test_one_step_async_overlaps_the_next_rollout_with_the_update_and_charges_stale_updates():
    """Step 0 samples its own rollout, then the next beside its update; every later step the
    next rollout beside its update, which trains on stale tokens (x 5/4); the rollout after
    the last is the rollouts' mean."""
    from workbench.cluster.composed import STALE_UPDATE, async_step_times, stale_update
    rollout, update = [1.0, 3.0, 2.0], [2.0, 2.0, 0.5]
    assert STALE_UPDATE == 1.25
    assert async_step_times(rollout, update).tolist() == [1 + 3, max(2, 2.5), max(2, 0.625)]
    assert async_step_times(rollout, update, stale=1.0).tolist() == [4.0, 2.0, 2.0]
    assert stale_update([2.0, 2.0], [0.0, 0.3]).tolist() == [2.0, 2.5]
    with pytest.raises(ValueError, match=r"one value per step.*\(3,\) and \(2,\)"):
        async_step_times(rollout, update[:2])
    with pytest.raises(ValueError, match="at least 1; got 0.5"):
        async_step_times(rollout, update, stale=0.5)
