import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from workbench.evaluate import EvalReport  # noqa: E402
from workbench.rollout.timeline import Timeline  # noqa: E402
from workbench.viz import (  # noqa: E402
    accuracy_by_bucket, active_batch, gantt, length_distributions, length_histogram, save_figure)
from workbench.viz.timeline import pack_lanes  # noqa: E402

# (worker, kind, start, end, batch_size) -- worker 1 finishes rollout early, then trains the drafter
STEPS = [(0, "prefill", 0.0, 0.1, 4), (0, "decode", 0.1, 0.5, 4), (0, "decode", 0.5, 1.0, 2),
         (0, "decode", 1.0, 2.0, 1),
         (1, "prefill", 0.0, 0.1, 3), (1, "decode", 0.1, 0.6, 3), (1, "decode", 0.6, 0.8, 2),
         (1, "drafter_train", 0.8, 1.5, 0),
         (2, "prefill", 0.0, 0.2, 3), (2, "decode", 0.2, 1.2, 3)]
# (worker, end_s, response_tokens)
REQUESTS = [(0, 0.5, 10), (0, 0.5, 12), (0, 1.0, 30), (0, 2.0, 80),
            (1, 0.6, 14), (1, 0.8, 20), (1, 0.8, 21),
            (2, 1.2, 40), (2, 1.2, 41), (2, 1.2, 42)]


def make_timeline(clock="sim") -> Timeline:
    counters = {}
    steps = []
    for w, kind, start, end, size in STEPS:
        counters[w] = counters.get(w, -1) + 1
        steps.append({"worker": w, "step": counters[w], "kind": kind, "start_s": start,
                      "end_s": end, "batch_size": size, "tokens": size, "forward_s": end - start})
    requests = [{"worker": w, "uid": i, "prompt_id": i, "sample_idx": 0, "start_s": 0.0,
                 "end_s": end, "prompt_tokens": 5, "response_tokens": n, "finish": "eos",
                 "verify_steps": 0, "drafted": 0, "accepted": 0, "reward": float("nan")}
                for i, (w, end, n) in enumerate(REQUESTS)]
    return Timeline.from_records(steps, requests, num_workers=3, clock=clock)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def by_gid(ax, gid):
    found = [a for a in ax.get_children() if a.get_gid() == gid]
    assert len(found) == 1, f"expected one artist with gid {gid!r}, found {len(found)}"
    return found[0]


def x_extents(collection):
    return sorted((round(float(p.vertices[:, 0].min()), 9), round(float(p.vertices[:, 0].max()), 9))
                  for p in collection.get_paths())


def test_gantt_draws_one_bar_per_request_spanning_its_time():
    tl = make_timeline()
    ax = gantt(tl).axes[0]
    bars = by_gid(ax, "requests")
    expected = sorted((0.0, e) for _, e, _ in REQUESTS)
    assert x_extents(bars) == expected
    assert sorted(bars.get_array()) == sorted(n for _, _, n in REQUESTS)


def test_gantt_bars_stay_in_their_worker_band_with_capped_lanes():
    tl = make_timeline()
    ax = gantt(tl, max_lanes_per_worker=2).axes[0]
    bars = by_gid(ax, "requests")
    assert len(bars.get_paths()) == len(REQUESTS)
    rows = [p.vertices[:, 1] for p in bars.get_paths()]
    # bars are drawn longest first; recover each bar's worker from its band
    workers = sorted(int(np.floor(y.min())) for y in rows)
    assert workers == sorted(w for w, _, _ in REQUESTS)
    assert all(np.floor(y.min()) == np.floor(y.max()) for y in rows)
    with pytest.raises(ValueError, match="max_lanes_per_worker"):
        gantt(tl, max_lanes_per_worker=0)


def test_pack_lanes_reuses_lanes_of_finished_requests_and_folds_over_the_cap():
    starts, ends = np.array([0.0, 1.0, 0.0, 0.0]), np.array([1.0, 2.0, 2.0, 3.0])
    assert pack_lanes(starts, ends, max_lanes=8).tolist() == [0, 0, 1, 2]
    assert pack_lanes(starts, ends, max_lanes=2).tolist() == [0, 0, 1, 0]


def test_gantt_idle_bubbles_equal_timeline_idle_time():
    tl = make_timeline()
    ax = gantt(tl).axes[0]
    idle = tl.idle_s()
    for w in range(tl.num_workers):
        (start, end), = x_extents(by_gid(ax, f"idle-w{w}"))
        assert end - start == pytest.approx(idle[w])
        assert end == pytest.approx(tl.makespan_s)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[1] == "worker 1\nidle 1.20 s (60%)"
    # the drafter-training step is shaded inside worker 1's bubble
    assert x_extents(by_gid(ax, "steps-drafter_train-w1")) == [(0.8, 1.5)]


def test_gantt_names_clock_title_measures_and_tail_start():
    tl = make_timeline(clock="wall")
    ax = gantt(tl).axes[0]
    assert "wall clock" in ax.get_xlabel()
    assert f"idle {tl.idle_fraction():.0%}" in ax.get_title()
    assert f"tail share {tl.tail_share():.0%}" in ax.get_title()
    ends = np.sort([e for _, e, _ in REQUESTS])
    t90 = ends[int(np.ceil(0.9 * len(ends))) - 1]
    assert by_gid(ax, "tail-start").get_xdata()[0] == pytest.approx(t90)


@pytest.mark.parametrize("folder", ["run", "run/timeline"])
def test_figures_redraw_from_a_run_folder(tmp_path, folder):
    tl = make_timeline()
    tl.save(tmp_path / "run" / "timeline")
    for path in (tmp_path / folder, str(tmp_path / folder)):
        assert len(by_gid(gantt(path).axes[0], "requests").get_paths()) == len(REQUESTS)
        assert by_gid(active_batch(path).axes[0], "active-batch-w0").get_ydata()[0] == 4
        assert by_gid(length_histogram(path).axes[0], "p50").get_xdata()[0] == 25.5


def test_timeline_figures_reject_an_engine_or_other_objects():
    with pytest.raises(TypeError, match="Timeline or a run folder"):
        gantt(object())


def test_length_histogram_marks_percentiles_at_their_values():
    tl = make_timeline()
    lengths = [n for _, _, n in REQUESTS]
    for source in (tl, lengths):
        ax = length_histogram(source, log=True).axes[0]
        for q in (50, 90, 99):
            line = by_gid(ax, f"p{q}")
            value = np.percentile(lengths, q)
            assert line.get_xdata()[0] == pytest.approx(value)
            assert line.get_label() == f"p{q} = {value:.0f}"
        assert ax.get_yscale() == "log"
        assert sum(p.get_height() for p in ax.patches) == len(lengths)


def test_active_batch_follows_batch_sizes_and_ignores_drafter_training():
    tl = make_timeline()
    ax = active_batch(tl).axes[0]
    w0 = by_gid(ax, "active-batch-w0")
    assert list(w0.get_xdata()) == [0.0, 0.1, 0.5, 1.0, 2.0]
    assert list(w0.get_ydata()) == [4, 4, 2, 1, 0]
    w1 = by_gid(ax, "active-batch-w1")
    assert list(w1.get_xdata()) == [0.0, 0.1, 0.6, 0.8]
    assert list(w1.get_ydata()) == [3, 3, 2, 0]
    assert "sim clock" in ax.get_xlabel()


def test_figures_draw_on_a_given_axes():
    fig, axes = plt.subplots(1, 2)
    assert gantt(make_timeline(), ax=axes[0]) is fig
    assert active_batch(make_timeline(), ax=axes[1]) is fig
    assert by_gid(axes[1], "active-batch-w2").get_ydata()[0] == 3


def test_save_figure_writes_png_atomically(tmp_path):
    fig = gantt(make_timeline())
    out = save_figure(fig, tmp_path / "figs" / "gantt.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["gantt.png"]
    with pytest.raises(ValueError, match="PNG"):
        save_figure(fig, tmp_path / "gantt.pdf")


def test_length_distributions_marks_both_sets():
    ref, gen = [10, 20, 30, 40, 200], [12, 25, 35, 90, 300, 310]
    ax = length_distributions(ref, gen).axes[0]
    for name, lengths in (("reference", ref), ("generated", gen)):
        for q in (50, 90, 99):
            line = by_gid(ax, f"{name}-p{q}")
            assert line.get_xdata()[0] == pytest.approx(np.percentile(lengths, q))
            assert line.get_label().startswith(f"{name} p{q} = ")
    assert sum(p.get_height() for p in ax.patches) == len(ref) + len(gen)


def test_length_distributions_without_references_draws_the_generated_alone():
    """A JSONL task without references has NaN reference lengths: no reference histogram, no
    reference percentiles, and the title says why; a partial set keeps its finite lengths."""
    gen = [12, 25, 35, 90, 300, 310]
    ax = length_distributions([np.nan] * len(gen), gen).axes[0]
    gids = {a.get_gid() for a in [*ax.lines, *ax.patches]}
    assert "generated-hist" in gids and not any(g and g.startswith("reference") for g in gids)
    assert "no reference traces" in ax.get_title()
    assert sum(p.get_height() for p in ax.patches) == len(gen)
    ax = length_distributions([10, np.nan, 30], gen).axes[0]
    assert by_gid(ax, "reference-p50").get_xdata()[0] == pytest.approx(20)
    assert ax.get_title() == "Response lengths: reference vs generated"
    with pytest.raises(ValueError, match="no generated lengths"):
        length_distributions([1, 2], [])


def test_eval_report_without_references_buckets_by_response_length():
    table = pd.DataFrame({"reference_tokens": [np.nan] * 3, "response_tokens": [5, 40, 300],
                          "reward": [1.0, 0.0, 0.0], "finished_eos": [True, True, False]})
    report = EvalReport(table)
    assert report.reference_count == 0 and report.length_column() == "response_tokens"
    assert "no reference traces" in report.reference_note()
    assert "skipped" in report.reference_note()
    buckets = report.by_bucket()
    assert "response_tokens bucket" in buckets and buckets["problems"].sum() == 3
    partial = EvalReport(table.assign(reference_tokens=[4.0, np.nan, np.nan]))
    assert partial.length_column() == "reference_tokens"
    assert "1 of 3 problems" in partial.reference_note()
    assert partial.by_bucket()["problems"].tolist() == [1]


def test_accuracy_by_bucket_draws_one_bar_per_bucket():
    table = pd.DataFrame({"reference_tokens": [5, 10, 40, 50, 60, 300],
                          "reward": [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
                          "finished_eos": [True, True, True, True, False, False]})
    buckets = EvalReport(table).by_bucket()
    ax = accuracy_by_bucket(buckets).axes[0]
    bars = [p for p in ax.patches if p.get_gid() == "accuracy-bar"]
    assert [b.get_height() for b in bars] == pytest.approx(list(buckets["accuracy"]))
    counts = [t.get_text() for t in ax.texts]
    assert counts == [f"n={n}" for n in buckets["problems"]]
    assert [t.get_text() for t in ax.get_xticklabels()] == list(buckets["reference_tokens bucket"])
    with pytest.raises(ValueError, match="by_bucket"):
        accuracy_by_bucket(buckets.drop(columns="eos_rate"))
