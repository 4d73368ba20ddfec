"""The pruning study's, the retraining study's and the Minitron pipeline's metrics are read off
their tables, and a table without a row they need is refused naming it
(``compress.study_metrics``)."""
import types

import pandas as pd
import pytest

from workbench.compress.studies import RETRAININGS, token_savings
from workbench.compress.study_metrics import (best_compressed_drafter, drafter_metrics,
                                              ranking_metrics, retraining_metrics, speed_metrics,
                                              stage_metrics, width_depth_metrics,
                                              width_depth_test)


def _ablation():
    return pd.DataFrame({"ranking": ["activation l2/mean", "activation l1/max", "weight magnitude",
                                     "random"],
                         "lm_loss": [0.30, 0.28, 0.35, 1.2], "lm_loss_sd": [0, 0, 0, 0.3]})


def test_ranking_metrics_read_each_ranking():
    m = ranking_metrics(_ablation())
    assert m == {"loss_after_prune_l2mean": 0.30, "loss_after_prune_best_activation": 0.28,
                 "loss_after_prune_random": 1.2, "loss_after_prune_random_sd": 0.3,
                 "loss_after_prune_magnitude": 0.35}
    # rankings=... may leave a built-in out: its metrics are left out, the others stay
    assert ranking_metrics(_ablation().iloc[[0, 2]]) == {
        "loss_after_prune_l2mean": 0.30, "loss_after_prune_best_activation": 0.30,
        "loss_after_prune_magnitude": 0.35}


def test_width_against_depth_is_paired_over_seeds():
    per_seed = pd.DataFrame({"kind": ["width"] * 6 + ["depth"] * 6,
                             "stage": (["after pruning"] * 3 + ["after distillation"] * 3) * 2,
                             "seed": [0, 1, 2] * 4,
                             "lm_loss": [0.29] * 3 + [0.24, 0.25, 0.26] + [0.5] * 3
                             + [0.27, 0.27, 0.29]})
    test = width_depth_test(per_seed)
    assert test["diff"] == pytest.approx(-0.0267, abs=1e-4) and test["significant"]
    summary = pd.DataFrame({"kind": ["width", "width", "depth", "depth"],
                            "stage": ["after pruning", "after distillation"] * 2,
                            "lm_loss": [0.29, 0.25, 0.5, 0.277], "lm_loss_sd": [0, .01, 0, .012],
                            "lm_loss_lo": [0.29, 0.24, 0.5, 0.27],
                            "lm_loss_hi": [0.29, 0.26, 0.5, 0.29]})
    m = width_depth_metrics(summary, test)
    assert m["loss_width_pruned"] == 0.29 and m["loss_depth_distilled"] == 0.277
    assert m["loss_depth_distilled_hi"] == 0.29 and m["loss_width_distilled_sd"] == 0.01
    assert m["width_minus_depth_loss"] == test["diff"] and m["width_depth_differ_significant"]
    with pytest.raises(ValueError, match=r"no distilled \['depth'\] student"):
        width_depth_test(per_seed[per_seed["kind"] == "width"])


def test_speed_metrics_read_the_saturation_batch():
    speed = pd.DataFrame({"batch": [1, 1, 128, 128], "model": ["teacher", "width"] * 2,
                          "ratio": [1.0, 1.5, 1.0, 1.3]})
    assert speed_metrics(speed, 128, {"width": "width"}) == {"throughput_ratio_width": 1.3}
    with pytest.raises(ValueError, match=r"no batch 64; batches: \[1, 128\]"):
        speed_metrics(speed, 64, {"width": "width"})
    with pytest.raises(ValueError, match="no row 'depth'"):
        speed_metrics(speed, 128, {"depth": "depth"})
    # the batch's share of disturbed repeats, where decode_throughput measured it
    disturbed = speed.assign(disturbed_share=[0.0, 0.0, 1 / 3, 1 / 3])
    assert speed_metrics(disturbed, 128, {"width": "width"}) == {
        "throughput_ratio_width": 1.3, "throughput_disturbed_share": pytest.approx(1 / 3)}


def test_stage_and_drafter_metrics_of_the_pipeline():
    table = pd.DataFrame({"model": ["teacher", "w50"], "params": [100, 50],
                          "accuracy": [0.42, 0.39], "accuracy_sd": [0.0, 0.01],
                          "accuracy_lo": [0.37, 0.35], "accuracy_hi": [0.47, 0.44],
                          "speedup_b128": [1.0, 1.3], "ideal_speedup": [1.0, 1.5]})
    stages = [types.SimpleNamespace(name="w50", params=50)]
    m = stage_metrics(table, stages, 128)
    assert m == {"params_teacher": 100, "accuracy_teacher": 0.42, "params_w50": 50,
                 "accuracy_w50": 0.39, "accuracy_w50_sd": 0.01, "accuracy_w50_lo": 0.35,
                 "accuracy_w50_hi": 0.44, "throughput_ratio_w50": 1.3, "ideal_speedup_w50": 1.5}
    shares = table.assign(disturbed_share_b128=0.25)  # compare_models' column, per batch
    assert stage_metrics(shares, stages, 128)["throughput_disturbed_share"] == 0.25
    bridge = pd.DataFrame({"drafter": ["compressed w50", "compressed d50", "small LM"],
                           "tau": [4.5, 4.4, 2.6], "speedup": [0.84, 1.12, 0.98],
                           "identical": [True, True, True]})
    d = drafter_metrics(bridge, "w50", ["w50", "d50"])
    assert d["best_compressed_drafter"] == "d50" and d["speedup_best_compressed_drafter"] == 1.12
    assert d["speedup_compressed_drafter"] == 0.84 and d["accept_len_drafter_d50"] == 4.4
    assert d["speedup_small_lm_drafter"] == 0.98 and d["lossless"] is True
    assert "speedup_small_lm_drafter" not in drafter_metrics(bridge.iloc[:2], "w50", ["w50"])
    with pytest.raises(ValueError, match="no compressed drafter"):
        drafter_metrics(bridge.iloc[2:], "w50", [])


def _finals(runs):
    """``retraining_summary``'s table of ``runs`` (and the teacher): run i's figures i + .1."""
    rows = [{"run": r, "lm_loss": i + .1, "lm_loss_sd": i + .2, "accuracy": i + .3,
             "accuracy_sd": i + .4, "accuracy_lo": i + .5, "accuracy_hi": i + .6}
            for i, r in enumerate(runs)]
    return pd.DataFrame(rows + [{"run": "teacher", "lm_loss": 9.1, "lm_loss_sd": 0.0,
                                 "accuracy": 9.3, "accuracy_sd": 0.0, "accuracy_lo": 9.2,
                                 "accuracy_hi": 9.4}])


def _curves(runs):
    """Two seeds of two evaluations per run; scratch ends at 2.0, KD reaches it half way."""
    return pd.DataFrame([{"run": r, "seed": seed, "step": step, "tokens": 100 * step,
                          "lm_loss": {RETRAININGS[0]: 3 - step * 2}.get(r, 4 - step * 2)}
                         for r in runs for seed in (0, 1) for step in (0, 1)])


def test_retraining_metrics_name_every_run_that_ran():
    tests = {"kd_minus_ce_accuracy": 0.05, "kd_beats_ce_significant": False}
    m = retraining_metrics(_finals(RETRAININGS), tests, _curves(RETRAININGS), params_teacher=100,
                           params_student=50, eval_problems=400, seeds=3)
    savings = token_savings(_curves(RETRAININGS))
    assert savings["tokens_kd_to_scratch_loss"] == 50 and savings["tokens_budget"] == 100
    expected = {"params_teacher": 100, "params_student": 50, "accuracy_teacher": 9.3,
                "loss_teacher": 9.1, "eval_problems": 400, "seeds": 3}
    for i, name in enumerate(("student_kd", "student_kd_hidden", "student_ce", "scratch")):
        expected.update({f"accuracy_{name}": i + .3, f"accuracy_{name}_sd": i + .4,
                         f"accuracy_{name}_lo": i + .5, f"accuracy_{name}_hi": i + .6,
                         f"loss_{name}": i + .1, f"loss_{name}_sd": i + .2})
    expected.update(**tests, **savings)
    assert m == expected and list(m) == list(expected)  # metrics.json's order too
    # without layer pairs the hidden-state run is not run: its metrics are left out
    runs = [RETRAININGS[0], RETRAININGS[2], RETRAININGS[3]]
    m = retraining_metrics(_finals(runs), {}, _curves(runs), params_teacher=100,
                           params_student=50, eval_problems=400, seeds=3)
    assert not any("kd_hidden" in k for k in m) and m["loss_student_ce"] == 1.1
    with pytest.raises(ValueError, match="the retraining table has no row 'teacher'"):
        retraining_metrics(_finals(runs).iloc[:-1], {}, _curves(runs), params_teacher=100,
                           params_student=50, eval_problems=400, seeds=3)


def test_the_best_compressed_drafter_is_the_fastest_compressed_one():
    bridge = pd.DataFrame({"drafter": ["compressed w50", "compressed d50", "small LM"],
                           "tau": [4.5, 4.4, 2.6], "speedup": [0.84, 1.12, 1.5]})
    best = best_compressed_drafter(bridge)  # the small LM is faster, but not compressed
    assert best.name == "compressed d50" and best["tau"] == 4.4 and best["speedup"] == 1.12
    with pytest.raises(ValueError, match=r"no compressed drafter; rows: \['small LM'\]"):
        best_compressed_drafter(bridge.iloc[2:])
