"""Cluster what-ifs and notebook 10's figures: the sweep over N, tau and tail what-ifs, the
explorer following its sliders, and the figures drawing their tables (no model)."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from workbench.cluster import StepCost, UpdateCost, fit_lengths  # noqa: E402
from workbench.cluster.validation import VALIDATION_COLUMNS  # noqa: E402
from workbench.cluster.whatif import (scaling_metrics, scaling_table,  # noqa: E402
                                      simulate_seconds, whatif_prediction, with_tau)
from workbench.viz import cluster as cviz  # noqa: E402

from .helpers.tables import lognormal_trace  # noqa: E402
from .helpers.figures import artist, bars  # noqa: E402

# plain: 10 ms at batch 1 to 20 ms at 16; chain:k=4: 20 ms to 60 ms, 3 tokens a row
COST = StepCost(pd.DataFrame({"batch_size": [1, 16, 1, 16], "kind": ["plain"] * 2 +
                              ["chain:k=4"] * 2, "seconds": [0.01, 0.02, 0.02, 0.06],
                              "tau": [1.0, 1.0, 3.0, 3.0]}))
SETTING = dict(threshold=4, strategy="chain:k=4", update=UpdateCost(0.5, 0.05),
               drafter_step_s=0.05)


def test_the_sweep_over_n_has_a_row_per_n_and_the_idle_fraction_grows_with_it():
    table = scaling_table(lognormal_trace(), COST, per_worker=8, workers=[8, 64, 512], **SETTING)
    assert table["workers"].tolist() == [8, 64, 512]
    assert (table["requests"] == table["workers"] * 8).all()
    # more workers, the longer the slowest one's tail against the mean: more idle
    assert table["idle_fraction_plain"].is_monotonic_increasing
    assert (table["update_s"] == [0.5 + 0.05 * np.log2(n) for n in (8, 64, 512)]).all()
    assert (table["e2e_speedup"] > 1).all() and (table["sim_seconds"] > 0).all()
    assert {"makespan_bandit_s", "sd_speedup_bandit", "gpu_hours_tlt"} <= set(table.columns)
    m = scaling_metrics(table, 64)
    row = table.set_index("workers").loc[64]
    assert m["predicted_speedup_64"] == row["e2e_speedup"]
    assert m["predicted_idle_fraction_64"] == row["idle_fraction_plain"]
    assert m["predicted_rollout_speedup_64"] == row["sd_speedup"]
    with pytest.raises(ValueError, match=r"the sweep has no row at N=128; its N: \[8, 64, 512\]"):
        scaling_metrics(table, 128)
    model = fit_lengths(lognormal_trace().requests["response_tokens"])
    assert len(scaling_table(model, COST, per_worker=4, workers=[8, 16])) == 2
    assert 0 < simulate_seconds(model, COST, workers=64, per_worker=8) < 10


def test_draws_average_the_steps_and_the_speedups_are_ratios_of_the_means():
    one = [scaling_table(lognormal_trace(), COST, 8, [16], seed=s, **SETTING) for s in (3, 4)]
    both = scaling_table(lognormal_trace(), COST, 8, [16], seed=3, draws=2, **SETTING).iloc[0]
    for column in ("step_s_plain", "step_s_tlt", "idle_fraction_plain", "drafter_steps"):
        assert both[column] == pytest.approx((one[0][column][0] + one[1][column][0]) / 2)
    assert both["e2e_speedup"] == pytest.approx(both["step_s_plain"] / both["step_s_tlt"])
    assert both["draws"] == 2 and both["requests"] == 16 * 8


def test_tau_and_tail_what_ifs_move_the_prediction_the_right_way():
    better = with_tau(COST, "chain:k=4", 4.0)
    assert better.tau("chain:k=4", [1, 16]).tolist() == [4.0, 4.0]
    assert better.seconds("chain:k=4", [1]) == COST.seconds("chain:k=4", [1])
    with pytest.raises(ValueError, match=r"no step costs for kind 'tree:k=4'"):
        with_tau(COST, "tree:k=4", 3.0)
    model = fit_lengths(lognormal_trace().requests["response_tokens"])
    assert model.with_tail(2.0).params == {**model.params, "sigma": 2.0}
    run = lambda **kw: whatif_prediction(model, COST, "chain:k=4", **{
        "tail": model.tail, "workers": 32, "per_worker": 8, "threshold": 4, "tau": 3.0, **kw}
    ).summary()
    assert run(tau=4.0)["makespan_tlt_s"] < run()["makespan_tlt_s"]
    assert run(tail=2 * model.tail)["idle_fraction_plain"] > run()["idle_fraction_plain"]
    assert run(threshold=0)["sd_speedup"] == 1.0


def test_the_figures_draw_their_tables():
    table = scaling_table(lognormal_trace(), COST, per_worker=8, workers=[8, 64], **SETTING)
    fig = cviz.scaling_curves(table, label="toy")
    assert len(fig.axes) == 3
    speedup = [line for line in fig.axes[2].lines if line.get_label() == "TLT, threshold rule"]
    assert speedup[0].get_ydata().tolist() == table["e2e_speedup"].tolist()
    lengths = lognormal_trace().requests["response_tokens"]
    fits = [fit_lengths(lengths), fit_lengths(lengths, "pareto")]
    fig = cviz.length_fit(lengths, fits)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[1] == f"lognormal fit (KS {fits[0].ks:.3f})" and "pareto" in labels[2]
    validation = pd.DataFrame([["seed", "sim", 4, 8, 1, 3, 1.0, 1.1, 0.1, 0.0, 0.2, 0.8, 0.8, 0.0],
                               ["ray-2", "wall", 2, 8, 2, 3, 2.0, 1.8, -0.1, -0.2, 0.0, 1.5, 1.5,
                                0.0]],
                              columns=list(VALIDATION_COLUMNS))
    fig = cviz.validation_scatter(validation)
    ax = fig.axes[0]
    assert [c.get_label() for c in ax.collections] == ["sim clock (local backend)",
                                                        "wall clock (Ray actors)"]
    diagonal = ax.lines[0]
    assert diagonal.get_label() == "y = x"
    assert list(diagonal.get_xdata()) == list(diagonal.get_ydata()) == [0, pytest.approx(2.2)]


def explorer(**kw):
    model = fit_lengths(lognormal_trace().requests["response_tokens"])
    predict = lambda **s: whatif_prediction(model, COST, "chain:k=4", per_worker=8,
                                            drafter_step_s=0.05, **s)
    args = dict(tail=(model.tail, 0.2, 2.0), workers=[8, 16, 32], start_workers=8,
                max_threshold=8, threshold=4, tau=(3.0, 1.0, 5.0))
    return cviz.ClusterWhatIf(predict, **{**args, **kw})


def test_the_explorer_predicts_again_when_a_slider_moves():
    ex = explorer()
    assert len(artist(ex.figure, "busy-plain").get_xdata()) == 8
    assert "<b>makespan</b>" in ex.panel.value and "drafter steps" in ex.panel.value
    ex.controls["workers"].value = 32
    assert len(artist(ex.figure, "busy-plain").get_xdata()) == 32 and ex.redraws == 2
    before = bars(ex.figure, "gpu-hours-tlt")[0].get_height()
    ex.controls["tau"].value = 5.0
    assert bars(ex.figure, "gpu-hours-tlt")[0].get_height() < before
    ex.controls["threshold"].value = 0
    tlt, plain = artist(ex.figure, "busy-tlt"), artist(ex.figure, "busy-plain")
    assert tlt.get_ydata().tolist() == plain.get_ydata().tolist()
    assert ex.png()[:4] == b"\x89PNG"


def test_the_explorer_refuses_bad_settings():
    with pytest.raises(ValueError, match=r"start_workers \(one of workers\) must be one of"):
        explorer(start_workers=64)
    with pytest.raises(ValueError, match=r"threshold \(0 to max_threshold 8\) must be"):
        explorer(threshold=9)
    with pytest.raises(ValueError, match=r"tau low must be"):
        explorer(tau=(3.0, 0.0, 5.0))
