"""The SD what-if and pruning explorers without a browser: setting a control's value redraws
the figure's data and the panel's text; bad input gets a clear error."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from workbench.compress.plan import PrunePlan  # noqa: E402
from workbench.compress.plan_table import plan_table  # noqa: E402
from workbench.speculative.whatif import sd_whatif, whatif_table  # noqa: E402
from workbench.viz.prune_explorer import PruneExplorer  # noqa: E402
from workbench.viz.sd_whatif import SDWhatIf  # noqa: E402

from .helpers.tables import PLAN, hand_scores, tiny_config  # noqa: E402
from .helpers.tables import make_sweep, make_timeline  # noqa: E402
from .helpers.figures import artist, assert_legends_clear_of_the_axes, bars


# ---- SD what-if ---------------------------------------------------------------------------
def whatif(**kw):
    return SDWhatIf(make_sweep(), whatif_table(make_timeline(), make_sweep(), 0.0), **kw)


def test_whatif_starts_at_the_largest_live_batch_and_draws_the_selection():
    ex = whatif()
    assert ex.controls["threshold"].max == 4 and ex.controls["threshold"].value == 4
    assert ex.controls["k"].options == (2, 4) and ex.controls["k"].value == 4
    assert ex.controls["drafter"].options == ("eagle", "ngram")
    assert list(artist(ex.figure, "threshold").get_xdata()) == [4, 4]
    assert artist(ex.figure, "curve-eagle-k4").get_linewidth() > \
        artist(ex.figure, "curve-ngram-k2").get_linewidth()
    assert ex.figure.axes[0].get_xscale() == "log"
    assert "busy time (s, sim clock)" == ex.figure.axes[1].get_ylabel()


def test_whatif_threshold_moves_the_line_the_bars_and_the_panel():
    ex = whatif()
    before = ex.redraws
    ex.controls["threshold"].value = 2
    assert ex.redraws == before + 1
    assert list(artist(ex.figure, "threshold").get_xdata()) == [2, 2]
    want = sd_whatif(make_timeline(), make_sweep(), 2, "eagle", 4, 0.0)
    heights = [b.get_height() for b in bars(ex.figure, "whatif-bar")]
    assert np.allclose(heights, want.workers["whatif_s"])
    assert np.allclose([b.get_height() for b in bars(ex.figure, "recorded-bar")], [2.0, 0.8, 0.0])
    assert list(artist(ex.figure, "makespan-whatif").get_ydata()) == \
        pytest.approx([want.makespan_whatif_s] * 2)
    assert f"{want.makespan_whatif_s:.3f} s" in ex.panel.value
    assert f"{want.speedup:.2f}×" in ex.panel.value


def test_whatif_drafter_switch_highlights_its_curve_and_recomputes():
    ex = whatif()
    ex.controls["k"].value = 2
    ex.controls["drafter"].value = "ngram"
    assert artist(ex.figure, "curve-ngram-k2").get_linewidth() > \
        artist(ex.figure, "curve-eagle-k4").get_linewidth()
    want = sd_whatif(make_timeline(), make_sweep(), 4, "ngram", 2, 0.0)
    assert np.allclose([b.get_height() for b in bars(ex.figure, "whatif-bar")],
                       want.workers["whatif_s"])
    assert "outside the measured batch sizes" in ex.panel.value  # ngram: batch 2 only


def test_whatif_unmeasured_pair_says_what_was_measured():
    ex = whatif()
    ex.controls["k"].value = 2  # eagle k=2 was never measured
    assert "not measured" in ex.panel.value and "eagle k=4, ngram k=2" in ex.panel.value
    assert not bars(ex.figure, "whatif-bar")
    assert artist(ex.figure, "not-measured", "texts")


def test_whatif_reads_files_and_leaves_a_png(tmp_path):
    make_sweep().to_csv(tmp_path / "curve.csv", index=False)
    make_timeline().save(tmp_path / "run" / "timeline")
    table = whatif_table(tmp_path / "run", tmp_path / "curve.csv", temperature=1.0)
    table.to_csv(tmp_path / "whatif.csv", index=False)
    ex = SDWhatIf(tmp_path / "curve.csv", tmp_path / "whatif.csv", threshold=1)
    assert ex.controls["threshold"].value == 1
    assert ex.png().startswith(b"\x89PNG")
    assert "k=4" in ex.panel.value


def test_whatif_bad_input():
    table = whatif_table(make_timeline(), make_sweep(), 0.0)
    with pytest.raises(ValueError, match=r"threshold .*must be an integer >= 0, got -1"):
        whatif(threshold=-1)
    assert whatif(threshold=9).controls["threshold"].value == 4  # above the batch: everywhere
    with pytest.raises(ValueError, match=r"k \(a measured one\) must be one of 2, 4, got 3"):
        whatif(k=3)
    with pytest.raises(ValueError, match=r"missing columns \['speedup'\]"):
        SDWhatIf(make_sweep().drop(columns="speedup"), table)
    with pytest.raises(ValueError, match=r"missing columns \['speedup'\]"):
        SDWhatIf(make_sweep(), table.drop(columns="speedup"))
    with pytest.raises(ValueError, match="the what-if table has no rows"):
        SDWhatIf(make_sweep(), table.head(0))
    mixed = pd.concat([table, whatif_table(make_timeline(), make_sweep(), 1.0)])
    with pytest.raises(ValueError, match=r"mixes temperatures \[0.0, 1.0\]"):
        SDWhatIf(make_sweep(), mixed)
    hot_only = make_sweep().query("temperature == 1.0")
    with pytest.raises(ValueError, match=r"no rows at temperature 0, the what-if.s; it "
                                         r"measured \[1\.0\]"):
        SDWhatIf(hot_only, table)
    with pytest.raises(ValueError, match="accepted suffixes"):
        SDWhatIf("curve.txt", table)


# ---- pruning ------------------------------------------------------------------------------
def plans():
    config = tiny_config()
    return plan_table(config, hand_scores(),
                      {"teacher": PrunePlan.full(config), "small": PLAN,
                       "narrow": PrunePlan((0, 1, 2), 4, 6, 2)}, teacher_tok_s=300.0)


def test_prune_explorer_follows_the_plan():
    table = plans()
    ex = PruneExplorer(table)
    assert ex.controls["plan"].options == ("teacher", "small", "narrow")
    teacher = table.iloc[0]
    assert artist(ex.figure, "selected", "collections").get_offsets().tolist() == \
        [[teacher["params_ratio"], teacher["importance_kept"]]]
    ex.controls["plan"].value = "small"
    small = table.iloc[1]
    assert np.allclose(artist(ex.figure, "selected", "collections").get_offsets(),
                       [[small["params_ratio"], small["importance_kept"]]])
    assert [b.get_height() for b in bars(ex.figure, "kept-bar")] == pytest.approx(
        [small["kept_heads"], small["kept_neurons"], small["kept_channels"],
         small["kept_layers"]])
    assert list(artist(ex.figure, "params-ratio").get_ydata()) == \
        pytest.approx([small["params_ratio"]] * 2)
    assert f"{int(small['params']):,}" in ex.panel.value
    assert f"{small['predicted_tok_s']:,.0f} tokens/s" in ex.panel.value
    points = sum(len(c.get_offsets()) for ax in ex.figure.axes for c in ax.collections
                 if (c.get_gid() or "").startswith("plans-"))
    assert points == 3


def test_prune_explorer_from_csv_without_a_measured_teacher(tmp_path):
    config = tiny_config()
    plan_table(config, hand_scores(), [PLAN]).to_csv(tmp_path / "plans.csv", index=False)
    ex = PruneExplorer(tmp_path / "plans.csv")
    assert "× the teacher's" in ex.panel.value and "tokens/s" not in ex.panel.value
    assert ex.png().startswith(b"\x89PNG")


def test_prune_explorer_bad_input():
    with pytest.raises(ValueError, match="plan 'huge' is not in the table"):
        PruneExplorer(plans(), plan="huge")
    with pytest.raises(ValueError, match=r"missing columns \['kept_layers'\]"):
        PruneExplorer(plans().drop(columns="kept_layers"))
    twice = plans().assign(label=["a", "a", "b"])
    with pytest.raises(ValueError, match=r"labels \['a'\] occur more than once"):
        PruneExplorer(twice)
    with pytest.raises(ValueError, match="no rows"):
        PruneExplorer(plans().head(0))


def test_whatif_legends_never_cover_the_data():
    ex = whatif()
    assert_legends_clear_of_the_axes(ex.figure)
    ex.controls["threshold"].value = 0
    assert_legends_clear_of_the_axes(ex.figure)


def test_whatif_controls_with_one_choice_say_why():
    """One drafter and one k measured at T=1, a rollout whose live batch never exceeds 1: the
    tooltips and the panel say why the controls offer so little."""
    solo = make_timeline([(0, "prefill", 0.0, 0.1, 1), (0, "decode", 0.1, 0.5, 1)], workers=1)
    ex = SDWhatIf(make_sweep(), whatif_table(solo, make_sweep(), temperature=1.0))
    assert ex.controls["k"].options == (4,) and ex.controls["drafter"].options == ("eagle",)
    assert (ex.controls["threshold"].min, ex.controls["threshold"].max) == (0, 1)
    assert ex.controls["k"].tooltip == "only k=4 was measured at temperature 1"
    assert ex.controls["drafter"].tooltip == "only eagle was measured at temperature 1"
    assert "largest live decode batch" in ex.controls["threshold"].tooltip
    for reason in ("only k=4 was measured", "only eagle was measured",
                   "live decode batch never exceeded 1"):
        assert reason in ex.panel.value
    ex.controls["threshold"].value = 0
    assert "only k=4 was measured" in ex.panel.value  # on every redraw
    roomy = whatif()  # two drafters, two k, a live batch up to 4: nothing to excuse
    assert "was measured at" not in roomy.panel.value and "never exceeded" not in roomy.panel.value
    assert roomy.controls["k"].tooltip == "measured at temperature 0 (greedy): k=2, k=4"


def test_whatif_coinciding_reference_lines_are_told_apart():
    ex = whatif(threshold=0)  # SD nowhere: the what-if makespan is the recorded one
    recorded, what_if = (artist(ex.figure, g) for g in ("makespan-recorded", "makespan-whatif"))
    assert recorded.get_ydata()[0] == pytest.approx(what_if.get_ydata()[0])
    assert recorded.get_linestyle() != what_if.get_linestyle()
    assert recorded.get_color() != what_if.get_color()
    # the what-if wide underneath, the recorded dashed on top: both visible
    assert what_if.get_linewidth() > recorded.get_linewidth()
    assert recorded.get_zorder() > what_if.get_zorder()
    assert "(= recorded)" in what_if.get_label() and "(=" not in recorded.get_label()
    ex.controls["threshold"].value = 2
    assert "(= recorded)" not in artist(ex.figure, "makespan-whatif").get_label()
    # eagle k=4 measured exactly 1.0 at batch 8: plain decoding at 1 stays visible on top
    plain, curve = artist(ex.figure, "plain-decoding"), artist(ex.figure, "curve-eagle-k4")
    assert 1.0 in list(curve.get_ydata())
    assert plain.get_linestyle() != curve.get_linestyle()
    assert plain.get_zorder() > curve.get_zorder()


def test_whatif_titles_are_words():
    ex = whatif(threshold=0)
    left, right = (ax.get_title() for ax in ex.figure.axes[:2])
    assert left == "Measured SD speedup by batch size, temperature 0 (greedy)"
    assert right == "What-if with SD nowhere (threshold 0): the recorded makespan"
    ex.controls["threshold"].value = 2
    speedup = sd_whatif(make_timeline(), make_sweep(), 2, "eagle", 4, 0.0).speedup
    assert ex.figure.axes[1].get_title() == (
        f"What-if with eagle k=4 at live batch ≤ 2: makespan speedup {speedup:.2f}×")


def depth_table():
    """A depth plan that drops layer 1, whose removal helped (score -1, counted 0): it keeps
    all the layers' importance, and 2 of the 3 layers."""
    config = tiny_config()
    return plan_table(config, hand_scores(),
                      {"teacher": PrunePlan.full(config), "depth": PrunePlan((0, 2), 8, 6, 2)},
                      layer_scores=[1.0, -1.0, 3.0])


def test_prune_explorer_depth_plan_reports_its_layers():
    ex = PruneExplorer(depth_table(), plan="depth")
    row = ex.table.iloc[1]
    assert row["kind"] == "depth" and row["kept_layers"] == 1.0 and row["source_layers"] == 3
    assert "2 of 3 layers kept (layers 0, 2)" in ex.panel.value
    assert "(layers: 2 of 3 kept)" in ex.panel.value
    assert ex.figure.axes[1].get_xticklabels()[-1].get_text() == "layers\n(2 of 3 kept)"
    assert ex.figure.get_suptitle() == (
        "Plan depth: 2 of 3 layers kept (layers 0, 2), hidden size 8, MLP size 6, "
        "2 query heads per KV group")
    ex.controls["plan"].value = "teacher"
    assert "3 of 3 layers kept (layers 0-2)" in ex.panel.value


def test_prune_explorer_explains_its_labels_in_words():
    from workbench.compress.plan_table import LABEL_KEY
    ex = PruneExplorer(plans())
    assert ex.figure.get_supxlabel() == LABEL_KEY
    assert LABEL_KEY in ex.panel.value and LABEL_KEY in ex.controls["plan"].tooltip
    for key in ("L = layers kept", "h = hidden size", "m = MLP size", "q = query heads"):
        assert key in LABEL_KEY
    titles = [ex.figure.get_suptitle(), *(ax.get_title() for ax in ex.figure.axes)]
    assert not [t for t in titles if "PrunePlan(" in t or t.startswith("kept by")]
    assert str(PLAN) == ("2 layers kept (layers 0, 2), hidden size 4, MLP size 3, 1 query head "
                         "per KV group")
    alone = PruneExplorer(plans().head(1))
    assert alone.controls["plan"].tooltip == "the plan table holds this one plan only"


def test_prune_explorer_coinciding_shares_are_told_apart_and_legends_clear():
    ex = PruneExplorer(depth_table(), plan="teacher")  # parameters = FLOPs = 100%
    params, flops = artist(ex.figure, "params-ratio"), artist(ex.figure, "flops-ratio")
    assert params.get_ydata()[0] == flops.get_ydata()[0] == 1.0
    assert params.get_linestyle() != flops.get_linestyle()
    assert params.get_color() != flops.get_color()
    assert "(= parameters)" in flops.get_label()
    assert_legends_clear_of_the_axes(ex.figure)
    ex.controls["plan"].value = "depth"
    assert_legends_clear_of_the_axes(ex.figure)


def test_prune_explorer_never_rounds_a_loss_up_to_100_percent():
    config = tiny_config()
    table = plan_table(config, hand_scores(), {"depth": PrunePlan((0, 2), 8, 6, 2)},
                       layer_scores=[1000.0, 0.2, 1000.0])  # keeps 99.99% of the layers' score
    ex = PruneExplorer(table)
    shown = [t.get_text() for t in ex.figure.axes[1].texts]
    assert shown[-1] == "99.99%" and "layers 99.99%" in ex.panel.value
