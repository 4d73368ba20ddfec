"""The SD what-if and pruning explorers without a browser: setting a control's value redraws
the figure's data and the panel's text; bad input gets a clear error."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from workbench.compress.plan import PrunePlan  # noqa: E402
from workbench.compress.plan_table import plan_table  # noqa: E402
from workbench.speculative.whatif import sd_whatif  # noqa: E402
from workbench.viz.prune_explorer import PruneExplorer  # noqa: E402
from workbench.viz.sd_whatif import SDWhatIf  # noqa: E402

from .test_plan_table import PLAN, hand_scores, tiny_config  # noqa: E402
from .test_whatif import STEPS, make_sweep, make_timeline  # noqa: E402


def artist(fig, gid, kind="lines"):
    found = [a for ax in fig.axes for a in getattr(ax, kind) if a.get_gid() == gid]
    assert len(found) == 1, (gid, found)
    return found[0]


def bars(fig, gid):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


# ---- SD what-if ---------------------------------------------------------------------------
def whatif(**kw):
    return SDWhatIf(make_sweep(), make_timeline(), temperature=0.0, **kw)


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
    ex = SDWhatIf(tmp_path / "curve.csv", tmp_path / "run", temperature=1.0, threshold=1)
    assert ex.controls["threshold"].value == 1
    assert ex.png().startswith(b"\x89PNG")
    assert "k=4" in ex.panel.value


def test_whatif_bad_input():
    with pytest.raises(ValueError, match=r"temperature None.*\[0.0, 1.0\]"):
        SDWhatIf(make_sweep(), make_timeline())
    with pytest.raises(ValueError, match=r"temperature 0.5.*\[0.0, 1.0\]"):
        SDWhatIf(make_sweep(), make_timeline(), temperature=0.5)
    with pytest.raises(ValueError, match="threshold -1: accepted an integer >= 0"):
        whatif(threshold=-1)
    assert whatif(threshold=9).controls["threshold"].value == 4  # above the batch: everywhere
    with pytest.raises(ValueError, match=r"k 3: accepted one of the measured \[2, 4\]"):
        whatif(k=3)
    with pytest.raises(ValueError, match=r"missing columns \['speedup'\]"):
        SDWhatIf(make_sweep().drop(columns="speedup"), make_timeline(), temperature=0.0)
    prefill_only = make_timeline([s for s in STEPS if s[1] == "prefill"])
    with pytest.raises(ValueError, match="no decode steps"):
        SDWhatIf(make_sweep(), prefill_only, temperature=0.0)
    with pytest.raises(ValueError, match="accepted suffixes"):
        SDWhatIf("curve.txt", make_timeline(), temperature=0.0)


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
