"""Error bars of the compression comparisons (workbench.compress.stats)."""
import numpy as np
import pytest

from workbench.compress.stats import paired_difference, summarize


def test_summarize_gives_the_mean_the_sd_over_seeds_and_an_interval_around_the_mean():
    rng = np.random.default_rng(1)
    x = (rng.random((3, 400)) < 0.6).astype(float)           # 3 seeds x 400 problems, p = 0.6
    s = summarize(x)
    assert s["mean"] == pytest.approx(x.mean())
    assert s["sd"] == pytest.approx(np.std(x.mean(axis=1), ddof=1))
    assert s["lo"] < s["mean"] < s["hi"] and s["hi"] - s["lo"] < 0.15
    assert (s["seeds"], s["items"]) == (3, 400)
    assert summarize(x) == s                                  # seeded: the same interval again


def test_one_figure_per_seed_and_one_seed_are_accepted():
    s = summarize([0.41, 0.43, 0.42])
    assert s["mean"] == pytest.approx(0.42) and s["sd"] == pytest.approx(0.01)
    assert 0.41 <= s["lo"] <= s["hi"] <= 0.43
    one = summarize([[1.0, 0.0, 1.0, 1.0]])
    assert one["sd"] == 0.0 and one["seeds"] == 1


def test_seed_noise_widens_the_interval():
    """Items alone cannot hide a seed spread: two seeds far apart give a wide interval."""
    steady = np.full((2, 200), 0.5)
    spread = np.stack([np.full(200, 0.2), np.full(200, 0.8)])
    assert summarize(steady)["hi"] - summarize(steady)["lo"] == 0.0
    wide = summarize(spread)
    assert wide["lo"] <= 0.2 + 1e-12 and wide["hi"] >= 0.8 - 1e-12


def test_a_paired_difference_beyond_its_noise_is_significant_and_one_within_is_not():
    rng = np.random.default_rng(2)
    base = (rng.random((3, 400)) < 0.5).astype(float)
    better = np.maximum(base, (rng.random((3, 400)) < 0.3).astype(float))  # ~+15 points
    d = paired_difference(better, base)
    assert d["diff"] == pytest.approx(better.mean() - base.mean())
    assert 0 < d["lo"] < d["diff"] < d["hi"] and d["significant"]
    noise = (rng.random((3, 400)) < 0.5).astype(float)
    n = paired_difference(noise, base)
    assert n["lo"] < 0 < n["hi"] and not n["significant"]
    assert paired_difference(base, better)["significant"]    # worse beyond the noise: also


@pytest.mark.parametrize("call, match", [
    (lambda: summarize([]), r"shape \(0,\)"),
    (lambda: summarize([[[1.0]]]), r"\[seeds\] or \[seeds, items\]"),
    (lambda: summarize([1.0, float("nan")]), "non-finite"),
    (lambda: summarize([1.0], level=1.0), "level"),
    (lambda: summarize([1.0], draws=10), "draws"),
    (lambda: paired_difference(np.zeros((2, 3)), np.zeros((3, 3))), r"\(2, 3\) and b \(3, 3\)"),
])
def test_bad_input_is_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_summarize_column_gives_one_row_per_group_with_its_error_bars():
    import pandas as pd
    from workbench.compress.stats import summarize_column
    t = pd.DataFrame({"kind": ["width"] * 3 + ["depth"] * 3, "seed": [0, 1, 2] * 2,
                      "lm_loss": [0.40, 0.42, 0.44, 0.50, 0.50, 0.50]})
    out = summarize_column(t, "kind", "lm_loss").set_index("kind")
    assert list(out.index) == ["width", "depth"]
    assert out.loc["width", "lm_loss"] == pytest.approx(0.42)
    assert out.loc["width", "lm_loss_sd"] == pytest.approx(0.02)
    assert out.loc["depth", "lm_loss_lo"] == out.loc["depth", "lm_loss_hi"] == 0.5
    assert (out["seeds"] == 3).all()
    with pytest.raises(ValueError, match="no column 'accuracy'"):
        summarize_column(t, "kind", "accuracy")
