import matplotlib

matplotlib.use("Agg")

from itertools import product  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from workbench.speculative.measure import sd_bound  # noqa: E402
from workbench.viz import (  # noqa: E402
    acceptance_vs_batch, save_figure, sd_time_breakdown, speedup_vs_batch)

DRAFTERS = ("eagle", "ngram")
KS = (2, 4)
BATCH_SIZES = (1, 2, 4, 8)
TEMPERATURES = (0.0, 1.0)
# tau at batch size 1 by (drafter, k, temperature); a little lower at larger batches
TAU = {("eagle", 2, 0.0): 2.5, ("eagle", 4, 0.0): 3.4, ("eagle", 2, 1.0): 2.1,
       ("eagle", 4, 1.0): 2.6, ("ngram", 2, 0.0): 1.8, ("ngram", 4, 0.0): 2.2,
       ("ngram", 2, 1.0): 1.4, ("ngram", 4, 1.0): 1.6}
TD = {"eagle": 0.003, "ngram": 0.0002}  # seconds per drafted token


def make_table() -> pd.DataFrame:
    """An sd_sweep-shaped table with plausible numbers, rows in shuffled order."""
    rows = []
    for temp, bs, drafter, k in product(TEMPERATURES, BATCH_SIZES, DRAFTERS, KS):
        t1 = 0.020 + 0.0005 * bs
        tv = t1 * (1.05 + 0.03 * bs * (k + 1) / 3)
        tau = TAU[(drafter, k, temp)] - 0.02 * np.log2(bs)
        bound = sd_bound(tau, t1, TD[drafter], tv, k)
        speedup = bound * (0.85 - 0.03 * np.log2(bs))
        tokens = 400 * bs
        plain_s = tokens / bs * t1
        lo, hi = speedup * (0.95 - 0.02 * np.log2(bs)), speedup * (1.04 + 0.05 * np.log2(bs))
        rows.append({"temperature": temp, "batch_size": bs, "drafter": drafter, "k": k,
                     "tokens": tokens, "plain_s": plain_s, "sd_s": plain_s / speedup,
                     "plain_tok_s": tokens / plain_s, "sd_tok_s": tokens * speedup / plain_s,
                     "tau": tau, "T1": t1, "Td": TD[drafter], "Tv": tv, "bound": bound,
                     "identical": True, "diverged_at": None, "speedup": speedup,
                     "speedup_min": lo, "speedup_max": hi, "speedup_spread": (hi - lo) / speedup,
                     "spread_wide": (hi - lo) / speedup > 0.25, "repeats": 3})
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0).reset_index(drop=True)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def lines(ax, prefix):
    return sorted((ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith(prefix)),
                  key=lambda ln: ln.get_gid())


def expected(table, temp, drafter, k, column):
    r = table[(table["temperature"] == temp) & (table["drafter"] == drafter) & (table["k"] == k)]
    r = r.sort_values("batch_size")
    return r["batch_size"].to_numpy(float), r[column].to_numpy(float)


def test_speedup_draws_one_panel_per_temperature_with_lines_and_bounds_from_the_table():
    table = make_table()
    fig = speedup_vs_batch(table)
    assert len(fig.axes) == len(TEMPERATURES)
    assert fig.axes[0].get_shared_y_axes().joined(fig.axes[0], fig.axes[1])
    assert [ax.get_title() for ax in fig.axes] == ["temperature 0 (greedy)", "temperature 1"]
    for temp, ax in zip(TEMPERATURES, fig.axes):
        solid = lines(ax, "speedup-")
        dashed = lines(ax, "bound-")
        assert len(solid) == len(dashed) == len(DRAFTERS) * len(KS)
        for drafter, k in product(DRAFTERS, KS):
            line, = [ln for ln in solid if ln.get_gid() == f"speedup-{drafter}-k{k}"]
            bound, = [ln for ln in dashed if ln.get_gid() == f"bound-{drafter}-k{k}"]
            x, y = expected(table, temp, drafter, k, "speedup")
            np.testing.assert_allclose(line.get_xdata(), x)
            np.testing.assert_allclose(line.get_ydata(), y)
            np.testing.assert_allclose(bound.get_ydata(), expected(table, temp, drafter, k,
                                                                   "bound")[1])
            assert line.get_linestyle() == "-" and bound.get_linestyle() == "--"
            assert line.get_color() == bound.get_color()
            assert line.get_label() == f"{drafter} k={k}"
        ref, = lines(ax, "plain-decoding")
        assert list(ref.get_ydata()) == [1.0, 1.0]
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
        assert list(ax.get_xticks()) == list(BATCH_SIZES)
    assert fig.axes[0].get_ylabel() == "speedup over plain decoding (wall clock)"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "eagle k=4" in legend and "plain decoding" in legend
    assert not any(t.startswith("_") for t in legend)


def test_speedup_keeps_colours_across_panels_and_draws_one_chosen_temperature():
    table = make_table()
    fig = speedup_vs_batch(table)
    left, right = ([ln.get_color() for ln in lines(ax, "speedup-")] for ax in fig.axes)
    assert left == right and len(set(left)) == len(left)
    fig1 = speedup_vs_batch(table, temperature=1.0)
    assert len(fig1.axes) == 1 and fig1.axes[0].get_title() == "temperature 1"


def test_figures_draw_on_given_axes_and_reject_mismatches():
    table = make_table()
    fig, axes = plt.subplots(1, 3)
    assert speedup_vs_batch(table, ax=axes[:2]) is fig
    assert acceptance_vs_batch(table, ax=axes[2], temperature=0.0) is fig
    assert len(lines(axes[1], "speedup-")) == 4 and len(lines(axes[2], "tau-eagle")) == 2
    with pytest.raises(ValueError, match="2 temperatures"):
        speedup_vs_batch(table, ax=axes[0])
    with pytest.raises(ValueError, match="temperature=0.5"):
        acceptance_vs_batch(table, temperature=0.5)
    with pytest.raises(ValueError, match="missing columns"):
        speedup_vs_batch(table.drop(columns="bound"))


def test_acceptance_draws_tau_per_drafter_and_k_under_its_maximum():
    table = make_table()
    fig = acceptance_vs_batch(table)
    assert len(fig.axes) == len(TEMPERATURES)
    for temp, ax in zip(TEMPERATURES, fig.axes):
        taus = [ln for ln in lines(ax, "tau-") if not ln.get_gid().startswith("tau-max")]
        assert len(taus) == len(DRAFTERS) * len(KS)
        for drafter, k in product(DRAFTERS, KS):
            line, = [ln for ln in taus if ln.get_gid() == f"tau-{drafter}-k{k}"]
            np.testing.assert_allclose(line.get_ydata(),
                                       expected(table, temp, drafter, k, "tau")[1])
        for k in KS:
            top, = lines(ax, f"tau-max-k{k}")
            assert list(top.get_ydata()) == [k + 1, k + 1] and top.get_linestyle() == ":"
        assert ax.get_xscale() == "log"
    assert fig.axes[0].get_ylabel() == "acceptance length τ (tokens per verify)"


def test_breakdown_bars_are_the_step_times_in_ms_in_batch_order():
    table = make_table()
    ax = sd_time_breakdown(table, drafter="eagle", k=4, temperature=1.0).axes[0]
    rows = table[(table["drafter"] == "eagle") & (table["k"] == 4)
                 & (table["temperature"] == 1.0)].sort_values("batch_size")
    bars = {name: [p for p in ax.patches if p.get_gid() == f"{name}-bar"]
            for name in ("draft", "verify", "plain")}
    np.testing.assert_allclose([b.get_height() for b in bars["draft"]], 1000 * 4 * rows["Td"])
    np.testing.assert_allclose([b.get_height() for b in bars["verify"]], 1000 * rows["Tv"])
    np.testing.assert_allclose([b.get_y() for b in bars["verify"]], 1000 * 4 * rows["Td"])
    np.testing.assert_allclose([b.get_height() for b in bars["plain"]],
                               1000 * rows["T1"] * rows["tau"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert "wall clock" in ax.get_ylabel() and "eagle k=4" in ax.get_title()
    assert "temperature 1" in ax.get_title()
    # plain over SD bar is the bound, written above each pair
    notes = [t.get_text() for t in ax.texts]
    assert notes == [f"bound {b:.2f}×" for b in rows["bound"]]


def test_breakdown_defaults_to_the_first_drafter_k_and_temperature(tmp_path):
    table = make_table()
    first = table.iloc[0]
    ax = sd_time_breakdown(table).axes[0]
    assert f"{first['drafter']} k={first['k']}" in ax.get_title()
    assert save_figure(ax.figure, tmp_path / "breakdown.png").stat().st_size > 0


def test_speedup_error_bars_span_the_per_repeat_ratios_and_rings_mark_wide_spreads():
    table = make_table()
    assert table["spread_wide"].any() and not table["spread_wide"].all()
    fig = speedup_vs_batch(table)
    for temp, ax in zip(TEMPERATURES, fig.axes):
        for drafter, k in product(DRAFTERS, KS):
            bars, = [c for c in ax.collections if c.get_gid() == f"spread-{drafter}-k{k}"]
            r = table[(table["temperature"] == temp) & (table["drafter"] == drafter)
                      & (table["k"] == k)].sort_values("batch_size")
            segs = np.array(bars.get_segments())  # one vertical segment per batch size
            np.testing.assert_allclose(segs[:, 0, 0], r["batch_size"])
            np.testing.assert_allclose(segs[:, 0, 1], r["speedup_min"])
            np.testing.assert_allclose(segs[:, 1, 1], r["speedup_max"])
            wide = r[r["spread_wide"]]
            rings = lines(ax, f"wide-{drafter}-k{k}")
            assert len(rings) == (1 if len(wide) else 0)
            if len(wide):
                np.testing.assert_allclose(rings[0].get_xdata(), wide["batch_size"])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "min-max of the per-repeat ratios" in legend
    assert "wide spread: rerun on a quiet machine" in legend
    quiet = table.assign(spread_wide=False)
    legend = [t.get_text() for t in speedup_vs_batch(quiet).axes[0].get_legend().get_texts()]
    assert not any(t.startswith("wide") for t in legend)


def test_speedup_draws_a_table_saved_before_the_spread_columns_existed():
    old = make_table().drop(columns=["speedup_min", "speedup_max", "speedup_spread",
                                     "spread_wide", "repeats"])
    fig = speedup_vs_batch(old)
    assert not any((c.get_gid() or "").startswith("spread-") for c in fig.axes[0].collections)
    assert len(lines(fig.axes[0], "speedup-")) == len(DRAFTERS) * len(KS)
