"""RL figures draw what the history tables hold (synthetic tables, no training)."""
import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from workbench.rl.ablation.result import Ablation, amdahl  # noqa: E402
from workbench.rl import GRPOConfig  # noqa: E402
from workbench.viz import rl as rlviz  # noqa: E402


def _history():
    rows = []
    for v, roll, acc in (("baseline", 2.0, np.nan), ("static_sd", 1.0, 4.0), ("tlt", 0.8, 4.5)):
        for seed in (0, 1):
            for step in range(3):
                rows.append({"variant": v, "seed": seed, "step": step, "rollout_s": roll,
                             "update_sim_s": 0.5, "step_s": roll + 0.5 + (0.1 if v == "tlt" else 0),
                             "reward": 0.4 + 0.1 * step + 0.05 * seed, "accept_len": acc,
                             "kl_start": 0.01 * step, "idle_fraction": 0.3,
                             "wasted_fraction": 0.25})
    return pd.DataFrame(rows)


def test_per_variant_measures_follow_design():
    h = _history()
    pv = Ablation(h, pd.DataFrame()).per_variant().set_index("variant")
    assert pv.loc["baseline", "rollout_fraction"] == pytest.approx(2.0 / 2.5)
    assert pv.loc["tlt", "e2e_speedup"] == pytest.approx(2.5 / 1.4)
    assert pv.loc["tlt", "rollout_speedup"] == pytest.approx(2.5)
    assert pv.loc["tlt", "amdahl_prediction"] == pytest.approx(amdahl(0.8, 2.5))
    assert amdahl(0.8, 2.5) == pytest.approx(1 / (0.2 + 0.8 / 2.5))
    assert pv.loc["tlt", "reward_final_sd"] == pytest.approx(np.std([0.6, 0.65], ddof=1))


def test_rl_figures_draw_the_tables():
    h = _history()
    label = rlviz.rl_label(GRPOConfig(), 3)
    assert "P=16 x G=8" in label and "3 RL steps" in label
    fig = rlviz.step_time_breakdown(h, label=label)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights[:3] == pytest.approx([2.0, 1.0, 0.8])       # rollout bars, one per variant
    assert heights[6:] == pytest.approx([0.0, 0.0, 0.1])       # drafter overrun on top
    fig = rlviz.reward_curves(h)
    line = fig.axes[0].lines[0]
    assert list(line.get_ydata()) == pytest.approx([0.425, 0.525, 0.625])
    fig = rlviz.acceptance_over_steps(h, variants=("static_sd", "tlt"))
    assert [list(ln.get_ydata()) for ln in fig.axes[0].lines] == [[4.0] * 3, [4.5] * 3]
    pv = Ablation(h, pd.DataFrame()).per_variant()
    fig = rlviz.speedup_vs_amdahl(pv)
    assert len(fig.axes[0].patches) == 4                       # 2 variants x (measured, Amdahl)
    choices = pd.DataFrame({"bucket": ["1", "1", "2-3"], "arm": ["chain:k=2", "chain:k=4",
                                                               "chain:k=4"],
                            "pulls": [3, 7, 5], "explored": [1, 1, 1],
                            "tokens_per_s": [100.0, 200.0, 150.0]})
    fig = rlviz.bandit_choices(choices)
    assert sorted(p.get_height() for p in fig.axes[0].patches if p.get_height() > 0) == [3, 5, 7]
    empty = rlviz.bandit_choices(choices.iloc[:0])
    assert "never switched on" in empty.axes[0].texts[0].get_text()


def test_heldout_accuracy_curve_and_metrics_compare_tlt_by_default():
    h = _history()
    evals = pd.DataFrame([{"variant": v, "seed": s, "step": step, "accuracy": acc + 0.1 * s}
                          for v in ("baseline", "tlt") for s in (0, 1)
                          for step, acc in ((0, 0.4), (2, 0.6), (3, 0.5))])
    fig = rlviz.heldout_accuracy(evals, label="L")
    line = fig.axes[0].lines[0]
    assert list(line.get_xdata()) == [0, 2, 3]
    assert list(line.get_ydata()) == pytest.approx([0.45, 0.65, 0.55])
    assert fig.axes[0].get_ylabel() == "held-out greedy accuracy"
    m = Ablation(h, evals).metrics()
    assert m["compared_variant"] == "tlt" and m["e2e_speedup_tlt"] == pytest.approx(2.5 / 1.4)
    assert m["reward_final_tlt"] == pytest.approx(0.625) and "reward_final_static_sd" not in m
    assert m["accuracy_start"] == pytest.approx(0.45)
    assert m["accuracy_final_baseline"] == pytest.approx(0.55)
    assert m["accuracy_best_baseline"] == pytest.approx(0.65)
    static = Ablation(h, evals).metrics("static_sd")
    assert static["compared_variant"] == "static_sd" and "e2e_speedup_tlt" not in static
    assert static["e2e_speedup_static_sd"] == pytest.approx(2.5 / 1.5)
    assert static["reward_final_sd_static_sd"] == pytest.approx(np.std([0.6, 0.65], ddof=1))


def test_paired_median_speedup_shrugs_off_one_stalled_step():
    h = _history()
    stalled = (h["variant"] == "baseline") & (h["seed"] == 0) & (h["step"] == 1)
    h.loc[stalled, "step_s"] += 30.0          # the machine stalled the baseline once
    ab = Ablation(h, pd.DataFrame())
    ratios = ab.paired_speedups("tlt")
    assert len(ratios) == 6 and ratios.max() == pytest.approx(32.5 / 1.4)
    m = ab.metrics()
    assert m["e2e_speedup_tlt"] > 5                                # the sum carries the stall
    assert m["e2e_speedup_median_tlt"] == pytest.approx(2.5 / 1.4)  # the paired median does not
    assert m["e2e_speedup_q25_tlt"] == pytest.approx(2.5 / 1.4)


def test_engine_label_says_where_the_adaptive_engine_may_speculate():
    learned = rlviz.engine_label(4, None, 0.02)
    assert learned == ("static k 4 | adaptive engine: learns where SD pays, exploring <= 2% of "
                       "decode time in runs of 6, 3 settling")
    capped = rlviz.engine_label(2, 8, 0.5, drafter_delay_s=0.002, explore_run=1, settle=0)
    assert "no SD above batch 8" in capped and "exploring <= 50%" in capped
    assert "one step at a time" in capped
    assert capped.endswith("hostile machine: +2 ms per drafted depth")
