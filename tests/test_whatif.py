"""The SD what-if model (speculative.whatif): hand-computed makespans on a synthetic rollout."""
import math

import numpy as np
import pandas as pd
import pytest

from workbench.speculative.whatif import (WHATIF_COLUMNS, measured_speedups, measured_threshold,
                                          sd_whatif, speedup_at, whatif_table)
from .helpers.tables import STEPS, make_sweep, make_timeline


def test_speedup_interpolates_in_log_batch_and_clamps_outside():
    m = measured_speedups(make_sweep(), "eagle", 4, 0.0)
    got = speedup_at(m, [1, 2, 3, 4, 8, 16])
    # batch 2 lies halfway between 1 and 4 in log2; batch 3 at log2(3)/2 of the way
    want = [2.0, 1.75, 2.0 - 0.5 * math.log2(3) / 2, 1.5, 1.0, 1.0]
    assert np.allclose(got, want)
    assert np.allclose(speedup_at(measured_speedups(make_sweep(), "ngram", 2, 0.0), [1, 64]),
                       [1.2, 1.2])


def test_makespan_by_hand():
    w = sd_whatif(make_timeline(), make_sweep(), threshold=2, drafter="eagle", k=4,
                  temperature=0.0)
    # worker 0: prefill 0.1 + decode@4 0.4 (above threshold) + 0.5/1.75 + 1.0/2.0
    # worker 1: prefill 0.1 + decode@3 0.5 + 0.2/1.75; worker 2 ran nothing
    before = [2.0, 0.8, 0.0]
    after = [0.1 + 0.4 + 0.5 / 1.75 + 0.5, 0.1 + 0.5 + 0.2 / 1.75, 0.0]
    assert np.allclose(w.workers["recorded_s"], before)
    assert np.allclose(w.workers["whatif_s"], after)
    assert w.workers["sd_steps"].tolist() == [2, 1, 0]
    assert w.workers["decode_steps"].tolist() == [3, 2, 0]
    assert w.makespan_recorded_s == pytest.approx(2.0)
    assert w.makespan_whatif_s == pytest.approx(after[0])
    assert w.speedup == pytest.approx(2.0 / after[0])
    assert w.clock == "sim" and w.beyond_measured == 0
    assert w.summary()["sd_steps"] == 3


def test_threshold_one_only_touches_batch_one_and_high_threshold_everything():
    tl, sweep = make_timeline(), make_sweep()
    one = sd_whatif(tl, sweep, 1, "eagle", 4, 0.0)
    assert np.allclose(one.workers["whatif_s"], [1.5, 0.8, 0.0])
    flat = sd_whatif(tl, sweep, 100, "eagle", 4, 1.0)  # 3x on every decode step, prefill as is
    assert np.allclose(flat.workers["whatif_s"], [0.1 + 1.9 / 3, 0.1 + 0.7 / 3, 0.0])


def test_steps_outside_the_measured_batches_take_the_nearest_point_and_are_counted():
    w = sd_whatif(make_timeline(), make_sweep(), 4, "ngram", 2, 0.0)
    # every decode step (batches 4, 2, 1, 3, 2) at ngram's one measured speedup 1.2
    assert np.allclose(w.workers["whatif_s"], [0.1 + 1.9 / 1.2, 0.1 + 0.7 / 1.2, 0.0])
    assert w.beyond_measured == 3  # batches 4, 1 and 3


@pytest.mark.parametrize("threshold", [-1, 2.5, True, "4"])
def test_threshold_must_be_a_non_negative_integer(threshold):
    with pytest.raises(ValueError, match="threshold .* integer >= 0"):
        sd_whatif(make_timeline(), make_sweep(), threshold, "eagle", 4, 0.0)


def test_the_measured_threshold_is_where_this_machines_curve_stops_paying():
    sweep = make_sweep()
    assert measured_threshold(sweep, "eagle", 4, 0.0) == 4   # 2.0, 1.5, then 1.0 at batch 8
    assert measured_threshold(sweep, "eagle", 4, 1.0) == 4   # pays at every measured size
    losing = sweep.assign(speedup=0.9)
    assert measured_threshold(losing, "eagle", 4, 0.0) == 0  # pays nowhere: SD off
    nowhere = sd_whatif(make_timeline(), losing, 0, "eagle", 4, 0.0)
    assert nowhere.speedup == 1.0 and nowhere.summary()["sd_steps"] == 0


def test_missing_setting_names_what_was_measured():
    with pytest.raises(ValueError, match=r"drafter='eagle', k=2.*\('eagle', 4, 0\.0\)"):
        sd_whatif(make_timeline(), make_sweep(), 2, "eagle", 2, 0.0)
    with pytest.raises(ValueError, match=r"temperature=0\.5.*\('ngram', 2, 0\.0\)"):
        sd_whatif(make_timeline(), make_sweep(), 2, "ngram", 2, 0.5)


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match=r"missing columns \['speedup'\]"):
        sd_whatif(make_timeline(), make_sweep().drop(columns="speedup"), 2, "eagle", 4, 0.0)
    twice = pd.concat([make_sweep(), make_sweep().head(1)])
    with pytest.raises(ValueError, match=r"batch sizes \[1.0\] are measured more than once"):
        sd_whatif(make_timeline(), twice, 2, "eagle", 4, 0.0)
    nan = make_sweep().assign(speedup=[2.0, float("nan"), 1.0, 1.2, 3.0, 3.0])
    with pytest.raises(ValueError, match="not positive numbers"):
        sd_whatif(make_timeline(), nan, 2, "eagle", 4, 0.0)
    with pytest.raises(TypeError, match="Timeline"):
        sd_whatif("steps.parquet", make_sweep(), 2, "eagle", 4, 0.0)


def test_a_timeline_that_already_ran_sd_is_refused():
    sd = make_timeline(STEPS + [(1, "draft", 0.8, 0.9, 2), (1, "verify", 0.9, 1.0, 2)])
    with pytest.raises(ValueError, match=r"already has SD steps \(\['draft', 'verify'\]"):
        sd_whatif(sd, make_sweep(), 2, "eagle", 4, 0.0)


def test_the_table_holds_every_setting_as_sd_whatif_computes_it(tmp_path):
    table = whatif_table(make_timeline(), make_sweep(), temperature=0.0)
    assert list(table.columns) == list(WHATIF_COLUMNS)
    # (eagle, 4) and (ngram, 2) at T=0; thresholds 0..4 (the largest live decode batch); 3 workers
    assert len(table) == 2 * 5 * 3
    assert sorted(set(zip(table["drafter"], table["k"]))) == [("eagle", 4), ("ngram", 2)]
    assert sorted(table["threshold"].unique()) == [0, 1, 2, 3, 4]
    for (drafter, k, threshold), rows in table.groupby(["drafter", "k", "threshold"]):
        want = sd_whatif(make_timeline(), make_sweep(), threshold, drafter, k, 0.0)
        for column in ("worker", "recorded_s", "whatif_s", "sd_steps", "decode_steps"):
            assert np.allclose(rows[column], want.workers[column]), (drafter, k, threshold)
        summary = want.summary()
        for column in ("makespan_recorded_s", "makespan_whatif_s", "speedup",
                       "beyond_measured", "clock", "temperature"):
            assert set(rows[column]) == {summary[column]}, column
        assert set(rows["measured_threshold"]) == {
            measured_threshold(make_sweep(), drafter, k, 0.0)}
    make_timeline().save(tmp_path / "run" / "timeline")  # a run folder works as the timeline
    from_files = whatif_table(tmp_path / "run", make_sweep(), 0.0)
    assert np.allclose(from_files["whatif_s"], table["whatif_s"])


def test_the_table_refuses_what_it_cannot_model():
    with pytest.raises(ValueError, match=r"temperature None.*\[0.0, 1.0\]"):
        whatif_table(make_timeline(), make_sweep())
    with pytest.raises(ValueError, match=r"temperature 0.5.*\[0.0, 1.0\]"):
        whatif_table(make_timeline(), make_sweep(), temperature=0.5)
    prefill_only = make_timeline([s for s in STEPS if s[1] == "prefill"])
    with pytest.raises(ValueError, match="no decode steps"):
        whatif_table(prefill_only, make_sweep(), 0.0)
    with pytest.raises(TypeError, match="Timeline"):
        whatif_table(42, make_sweep(), 0.0)
    # a sweep with one temperature needs none named
    assert set(whatif_table(make_timeline(), make_sweep().query("temperature == 1.0"))
               ["temperature"]) == {1.0}
