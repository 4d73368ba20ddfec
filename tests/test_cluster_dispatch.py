"""Dynamic dispatch on the cluster simulator (workbench.cluster.dispatch, seer_check): tiny
hand-built lengths whose answer is computed by hand in each test, at a flat step cost of 1 s
(no prefill) so that a request of n tokens alone on its worker ends at n s, or at a step
cost of b s for b live rows where a move can pay."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.cluster.cost import StepCost
from workbench.cluster.dispatch import (POLICIES, SEER_SETTINGS, predicted_lengths,
                                        prefill_per_token, seer_answer, seer_metrics,
                                        seer_whatif, simulate_dispatch)
from workbench.cluster.remedies import run_rollout
from workbench.cluster.simulate import Layout, simulate_rollout

FLAT = StepCost(pd.DataFrame({"batch_size": [1, 64], "kind": "plain", "seconds": 1.0, "tau": 1.0}))
LINEAR = StepCost(pd.DataFrame({"batch_size": [1, 64], "kind": "plain",  # b rows: b seconds
                                "seconds": [1.0, 64.0], "tau": 1.0}))
MEASURED = StepCost(pd.DataFrame({
    "batch_size": [1, 8] * 3, "kind": ["plain", "plain", "prefill", "prefill",
                                       "chain:k=4", "chain:k=4"],
    "seconds": [0.01, 0.02, 0.005, 0.03, 0.015, 0.04], "tau": [1, 1, 1, 1, 2.5, 2.0]}))


def test_with_a_cap_the_next_request_goes_to_the_first_worker_to_free():
    tokens = [5, 2, 9, 3]  # one row per worker: 0 and 1 start; 1 frees at 2, 0 at 5
    run = simulate_dispatch(tokens, 2, FLAT, max_batch=1, policy="as_drawn")
    assert run.worker.tolist() == [0, 1, 1, 0]
    assert run.join.tolist() == [0, 0, 2, 5] and run.end.tolist() == [5, 2, 11, 8]
    static = simulate_dispatch(tokens, 2, FLAT, max_batch=1)  # i to worker i mod 2, queued
    assert static.worker.tolist() == [0, 1, 0, 1] and static.makespan == 14.0
    assert run.idle_fraction() == pytest.approx(1 - 19 / 22)


def test_longest_first_shortens_the_step_and_equals_static_when_all_lengths_are_equal():
    tokens = [1, 1, 1, 8]
    drawn = simulate_dispatch(tokens, 2, FLAT, 1, "as_drawn")
    assert drawn.makespan == 9.0  # the 8 starts at 1, behind a short one
    first = simulate_dispatch(tokens, 2, FLAT, 1, "longest_first", predicted=tokens)
    assert first.makespan == 8.0 and first.join[3] == 0.0
    same = [4] * 6
    noisy = predicted_lengths(same, noise=0.5, seed=3)
    for policy in ("as_drawn", "longest_first"):
        for cap in (1, 2, None):
            run = simulate_dispatch(same, 2, FLAT, cap, policy, predicted=noisy)
            assert run.makespan == simulate_dispatch(same, 2, FLAT, cap).makespan
    # Seer's harness schedule: per-worker queues dealt longest first
    queues = simulate_dispatch([8, 1, 1, 1, 8, 1], 2, FLAT, 1, "longest_first",
                               predicted=[8, 1, 1, 1, 8, 1], schedule_queues=True)
    assert queues.worker.tolist() == [0, 0, 1, 0, 1, 1] and queues.makespan == 10.0


def test_divided_moves_a_running_request_only_when_both_workers_end_sooner():
    tokens = [10, 10, 10]  # longest first, dealt: worker 0 runs requests 0 and 2, worker 1 one
    kw = dict(max_batch=2, policy="divided", predicted=tokens, prompt_tokens=0)
    # alone: worker 0 ends at 20 (2 rows, 2 s a step); worker 1 idles from 10. Moving request
    # 0 at 10 (5 tokens done): worker 0 ends at 15, worker 1 at 10 + 0.5 x 5 + 5 = 17.5
    run = simulate_dispatch(tokens, 2, LINEAR, prefill_per_token=0.5, **kw)
    assert run.moved.tolist() == [True, False, False] and run.worker.tolist() == [1, 1, 0]
    assert run.reprefill_s == pytest.approx(2.5)
    assert run.end.tolist() == pytest.approx([17.5, 10.0, 15.0])
    assert run.busy.tolist() == pytest.approx([10 + 5, 2.5 + 10 + 5])  # re-prefill: worker 1
    # at 1.5 s a context token the move ends worker 1 at 22.5 > 20: nothing moves
    stay = simulate_dispatch(tokens, 2, LINEAR, prefill_per_token=1.5, **kw)
    assert stay.moves == 0 and stay.makespan == 20.0 and stay.reprefill_s == 0.0
    # the prompt is re-prefilled too: 5 prompt tokens make the cheap move cost 5 s, too much
    assert simulate_dispatch(tokens, 2, LINEAR, prefill_per_token=0.5,
                             **{**kw, "prompt_tokens": 6}).moves == 0
    # a step that costs as much for one row as for two: the tail moves nowhere
    assert simulate_dispatch(tokens, 2, FLAT, prefill_per_token=0.0, **kw).moves == 0


def test_a_move_waits_for_the_sources_step_in_flight():
    # predicted 10, 9, 8: worker 0 runs requests 0 and 2, worker 1 request 1, which ends at
    # 3, in worker 0's second 2-row step (2 to 4): request 0 leaves at 4, 2 tokens done
    tokens = [10, 3, 10]
    run = simulate_dispatch(tokens, 2, LINEAR, 2, "divided", predicted=[10, 9, 8],
                            prompt_tokens=0, prefill_per_token=0.1)
    assert run.moved.tolist() == [True, False, False]
    assert run.reprefill_s == pytest.approx(0.2)  # 2 tokens done by 4
    assert run.end.tolist() == pytest.approx([4.2 + 8, 3.0, 4 + 8])


def test_the_static_default_gives_the_existing_simulators_numbers():
    tokens = np.random.default_rng(0).integers(1, 300, 37)
    for cap in (None, 3):
        mine, theirs = simulate_dispatch(tokens, 4, MEASURED, cap), run_rollout(tokens, 4, MEASURED, cap)
        assert mine.end.tolist() == theirs.end.tolist() and mine.makespan == theirs.makespan
    per = int(np.ceil(len(tokens) / 4))
    response = np.zeros(4 * per, np.int64)
    response[:len(tokens)] = tokens
    lay = Layout(response.reshape(per, 4).T.copy(), np.zeros((4, per), np.int64))
    for rule, theirs in (("plain", "threshold"), ("bandit", "bandit")):
        t = simulate_rollout(lay, MEASURED, rule=theirs)
        mine = simulate_dispatch(tokens, 4, MEASURED, rule=rule)
        assert mine.makespan == t.makespan_s
        ends = t.requests.set_index(["worker", "prompt_id"])["end_s"]
        assert mine.end.tolist() == [ends[(i % 4, i // 4)] for i in range(len(tokens))]


def test_predictors_and_bad_input():
    assert predicted_lengths([2, 4, 7], ["a", "a", "b"], "siblings").tolist() == \
        pytest.approx([4, 2, 13 / 3])
    assert predicted_lengths([3, 5]).tolist() == [3, 5]
    assert prefill_per_token(MEASURED, 10) == pytest.approx(0.0005)
    with pytest.raises(ValueError, match="predicted="):
        simulate_dispatch([1, 2], 1, FLAT, policy="longest_first")
    with pytest.raises(ValueError, match="policy"):
        simulate_dispatch([1, 2], 1, FLAT, policy="seer")
    with pytest.raises(ValueError, match="no prefill"):
        simulate_dispatch([1, 2], 1, FLAT, policy="divided", predicted=[1, 2])
    with pytest.raises(ValueError, match="groups="):
        predicted_lengths([1, 2], predictor="siblings")
    assert set(POLICIES) == {"static", "as_drawn", "longest_first", "divided"}


def test_the_whatif_sets_seers_scheduling_tlt_and_both_beside_static_at_each_n():
    from workbench.cluster.trace import Trace
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(40), 4)
    lengths = np.repeat(rng.lognormal(4, 1, 40), 4) * rng.uniform(0.7, 1.3, 160)
    trace = Trace(pd.DataFrame({"group": groups.astype(str), "prompt_tokens": 12,
                                "response_tokens": np.clip(lengths, 1, 500).astype(int)}),
                  MEASURED.table)
    table = seer_whatif(trace, MEASURED, per_worker=8, max_batch=2, workers=[2, 8], draws=2,
                        samples_per_prompt=4, update=0.1)
    assert table["workers"].tolist() == [2, 8] and (table["requests"] == [16, 64]).all()
    assert table["speedup_static"].tolist() == [1.0, 1.0]
    for name in SEER_SETTINGS:
        assert (table[f"makespan_{name}_s"] > 0).all()
    # longest first from the siblings beats the static layout here, and TLT's arm helps both
    assert (table["speedup_seer_divided"] > 1).all()
    assert (table["makespan_tlt+seer_divided_s"] <= table["makespan_seer_divided_s"]).all()
    single = [seer_whatif(trace, MEASURED, 8, 2, [8], 4, update=0.1, seed=k) for k in (0, 1)]
    assert table["makespan_seer_divided_s"].iloc[1] == pytest.approx(  # the mean of 2 draws
        np.mean([t["makespan_seer_divided_s"].iloc[0] for t in single]))
    metrics = seer_metrics(table, 8)
    assert metrics["predicted_speedup_seer_divided_8"] == table["speedup_seer_divided"].iloc[1]
    assert "predicted_speedup_tlt+seer_divided_8" in metrics and "predicted_moves_seer_divided_8" in metrics
    said = seer_answer(table, 8)
    assert said.startswith("N=8: ") and "TLT beside Seer" in said
    with pytest.raises(ValueError, match="no row at N=64"):
        seer_answer(table, 64)


def test_a_seer_runs_rollouts_are_replayed_and_their_error_reported(tokenizer, tmp_path,
                                                                    tick_clock):
    from workbench.cluster.seer_check import check_seer, seer_check_metrics
    from workbench.rl import GRPOConfig
    from workbench.rl.ablation.runner import run_ablation
    from workbench.tasks import Problem

    from .helpers.models import tiny_model
    grpo = GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=2, max_new_tokens=12,
                           lr=5e-2, workers=2, seed=1, temperature=1.0, max_batch_size=2)
    problems = [Problem(prompt=f"q{i}?" + "x" * (i * 7 % 5), answer="a", uid=i) for i in range(4)]
    variants = ["baseline", "seer_schedule", "seer_divided"]
    ablation = run_ablation(tiny_model("qwen2", tokenizer), tokenizer, problems, grpo, 2,
                            variants=variants, seeds=[0], progress=False,
                            reward=lambda p, c, a: float(len(c) % 3 == 0))
    ablation.save_timelines(tmp_path / "timelines")
    for v in variants[1:]:
        check = check_seer(tmp_path, v, samples_per_prompt=2)
        assert len(check.steps) == 2 and (check.steps["measured_s"] > 0).all()
        assert abs(check.error) < 0.25, check.steps  # each step's replay on the sim clock
        assert check.metrics()[f"seer_sim_error_{v}"] == check.error
    assert seer_check_metrics(tmp_path, ["seer_divided"]) == {}  # no baseline: nothing read
    with pytest.raises(ValueError, match="no saved timelines of 'baseline'"):
        check_seer(tmp_path / "nothing")


def test_stragglers_slow_the_same_workers_as_in_the_static_simulator():
    tokens = np.random.default_rng(4).integers(1, 200, 24)
    lay = Layout(tokens.reshape(6, 4).T.copy(), np.zeros((4, 6), np.int64))
    t = simulate_rollout(lay, MEASURED, spread=0.3, seed=5)
    assert simulate_dispatch(tokens, 4, MEASURED, spread=0.3, seed=5).makespan == t.makespan_s
    # a slow worker takes fewer requests from the shared queue
    from workbench.cluster.simulate import worker_speeds
    speed = worker_speeds(2, 1.0, 9)  # worker 1 about 2.8 times slower
    fast = int(np.argmin(speed))
    assert speed.max() / speed.min() > 2
    run = simulate_dispatch([5] * 12, 2, FLAT, 1, "as_drawn", spread=1.0, seed=9)
    assert (run.worker == fast).sum() > 6 and run.makespan < simulate_dispatch(
        [5] * 12, 2, FLAT, 1, spread=1.0, seed=9).makespan


def test_the_answer_names_the_fastest_and_what_each_adds_beside_the_other():
    table = pd.DataFrame({"workers": [64, 1024], "speedup_tlt": [1.06, 1.2],
                          "speedup_seer_schedule": [1.0, 1.5], "speedup_seer_divided": [1.0, 1.5],
                          "speedup_tlt+seer_divided": [1.0602, 1.8]})
    assert seer_answer(table, 64).startswith("N=64: TLT and TLT with Seer tie for fastest")
    assert "TLT beside Seer still pays (1.06x), Seer beside TLT adds nothing" in seer_answer(table, 64)
    assert seer_answer(table, 1024).startswith("N=1024: TLT with Seer is fastest")
    assert "Seer beside TLT still pays (1.50x)" in seer_answer(table, 1024)
