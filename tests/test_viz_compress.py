"""Compression figures draw what the tables hold (synthetic tables, no models)."""
import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from workbench.viz import compress as cviz  # noqa: E402


def _importance_tables(layers=3, heads=4, neurons=8, channels=16):
    rng = np.random.default_rng(0)
    return {"heads": pd.DataFrame([{"layer": i, "head": h, "score": rng.random()}
                                   for i in range(layers) for h in range(heads)]),
            "neurons": pd.DataFrame([{"layer": i, "neuron": n, "score": rng.random()}
                                     for i in range(layers) for n in range(neurons)]),
            "channels": pd.DataFrame({"channel": range(channels),
                                      "score": rng.random(channels)})}


def test_importance_heatmaps_show_each_layer_over_its_own_maximum():
    fig = cviz.importance_heatmaps(_importance_tables(), label="16 texts")
    heads_img = fig.axes[0].images[0].get_array()
    assert heads_img.shape == (3, 4)
    np.testing.assert_allclose(np.asarray(heads_img).max(axis=1), 1.0)
    line = fig.axes[2].lines[0].get_ydata()  # axes: heads, neurons, channels, colorbars
    assert line[0] == 1.0 and np.all(np.diff(line) <= 0)  # channels sorted, over the max


def test_ranking_ablation_puts_the_best_ranking_first_with_the_teacher_line():
    table = pd.DataFrame({"ranking": ["random", "activation l2/mean", "weight magnitude"],
                          "lm_loss": [2.0, 1.0, 1.5]})
    fig = cviz.ranking_ablation(table, teacher_loss=0.5)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "activation l2/mean"
    assert [round(p.get_width(), 3) for p in ax.patches] == [1.0, 1.5, 2.0]
    assert ax.lines[0].get_xdata()[0] == 0.5
    table["lm_loss_sd"] = [0.2, 0.0, 0.0]                  # random drawn over seeds
    ax = cviz.ranking_ablation(table).axes[0]
    (bars,) = [c for c in ax.containers if isinstance(c, matplotlib.container.ErrorbarContainer)]
    widths = sorted(round(float(s[1][0] - s[0][0]), 6) for s in bars.lines[2][0].get_segments())
    assert widths == [0.0, 0.0, 0.4]


def test_pareto_front_joins_only_undominated_models():
    table = pd.DataFrame({"model": ["teacher", "a", "b", "dominated"],
                          "tok_s": [100.0, 150.0, 300.0, 120.0],
                          "accuracy": [0.5, 0.4, 0.2, 0.3]})
    fig = cviz.pareto(table)
    front = fig.axes[0].lines[0]
    assert sorted(front.get_xdata()) == [100.0, 150.0, 300.0]


def test_width_vs_depth_and_loss_curves_and_depth_scores_draw():
    wd = pd.DataFrame({"kind": ["width", "width", "depth", "depth"],
                       "stage": ["after pruning", "after distillation"] * 2,
                       "lm_loss": [1.1, 0.8, 0.7, 0.6]})
    ax = cviz.width_vs_depth(wd).axes[0]
    assert len(ax.patches) == 4
    curves = pd.DataFrame({"run": ["kd"] * 3 + ["scratch"] * 3, "tokens": [0, 10, 20] * 2,
                           "lm_loss": [2, 1, 0.5, 4, 3, 2]})
    ax = cviz.loss_curves(curves, target=2.0).axes[0]
    assert len(ax.lines) == 3
    depth = pd.DataFrame({"layer": [0, 1], "increase": [3.0, 0.1],
                          "block_importance": [0.9, 0.05]})
    assert len(cviz.depth_scores(depth).axes) == 2


def test_comparisons_over_seeds_draw_their_error_bars():
    summary = pd.DataFrame({"kind": ["width", "width", "depth", "depth"],
                            "stage": ["after pruning", "after distillation"] * 2,
                            "lm_loss": [1.1, 0.8, 0.7, 0.6], "lm_loss_lo": [1.0, 0.7, 0.6, 0.5],
                            "lm_loss_hi": [1.2, 0.9, 0.8, 0.7]})
    ax = cviz.width_vs_depth(summary).axes[0]
    assert len(ax.patches) == 4 and len(ax.containers) == 4  # 2 bar groups + 2 error bars
    caps = [c for c in ax.containers if isinstance(c, matplotlib.container.ErrorbarContainer)]
    segs = np.concatenate([c.lines[2][0].get_segments() for c in caps])
    assert sorted(round(float(s[1][1] - s[0][1]), 6) for s in segs) == [0.2] * 4

    table = pd.DataFrame({"run": ["kd", "ce"], "accuracy": [0.5, 0.4], "accuracy_sd": [0.02, 0.01],
                          "accuracy_lo": [0.45, 0.38], "accuracy_hi": [0.56, 0.43]})
    ax = cviz.error_bars(table).axes[0]
    (bars,) = ax.containers
    lows = sorted(float(s[0][0]) for s in bars.lines[2][0].get_segments())
    assert lows == [0.38, 0.45]
    assert [t.get_text() for t in ax.texts] == ["0.500 ± 0.020", "0.400 ± 0.010"]
    ticks = dict(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())))
    assert ticks == {1: "kd", 0: "ce"}                     # the first row on top

    curves = pd.DataFrame({"run": ["kd"] * 4, "seed": [0, 0, 1, 1], "step": [0, 1, 0, 1],
                           "tokens": [0, 10, 0, 12], "lm_loss": [2.0, 1.0, 2.0, 1.4]})
    ax = cviz.loss_curves(curves).axes[0]
    assert ax.lines[0].get_ydata().tolist() == [2.0, 1.2]  # the mean over seeds
    assert ax.lines[0].get_xdata().tolist() == [0.0, 11.0]
    assert len(ax.collections) == 1                        # the seeds' band


def test_budget_curves_draw_each_method_in_its_interval_with_the_teacher():
    summary = pd.DataFrame({"method": ["kd", "scratch", "kd", "scratch"],
                            "budget_fraction": [0.01, 0.01, 0.1, 0.1],
                            "tokens": [40_000, 40_000, 400_000, 400_000],
                            "accuracy": [0.3, 0.0, 0.4, 0.1],
                            "accuracy_lo": [0.25, 0.0, 0.35, 0.05],
                            "accuracy_hi": [0.35, 0.02, 0.45, 0.15]})
    ax = cviz.budget_curves(summary, teacher_accuracy=0.42).axes[0]
    assert [ln.get_ydata().tolist() for ln in ax.lines[:2]] == [[0.3, 0.4], [0.0, 0.1]]
    assert [ln.get_ydata()[0] for ln in ax.lines[2:]] == [0.42, pytest.approx(0.39)]
    assert len(ax.collections) == 2                        # one interval band per method
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["40,000\n1%", "400,000\n10%"]
