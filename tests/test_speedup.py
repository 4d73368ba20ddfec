"""workbench.speedup: interleaved side-by-side timing, median of per-repeat ratios, spread."""
import numpy as np
import pandas as pd
import pytest

from workbench.speedup import (
    WIDE_SPREAD, Runs, compare, format_ratio, interleave, markdown, per_repeat_ratios, run_order,
    spread_note, spread_stats, summarize)


class FakeClock:
    """A clock that only moves when a system 'runs': each call advances it by a known time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def systems_with_times(clock, times: dict, calls: list):
    """Systems whose r-th call takes ``times[name][r]`` seconds on ``clock``; calls recorded."""
    count = {name: 0 for name in times}

    def make(name):
        def run():
            calls.append(name)
            clock.now += times[name][count[name]]
            count[name] += 1
            return f"{name}-out-{count[name]}"
        return run

    return {name: make(name) for name in times}


def test_run_order_rotates_alternates_or_stays_fixed():
    names = ["a", "b", "c"]
    assert [run_order(names, r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert [run_order(names, r, "alternate") for r in range(3)] == [
        ["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
    assert run_order(names, 5, "fixed") == names
    with pytest.raises(ValueError, match="order must be one of"):
        run_order(names, 0, "random")


def test_systems_alternate_inside_each_repeat_and_outputs_are_kept_per_repeat():
    clock, calls = FakeClock(), []
    systems = systems_with_times(clock, {"plain": [1.0] * 4, "sd": [0.5] * 4}, calls)
    runs = interleave(systems, repeats=4, clock=clock)
    # every repeat runs each system once before the next repeat starts; the order flips
    assert calls == ["plain", "sd", "sd", "plain", "plain", "sd", "sd", "plain"]
    assert list(runs.table["repeat"]) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert list(runs.table["slot"]) == [0, 1] * 4
    assert runs.outputs == {"plain": [f"plain-out-{i}" for i in range(1, 5)],
                            "sd": [f"sd-out-{i}" for i in range(1, 5)]}
    np.testing.assert_allclose(runs.table["seconds"], runs.table["value"])


def test_warmup_rounds_run_untimed_first():
    clock, calls = FakeClock(), []
    systems = systems_with_times(clock, {"a": [9.0, 1, 1, 1], "b": [9.0, 2, 2, 2]}, calls)
    runs = interleave(systems, repeats=3, warmup=1, clock=clock)
    assert len(calls) == 8 and len(runs.table) == 6
    assert runs.table["value"].max() == 2.0  # the slow warm-up calls are not in the table


def test_median_of_per_repeat_ratios_and_spread_on_known_times():
    # repeat 2 is "busy" for the baseline only: a ratio of medians would hide it differently
    clock, calls = FakeClock(), []
    times = {"plain": [1.0, 1.2, 3.0], "sd": [0.5, 0.5, 1.0], "slow": [2.0, 2.4, 6.0]}
    table, runs = compare(systems_with_times(clock, times, calls), repeats=3, clock=clock)
    ratios = per_repeat_ratios(runs, "plain")
    sd = ratios[ratios["system"] == "sd"].sort_values("repeat")["ratio"].to_numpy()
    np.testing.assert_allclose(sd, [2.0, 2.4, 3.0])
    row = table.set_index("system").loc["sd"]
    assert row["ratio"] == pytest.approx(2.4)
    assert row["ratio_min"] == pytest.approx(2.0) and row["ratio_max"] == pytest.approx(3.0)
    assert row["spread"] == pytest.approx((3.0 - 2.0) / 2.4)
    assert bool(row["spread_wide"]) and row["repeats"] == 3
    assert row["value"] == pytest.approx(0.5)  # median seconds
    slow = table.set_index("system").loc["slow"]
    assert slow["ratio"] == pytest.approx(0.5) and slow["spread"] == pytest.approx(0.0)
    assert not bool(slow["spread_wide"])
    base = table.set_index("system").loc["plain"]
    assert base["ratio"] == 1.0 and not bool(base["spread_wide"])
    assert list(table["system"]) == ["plain", "sd", "slow"]


def test_returned_measures_and_rates_are_oriented_so_above_one_is_better():
    outs = {"waves": iter([10.0, 12.0, 11.0]), "continuous": iter([5.0, 6.0, 5.0])}
    systems = {name: (lambda it=it: next(it)) for name, it in outs.items()}
    runs = interleave(systems, repeats=3, measure=lambda out, s: out)
    t = summarize(runs, baseline="waves").set_index("system")
    assert t.loc["continuous", "ratio"] == pytest.approx(2.0)  # median of 2.0, 2.0, 2.2
    assert t.loc["continuous", "ratio_max"] == pytest.approx(2.2)
    rates = Runs(pd.DataFrame({"repeat": [0, 0, 1, 1, 2, 2], "slot": 0,
                               "system": ["plain", "sd"] * 3, "seconds": 1.0,
                               "value": [100.0, 150.0, 90.0, 180.0, 100.0, 210.0]}),
                 higher_is_better=True)
    t = summarize(rates, "plain").set_index("system")
    assert t.loc["sd", "ratio"] == pytest.approx(2.0)
    assert t.loc["sd", "ratio_min"] == pytest.approx(1.5)
    assert t.loc["sd", "ratio_max"] == pytest.approx(2.1)


def test_threshold_decides_wide():
    assert not spread_stats([1.0, 1.1, 1.2])["spread_wide"]           # 0.2/1.1 = 0.18
    assert spread_stats([1.0, 1.1, 1.4])["spread_wide"]               # 0.4/1.1 = 0.36
    assert not spread_stats([1.0, 1.1, 1.4], wide=0.5)["spread_wide"]
    assert WIDE_SPREAD == 0.25


@pytest.mark.parametrize("repeats", [0, 1, 2, 2.5, "3", True])
def test_fewer_than_three_repeats_are_refused_before_anything_runs(repeats):
    calls = []
    with pytest.raises(ValueError, match=f"repeats must be an integer >= 3.*{repeats!r}"):
        interleave({"a": lambda: calls.append(1)}, repeats=repeats)
    assert calls == []


def test_bad_measures_baselines_and_thresholds_are_named():
    with pytest.raises(ValueError, match="measure must be a positive finite number"):
        interleave({"a": lambda: 0.0}, repeats=3, measure=lambda out, s: out)
    runs = interleave({"a": lambda: None, "b": lambda: None}, repeats=3)
    with pytest.raises(ValueError, match="baseline 'c' is not a system"):
        summarize(runs, "c")
    with pytest.raises(ValueError, match="wide must be a positive number"):
        summarize(runs, "a", wide=0)
    with pytest.raises(ValueError, match="at least one system"):
        interleave({}, repeats=3)


def test_printouts_say_when_the_spread_is_wide():
    assert format_ratio(1.854, 1.7, 1.93, False) == "1.85x (1.70-1.93)"
    assert format_ratio(1.0, 0.5, 2.0, True).endswith("WIDE SPREAD")
    table = pd.DataFrame({"system": ["a", "b"], "ratio": [1.0, 2.0],
                          "spread_wide": [False, True]})
    assert "WIDE SPREAD in 1 of 2 rows" in spread_note(table)
    assert "within 25%" in spread_note(table.assign(spread_wide=False))
    text = markdown(table)
    assert text.splitlines() == ["| system | ratio | spread_wide |", "|---|---|---|",
                                 "| a | 1.00 | no |", "| b | 2.00 | yes |"]
