"""workbench.speedup: interleaved side-by-side timing, median of per-repeat ratios, spread."""
import numpy as np
import pandas as pd
import pytest

from workbench.speedup import (WIDE_SPREAD, Runs, compare, disturbed_share, interleave, markdown,
                               per_repeat_ratios, run_order, spread_note, spread_stats, summarize)


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
    with pytest.raises(ValueError, match=r"system 'a', repeat 0: the measure must be a finite number > 0, got 0\.0"):
        interleave({"a": lambda: 0.0}, repeats=3, measure=lambda out, s: out)
    runs = interleave({"a": lambda: None, "b": lambda: None}, repeats=3)
    with pytest.raises(ValueError, match="baseline 'c' is not a system"):
        summarize(runs, "c")
    with pytest.raises(ValueError, match="wide must be a finite number > 0, got 0"):
        summarize(runs, "a", wide=0)
    with pytest.raises(ValueError, match="at least one system"):
        interleave({}, repeats=3)


def test_printouts_say_when_the_spread_is_wide():
    table = pd.DataFrame({"system": ["a", "b"], "ratio": [1.0, 2.0],
                          "spread_wide": [False, True]})
    assert "WIDE SPREAD in 1 of 2 rows" in spread_note(table)
    assert "within 25%" in spread_note(table.assign(spread_wide=False))
    text = markdown(table)
    assert text.splitlines() == ["| system | ratio | spread_wide |", "|---|---|---|",
                                 "| a | 1.00 | no |", "| b | 2.00 | yes |"]


# ---- sd_sweep: the interleaved SD sweep ---------------------------------------------------

def spied_engine(tokenizer, calls, makespans=None):
    """A tiny float64 engine whose rollout records (kind, k, batch size, temperature); with
    ``makespans`` (an iterator), each result's timeline reports the next one as its makespan."""
    from types import SimpleNamespace

    from workbench.rollout import RolloutEngine

    from .helpers.models import tiny_model
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    real = engine.rollout

    def rollout(prompts, config=None, progress=True, drafter=None, **kw):
        kind = "plain" if drafter is None else drafter.name
        calls.append((kind, config.spec_k if drafter is not None else None,
                      config.max_batch_size, config.temperature))
        result = real(prompts, config, progress=progress, drafter=drafter, **kw)
        if makespans is not None:
            t = result.timeline
            result.timeline = SimpleNamespace(steps=t.steps, requests=t.requests,
                                              clock=t.clock, makespan_s=next(makespans))
        return result

    engine.rollout = rollout
    return engine


def test_sd_sweep_interleaves_plain_and_sd_and_reports_the_spread(tokenizer):
    from workbench.speculative import NGramDrafter
    from workbench.speculative.sweep import SPREAD_COLUMNS, sd_sweep, sweep_spread_note

    from .helpers.models import PROMPTS
    calls = []
    engine = spied_engine(tokenizer, calls)
    table = sd_sweep(engine, PROMPTS[:3], {"ngram": NGramDrafter()}, ks=(1, 2),
                     batch_sizes=(1, 3), temperatures=(0.0,), repeats=3, max_new_tokens=12,
                     progress=False)
    # per (temperature, batch size): 3 repeats, each running plain, ngram k=1, ngram k=2 once,
    # the order rotating, before the next batch size starts
    assert len(calls) == 2 * 3 * 3
    for cell, bs in enumerate((1, 3)):
        cell_calls = calls[cell * 9:(cell + 1) * 9]
        assert {c[2] for c in cell_calls} == {bs}
        repeats = [[(c[0], c[1]) for c in cell_calls[r * 3:(r + 1) * 3]] for r in range(3)]
        assert repeats[0] == [("plain", None), ("ngram", 1), ("ngram", 2)]
        assert repeats[1] == [("ngram", 1), ("ngram", 2), ("plain", None)]
        assert repeats[2] == [("ngram", 2), ("plain", None), ("ngram", 1)]
    assert len(table) == 4 and set(SPREAD_COLUMNS) <= set(table.columns)
    for col in ("speedup", "tau", "T1", "Td", "Tv", "bound", "identical", "diverged_at",
                "plain_tok_s", "sd_tok_s", "plain_s", "sd_s", "tokens"):
        assert col in table.columns
    assert (table["speedup_min"] <= table["speedup"]).all()
    assert (table["speedup"] <= table["speedup_max"]).all()
    np.testing.assert_allclose(table["speedup_spread"],
                               (table["speedup_max"] - table["speedup_min"]) / table["speedup"])
    assert (table["repeats"] == 3).all() and table["identical"].all()  # float64, greedy
    assert table["spread_wide"].dtype == bool
    # the note names the wide rows, whichever way this run's timings fell
    wide = table.assign(spread_wide=[True, False, False, False])
    assert "T=0 batch 1 ngram k=1" in sweep_spread_note(wide)
    assert "ngram" not in sweep_spread_note(table.assign(spread_wide=False))


def test_sd_sweep_speedup_is_the_median_of_per_repeat_token_rate_ratios(tokenizer):
    """Makespans scripted per call: the busy repeat of the SD system does not move the median,
    and the ratio is taken inside each repeat (not as a ratio of medians)."""
    from workbench.speculative import NGramDrafter
    from workbench.speculative.sweep import sd_sweep, sweep_spread_note

    from .helpers.models import PROMPTS
    makespans = iter([1.0, 0.5,    # repeat 0: plain, sd -> 2.0
                      2.0, 1.0,    # repeat 1: sd, plain -> 1.0 / 2.0 = 0.5
                      4.0, 1.0])   # repeat 2: plain, sd -> 4.0
    engine = spied_engine(tokenizer, [], makespans)
    table = sd_sweep(engine, PROMPTS[:2], {"ngram": NGramDrafter()}, ks=(2,), batch_sizes=(2,),
                     repeats=3, max_new_tokens=8, progress=False)
    row = table.iloc[0]
    # equal tokens (greedy, lossless), so each per-repeat ratio is plain / SD makespan
    assert row["speedup"] == pytest.approx(2.0)
    assert row["speedup_min"] == pytest.approx(0.5) and row["speedup_max"] == pytest.approx(4.0)
    assert row["speedup_spread"] == pytest.approx(1.75) and bool(row["spread_wide"])
    # the medians of the makespans (1.0 and 1.0) would have said 1.0x
    assert row["plain_s"] == pytest.approx(1.0) and row["sd_s"] == pytest.approx(1.0)
    assert "WIDE SPREAD in 1 of 1 configurations" in sweep_spread_note(table)
    assert "batch 2 ngram k=2: 2.00x (0.50-4.00)" in sweep_spread_note(table)


def test_sd_sweep_refuses_fewer_than_three_repeats_before_running(tokenizer):
    from workbench.speculative.sweep import sd_sweep
    calls = []
    engine = spied_engine(tokenizer, calls)
    with pytest.raises(ValueError, match="repeats must be an integer >= 3.*got 1"):
        sd_sweep(engine, ["a1?"], {}, repeats=1, progress=False)
    assert calls == []


class SharedCore:
    """A usage probe double: each reading one wall second after the last, with CPU time
    advancing by the next of ``shares`` (a call's share of a core is the share read at its
    end)."""

    def __init__(self, shares):
        self.shares, self.cpu, self.wall = iter(shares), 0.0, 0.0

    def __call__(self) -> tuple[float, float]:
        self.wall += 1.0
        self.cpu += next(self.shares, 1.0)
        return self.cpu, self.wall


def test_a_disturbed_repeat_runs_again_and_one_still_disturbed_is_flagged():
    calls = []
    systems = {"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 1.0}
    # two readings per call, the second giving its share: repeat 0 disturbed once, then
    # clean; repeat 1 disturbed on both tries (redo=1), then kept and flagged; repeat 2 clean
    whole, half = [1.0, 1.0], [1.0, 0.5]
    shares = (whole + half + whole + whole) + (half + whole) * 2 + whole + whole
    runs = interleave(systems, 3, measure=lambda out, s: out, redo=1,
                      usage=SharedCore(shares))
    t = runs.table
    assert t.groupby("repeat")["redone"].first().tolist() == [1, 1, 0]
    assert t.groupby("repeat")["disturbed"].first().tolist() == [False, True, False]
    assert len(calls) == 2 * (2 + 2 + 1)
    assert len(runs.outputs["a"]) == 3  # one output per kept repeat
    table = summarize(runs)
    assert table["disturbed_share"].tolist() == [pytest.approx(1 / 3)] * 2
    assert disturbed_share(runs) == pytest.approx(1 / 3)  # the repeats', as one figure


def test_redo_must_be_a_count():
    with pytest.raises(ValueError, match="redo must be an integer >= 0, got -1"):
        interleave({"a": lambda: 1.0}, 3, redo=-1)
