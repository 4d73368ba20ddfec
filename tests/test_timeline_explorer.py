"""The timeline explorer, driven without a browser: set a control's value, read the figure and
the panel. Its run folders hold real rollout timelines of a tiny model."""
import html
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from workbench.rl.ablation.runner import Ablation  # noqa: E402
from workbench.rollout import RolloutEngine, Timeline  # noqa: E402
from workbench.viz.timeline import gantt  # noqa: E402
from workbench.viz.timeline_explorer import (  # noqa: E402
    NOT_RECORDED, TimelineExplorer, find_timelines)

from .helpers.models import PROMPTS, tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer):
    """``root/a/timeline`` (2 workers) and ``root/b/timelines/step00..01`` (3 workers)."""
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=3), tokenizer)
    root = tmp_path_factory.mktemp("runs")
    a = engine.rollout(PROMPTS, max_new_tokens=24, workers=2, progress=False)
    a.timeline.save(root / "a" / "timeline")
    for step in range(2):
        b = engine.rollout(PROMPTS, max_new_tokens=24, workers=3, temperature=1.0, seed=step,
                           progress=False)
        b.timeline.save(root / "b" / "timelines" / f"step{step:02d}")
    (root / "b" / "metrics.json").write_text("{}")  # what a notebook leaves in its run folder
    return SimpleNamespace(root=root, a=a, b=b)


def step_collections(ax, kind):
    return [c for c in ax.collections if (c.get_gid() or "").startswith(f"steps-{kind}-")]


def test_engine_writes_request_text_and_save_load_keeps_it(runs):
    tl = runs.a.timeline
    assert tl.requests["text"].tolist() == runs.a.texts
    assert str(tl.requests["text"].dtype) == "string"
    back = Timeline.load(runs.root / "a")
    pd.testing.assert_frame_equal(back.requests, tl.requests)


def test_a_requests_table_saved_without_text_still_loads(runs, tmp_path):
    folder = runs.a.timeline.save(tmp_path / "old" / "timeline")
    old = pd.read_parquet(folder / "requests.parquet").drop(columns="text")
    old.to_parquet(folder / "requests.parquet", index=False)
    back = Timeline.load(folder)
    assert back.requests["text"].isna().all() and str(back.requests["text"].dtype) == "string"
    explorer = TimelineExplorer(tmp_path / "old")
    assert NOT_RECORDED in explorer.panel.value


def test_find_timelines_names_runs_by_folder_and_steps_by_path(runs):
    found = find_timelines(runs.root)
    assert {run: list(steps) for run, steps in found.items()} == {
        "a": ["timeline"], "b": ["timelines/step00", "timelines/step01"]}
    # a run folder on its own is one run, named after itself
    assert list(find_timelines(runs.root / "b")) == ["b"]
    assert list(find_timelines(runs.root / "a")["a"]) == ["timeline"]


def test_find_timelines_skips_hidden_folders(runs, tmp_path):
    runs.a.timeline.save(tmp_path / "x" / "timeline")
    runs.a.timeline.save(tmp_path / ".x.tmp" / "timeline")  # e.g. an atomic write under way
    assert {run: list(steps) for run, steps in find_timelines(tmp_path).items()} == {
        "x": ["timeline"]}


def test_window_zooms_the_time_axis(runs):
    explorer = TimelineExplorer(runs.root, run="a")
    makespan = runs.a.timeline.makespan_s
    assert explorer.figure.axes[0].get_xlim() == pytest.approx((0, makespan))
    explorer.controls["window"].value = (0.25 * makespan, 0.5 * makespan)
    assert explorer.figure.axes[0].get_xlim() == pytest.approx((0.25 * makespan, 0.5 * makespan))
    assert explorer.png().startswith(b"\x89PNG")


def test_toggling_a_kind_off_removes_its_step_shading(runs):
    explorer = TimelineExplorer(runs.root, run="a")
    kinds = explorer.controls["kinds"]
    assert set(kinds.options) == {"prefill", "decode"} and set(kinds.value) == set(kinds.options)
    before = len(explorer.figure.axes[0].collections)
    assert len(step_collections(explorer.figure.axes[0], "decode")) == 2  # one per worker
    kinds.value = ("prefill",)
    ax = explorer.figure.axes[0]
    assert not step_collections(ax, "decode") and step_collections(ax, "prefill")
    assert len(ax.collections) == before - 2
    assert [t.get_text() for t in ax.get_legend().get_texts()][:1] == ["prefill"]


def test_choosing_a_request_shows_its_text_length_and_outline(runs):
    explorer = TimelineExplorer(runs.root, run="a")
    req = runs.a.timeline.requests
    longest = req["response_tokens"].max()
    assert explorer.controls["request"].value in set(req.loc[req["response_tokens"] == longest,
                                                             "uid"])
    row = req.sort_values("response_tokens").iloc[0]
    explorer.controls["request"].value = int(row["uid"])
    assert html.escape(row["text"]) in explorer.panel.value
    assert f"{row['response_tokens']} (finish: {row['finish']})" in explorer.panel.value
    outline = next(p for p in explorer.figure.axes[0].patches
                   if p.get_gid() == "selected-request")
    assert outline.get_x() == pytest.approx(row["start_s"])
    assert outline.get_width() == pytest.approx(row["end_s"] - row["start_s"])


def test_switching_run_updates_the_steps_and_redraws_once(runs):
    explorer = TimelineExplorer(runs.root, run="a")
    assert list(explorer.controls["step"].options) == ["timeline"]
    redraws = explorer.redraws
    explorer.controls["run"].value = "b"
    assert explorer.redraws == redraws + 1
    assert list(explorer.controls["step"].options) == ["timelines/step00", "timelines/step01"]
    assert explorer.controls["step"].value == "timelines/step00"
    assert explorer.figure.axes[0].get_ylim() == (3, 0)  # b's three workers
    assert explorer.controls["window"].value[1] == pytest.approx(explorer.timeline.makespan_s)
    explorer.controls["step"].value = "timelines/step01"
    assert explorer.redraws == redraws + 2
    assert explorer.timeline.requests["text"].tolist() == runs.b.texts


def test_hidden_kinds_stay_hidden_across_steps(runs):
    explorer = TimelineExplorer(runs.root, run="b")
    explorer.controls["kinds"].value = ("decode",)
    explorer.controls["step"].value = "timelines/step01"
    assert explorer.controls["kinds"].value == ("decode",)


def test_errors_name_the_folder_and_the_accepted_names(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved timeline under .*timeline.json"):
        TimelineExplorer(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        TimelineExplorer(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"run 'c' not found .*accepted: \['a', 'b'\]"):
        TimelineExplorer(runs.root, run="c")
    with pytest.raises(ValueError, match=r"step 'x' not found in run 'b'; accepted: "
                                         r"\['timelines/step00', 'timelines/step01'\]"):
        TimelineExplorer(runs.root, run="b", step="x")
    with pytest.raises(ValueError, match=r"unknown step kind\(s\) \['idle'\]"):
        gantt(runs.a.timeline, kinds=["idle"])


def test_ablation_saves_each_step_timeline_by_variant_and_seed(runs, tmp_path):
    tl = runs.a.timeline
    trainers = {(v, s): SimpleNamespace(record=SimpleNamespace(timelines={0: tl, 1: tl}))
                for v in ("baseline", "tlt") for s in (0, 1)}
    ablation = Ablation(pd.DataFrame(), pd.DataFrame(), trainers)
    saved = ablation.save_timelines(tmp_path / "timelines", seeds=[0])
    assert [p.relative_to(tmp_path).as_posix() for p in saved] == [
        "timelines/baseline-seed0/step00", "timelines/baseline-seed0/step01",
        "timelines/tlt-seed0/step00", "timelines/tlt-seed0/step01"]
    assert Timeline.load(saved[-1]).summary() == tl.summary()
    assert len(ablation.save_timelines(tmp_path / "all")) == 8
    with pytest.raises(ValueError, match=r"seed\(s\) \[2\]; accepted: \[0, 1\]"):
        ablation.save_timelines(tmp_path / "x", seeds=[2])


def test_the_legend_sits_outside_the_chart_and_the_title_names_run_and_step(runs):
    """The step kinds' legend lies between the title and the chart, over no request bar."""
    from .helpers.figures import assert_legends_clear_of_the_axes
    explorer = TimelineExplorer(runs.root, run="b", step="timelines/step01")
    assert_legends_clear_of_the_axes(explorer.figure)
    assert explorer.figure.get_suptitle() == "run b · step timelines/step01"
    explorer.controls["window"].value = (0.0, 0.5 * explorer.timeline.makespan_s)
    assert_legends_clear_of_the_axes(explorer.figure)
