"""The papermill pipeline runner, on tiny notebooks built in tmp_path (a few seconds per run)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell

from workbench.pipeline import PipelineError, load_results, run_pipeline, summarize
from .helpers.pipelines import project, write_pipeline, write_threads_notebook  # noqa: F401 (project: a fixture)
from .helpers.pipelines import write_notebook


def test_seeds_and_grid_write_runs_results_and_summary(project, tmp_path):
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/toy.ipynb
    grid: {x: [1, 2]}
    seeds: [0, 1]
""")
    runs_root = tmp_path / "runs"
    table = run_pipeline(yaml_path, runs_root=runs_root, jobs=2)  # the same table as jobs=1

    assert len(table) == 4
    assert (table["status"] == "ok").all() and not table["skipped"].any()
    assert table["error"].isna().all()
    assert sorted(zip(table["param.x"], table["param.seed"], table["metric.y"])) == [
        (1, 0, 2), (1, 1, 3), (2, 0, 4), (2, 1, 5)]
    assert "metric.extra.z" in table and "metric.curve" not in table  # nested flattened, lists dropped

    pipeline_dir = runs_root / "demo"
    for run_name, seed in zip(table["run_name"], table["param.seed"]):
        assert run_name.startswith("toy-x") and f"-seed{seed}-" in run_name
        run_dir = pipeline_dir / run_name
        assert (run_dir / "notebook.ipynb").is_file()
        assert json.loads((run_dir / "metrics.json").read_text())["extra"] == {"z": seed}
        record = json.loads((run_dir / "run.json").read_text())
        assert record["status"] == "ok" and record["error"] is None
        assert record["out_dir"] == str(run_dir.resolve())
        assert record["parameters"]["seed"] == seed and "out_dir" not in record["parameters"]
        assert run_name.endswith(record["param_hash"])
        assert {"python", "torch", "transformers", "papermill", "pandas", "workbench"} <= set(record["versions"])
        assert record["git"] is None  # tmp_path is not a git checkout
        assert record["duration_s"] > 0

    csv = pd.read_csv(pipeline_dir / "results.csv")
    parquet = load_results(pipeline_dir)
    assert list(csv["metric.y"]) == list(parquet["metric.y"]) == list(table["metric.y"])
    assert not list(pipeline_dir.glob(".*.tmp"))

    summary = summarize(parquet).set_index("param.x")
    assert "param.seed" not in summary
    assert list(summary["n_ok"]) == [2, 2] and list(summary["n_failed"]) == [0, 0]
    assert summary.loc[1, "metric.y.mean"] == 2.5 and summary.loc[2, "metric.y.mean"] == 4.5
    assert math.isclose(summary.loc[1, "metric.y.sd"], math.sqrt(0.5))


def test_rerun_skips_finished_runs_unless_redo(project, tmp_path):
    yaml_path = write_pipeline(project, """
name: again
notebooks:
  - notebook: notebooks/toy.ipynb
    parameters: {x: 3}
""")
    runs_root = tmp_path / "runs"
    first = run_pipeline(yaml_path, runs_root=runs_root)
    run_dir = runs_root / "again" / first["run_name"].iloc[0]
    stamps = {name: (run_dir / name).stat().st_mtime_ns for name in ("notebook.ipynb", "run.json")}

    second = run_pipeline(yaml_path, runs_root=runs_root)
    assert second["skipped"].all() and (second["status"] == "ok").all()
    assert list(second["metric.y"]) == [6]
    assert second["duration_s"].iloc[0] == first["duration_s"].iloc[0]
    assert {name: (run_dir / name).stat().st_mtime_ns for name in stamps} == stamps

    redone = run_pipeline(yaml_path, redo=True, runs_root=runs_root)
    assert not redone["skipped"].any() and (redone["status"] == "ok").all()
    assert (run_dir / "run.json").stat().st_mtime_ns != stamps["run.json"]


def test_only_runs_the_named_entries_and_keeps_the_others_finished_runs(project, tmp_path,
                                                                        capsys):
    from workbench.cli import main
    yaml_path = write_pipeline(project, """
name: some
notebooks:
  - notebook: notebooks/toy.ipynb
    name: first
    parameters: {x: 1}
  - notebook: notebooks/toy.ipynb
    name: second
    parameters: {x: 2}
""")
    runs_root = tmp_path / "runs"
    second = run_pipeline(yaml_path, runs_root=runs_root, only=["second"])
    assert list(second["entry"]) == ["second"] and not second["skipped"].any()
    assert list(second["metric.y"]) == [4]
    assert not any(p.name.startswith("first") for p in (runs_root / "some").iterdir())
    # by the command line: the first runs, the second's finished run is reused beside it
    assert main(["pipeline", "run", str(yaml_path), "--runs-root", str(runs_root),
                 "--only", "first"]) == 0
    both = load_results(runs_root / "some")
    assert list(both["entry"]) == ["first", "second"]
    assert list(both["skipped"]) == [False, True] and list(both["metric.y"]) == [2, 4]
    # --redo with --only redoes the picked entry alone
    redone = run_pipeline(yaml_path, runs_root=runs_root, only="first", redo=True)
    assert list(redone["skipped"]) == [False, True]
    capsys.readouterr()
    with pytest.raises(ValueError, match=r"only \['thrid'\] \(no entry named \['thrid'\]\): "
                                         r"accepted: one or more of this pipeline's entries "
                                         r"\['first', 'second'\]"):
        run_pipeline(yaml_path, runs_root=tmp_path / "other", only=["thrid"])
    assert not (tmp_path / "other").exists()
    assert main(["pipeline", "run", str(yaml_path), "--runs-root", str(runs_root),
                 "--only", "thrid"]) == 2
    assert "no entry named ['thrid']" in capsys.readouterr().err


def test_failing_run_is_recorded_and_others_go_on_then_retried(project, tmp_path):
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/toy.ipynb
    name: flaky
    parameters: {x: 5}
    grid: {fail: [false, true]}
""")
    runs_root = tmp_path / "runs"
    table = run_pipeline(yaml_path, runs_root=runs_root).set_index("param.fail")
    assert table.loc[False, "status"] == "ok" and table.loc[False, "metric.y"] == 10
    assert table.loc[True, "status"] == "failed"
    assert table.loc[True, "error"] == "RuntimeError: asked to fail with x=5"
    assert pd.isna(table.loc[True, "metric.y"])
    record = json.loads((runs_root / "demo" / table.loc[True, "run_name"] / "run.json").read_text())
    assert record["status"] == "failed"
    assert record["error"] == {"type": "RuntimeError", "message": "asked to fail with x=5"}

    summary = summarize(table.reset_index())
    assert list(summary[["n_ok", "n_failed"]].sum()) == [1, 1]

    rerun = run_pipeline(yaml_path, runs_root=runs_root).set_index("param.fail")
    assert rerun.loc[False, "skipped"] and not rerun.loc[True, "skipped"]  # failed run retried
    assert rerun.loc[True, "status"] == "failed"


def test_unknown_parameter_fails_before_anything_is_written(project, tmp_path):
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/toy.ipynb
    grid: {temprature: [0.0, 1.0]}
""")
    with pytest.raises(PipelineError) as raised:
        run_pipeline(yaml_path, runs_root=tmp_path / "runs")
    message = str(raised.value)
    assert "temprature" in message and "notebooks/toy.ipynb" in message
    assert "declared: ['fail', 'out_dir', 'seed', 'x']" in message
    assert not (tmp_path / "runs").exists()


def test_missing_notebook_fails_before_anything_is_written(project, tmp_path):
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/toy.ipynb
  - notebook: notebooks/nope.ipynb
""")
    with pytest.raises(PipelineError, match="notebook not found: notebooks/nope.ipynb"):
        run_pipeline(yaml_path, runs_root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_notebook_without_parameters_cell_is_an_error(project, tmp_path):
    write_notebook(project / "notebooks" / "plain.ipynb", parameters_cell=None)
    yaml_path = write_pipeline(project, "notebooks:\n  - notebook: notebooks/plain.ipynb\n")
    with pytest.raises(PipelineError, match="no cell tagged `parameters`"):
        run_pipeline(yaml_path, runs_root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("text, match", [
    ("notebooks: []\n", "non-empty list"),
    ("notebooks: [\n", "not valid YAML"),
    ("name: p\nnotebook: []\n", r"unknown key\(s\) \['notebook'\]; accepted: \['name', 'notebooks'\]"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    seed: [1]\n", r"unknown key\(s\) \['seed'\]"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    grid: {x: 3}\n", "grid values for 'x' must be a non-empty list"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    seeds: [0]\n    parameters: {seed: 1}\n", "both as fixed and varied"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    seeds: [0, -1]\n", r"`seeds` item 1 must be an integer >= 0, got -1"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    seeds: [true]\n", r"`seeds` item 0 must be an integer >= 0, got True"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    parameters: {out_dir: x}\n", "set by the runner"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n  - notebook: notebooks/toy.ipynb\n", "share the folder"),
    # a value of another kind than the notebook's default (x = 1, fail = False): refused here,
    # not by the notebook once its folder is written; null always passes
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    parameters: {x: '3'}\n",
     r"parameter 'x' = '3'; the notebook takes an integer there \(its default: 1\) or null"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    grid: {x: [1, 2.5]}\n",
     r"parameter 'x' = 2.5; the notebook takes an integer"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    parameters: {fail: 1}\n",
     r"parameter 'fail' = 1; the notebook takes true or false"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    parameters: {x: true}\n",
     r"parameter 'x' = True; the notebook takes an integer"),
])
def test_invalid_pipelines_are_rejected(project, tmp_path, text, match):
    with pytest.raises(PipelineError, match=match):
        run_pipeline(write_pipeline(project, text), runs_root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_missing_pipeline_file(tmp_path):
    with pytest.raises(PipelineError, match="pipeline file not found"):
        run_pipeline(tmp_path / "nope.yaml", runs_root=tmp_path / "runs")


@pytest.mark.parametrize("where", ["runs_root", "pipeline_dir", "run_dir"])
def test_output_path_that_is_a_file_fails_before_anything_runs(project, tmp_path, where):
    yaml_path = write_pipeline(project, "notebooks:\n  - notebook: notebooks/toy.ipynb\n")
    runs_root = tmp_path / "runs"
    if where == "runs_root":
        blocker = runs_root
    else:
        (runs_root / "demo").parent.mkdir(parents=True)
        blocker = runs_root / "demo"
        if where == "run_dir":
            blocker.mkdir()
            run_name = run_pipeline(yaml_path, runs_root=tmp_path / "probe")["run_name"].iloc[0]
            blocker = blocker / run_name
    blocker.write_text("not a folder")
    before = sorted(blocker.parent.iterdir())
    with pytest.raises(PipelineError, match=rf"{blocker.name}' is an existing file.*folder"):
        run_pipeline(yaml_path, runs_root=runs_root)
    assert sorted(blocker.parent.iterdir()) == before and blocker.read_text() == "not a folder"


def test_unreadable_pipeline_files_are_pipeline_errors(project, tmp_path):
    with pytest.raises(PipelineError, match="is a folder, not a pipeline YAML file"):
        run_pipeline(project / "pipelines", runs_root=tmp_path / "runs")
    bad = project / "pipelines" / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(PipelineError, match="not UTF-8 text"):
        run_pipeline(bad, runs_root=tmp_path / "runs")
    with pytest.raises(PipelineError, match=r"not valid YAML \(line 2, column 1\)") as raised:
        run_pipeline(write_pipeline(project, "notebooks: [\n"), runs_root=tmp_path / "runs")
    assert "\n" not in str(raised.value)  # one line, fit for a command line
    assert not (tmp_path / "runs").exists()


def test_interrupted_results_write_keeps_the_previous_results(project, tmp_path, monkeypatch):
    yaml_path = write_pipeline(project, "notebooks:\n  - notebook: notebooks/toy.ipynb\n")
    runs_root = tmp_path / "runs"
    run_pipeline(yaml_path, runs_root=runs_root)
    before = {name: (runs_root / "demo" / name).read_bytes() for name in ("results.csv", "results.parquet")}

    def half_write(self, path, *args, **kwargs):
        Path(path).write_bytes(b"PAR1 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", half_write)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(yaml_path, runs_root=runs_root)
    monkeypatch.undo()
    after = {name: (runs_root / "demo" / name).read_bytes() for name in before}
    assert after["results.parquet"] == before["results.parquet"]
    assert not [p.name for p in (runs_root / "demo").iterdir() if p.name.startswith(".")]
    assert load_results(runs_root / "demo")["status"].tolist() == ["ok"]


@pytest.mark.parametrize("text, match", [
    ("name: p\nnotebook: []\n", r"accepted: \['name', 'notebooks'\] \(did you mean 'notebooks'\?\)"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    parameters: {sed: 1}\n",
     r"\['sed'\] not declared .* \(did you mean 'seed'\?\)"),
    ("notebooks:\n  - notebook: notebooks/toy.ipynb\n    1: x\n    grids: {}\n",
     r"unknown key\(s\) \[1, 'grids'\]; .* \(did you mean 'grid'\?\)"),
])
def test_near_misses_are_suggested(project, tmp_path, text, match):
    with pytest.raises(PipelineError, match=match):
        run_pipeline(write_pipeline(project, text), runs_root=tmp_path / "runs")


@pytest.mark.parametrize("spec", sorted((Path(__file__).resolve().parent.parent / "pipelines")
                                        .glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_pipeline_validates(spec):
    """Every YAML in pipelines/ names notebooks that exist and parameters they declare."""
    from workbench.pipeline_spec import load_pipeline
    assert load_pipeline(spec).runs


def test_report_is_one_static_page_with_every_run(project, tmp_path, capsys):
    """`workbench pipeline report` embeds each run's parameters, metrics, figures and error."""
    import base64

    from workbench.cli import main
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/toy.ipynb
    grid: {x: [1, 2], fail: [false, true]}
""")
    runs_root = tmp_path / "runs"
    table = run_pipeline(yaml_path, runs_root=runs_root)
    pipeline_dir = runs_root / "demo"
    ok_run = table[table["status"] == "ok"]["run_name"].iloc[0]
    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
    (pipeline_dir / ok_run / "curve.png").write_bytes(png)
    assert main(["pipeline", "report", str(pipeline_dir)]) == 0
    page = (pipeline_dir / "report.html").read_text()
    assert all(name in page for name in table["run_name"])
    assert page.count('class="failed"') == 2 and "asked to fail with x=" in page
    assert "data:image/png;base64," + base64.b64encode(png).decode() in page
    assert "Summary over seeds" in page and "metric.y" in page
    assert main(["pipeline", "report", str(tmp_path / "nothing")]) == 2
    assert "no results in" in capsys.readouterr().err


EXPLORER_CELL = """import ipywidgets
from workbench.viz.explorer import Explorer

class Line(Explorer):
    def draw(self, fig, slope):
        fig.subplots().plot([0, 1], [0, slope], gid="line")
        return f"slope {slope}"

Line({"slope": ipywidgets.IntSlider(value=x + seed, max=9)})"""


def test_report_shows_mean_sd_per_metric_and_the_explorers_last_figure(project, tmp_path, capsys):
    """The summary on the page is the CLI's: one "mean ± sd" column per metric; a notebook
    ending with an explorer has its last figure (the static PNG papermill keeps) embedded."""
    from workbench.pipeline import summary_view
    from workbench.report import explorer_images, write_report
    notebook = nbformat.read(project / "notebooks" / "toy.ipynb", as_version=4)
    notebook.cells.append(new_code_cell(EXPLORER_CELL))
    nbformat.write(notebook, project / "notebooks" / "explore.ipynb")
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/explore.ipynb
    seeds: [0, 1]
  - notebook: notebooks/toy.ipynb
""")
    table = run_pipeline(yaml_path, runs_root=tmp_path / "runs", jobs=2)
    printed = capsys.readouterr().out
    page = write_report(tmp_path / "runs" / "demo").read_text()
    summary = page[page.index("Summary over seeds"):page.index('<section class="run">')]
    shown = summary_view(table)
    assert [c for c in shown.columns if c.startswith("metric.")] == ["metric.y", "metric.extra.z"]
    assert "metric.y.mean" not in summary and "metric.y.sd" not in summary
    assert summary.count("<th>metric.y</th>") == 1 and summary.count("<th>metric.extra.z</th>") == 1
    # explore: y = 2 + seed over seeds 0 and 1; toy: one run, its mean alone
    assert list(shown["metric.y"]) == ["2.5 ± 0.71", "2"]
    assert "<td>2.5 ± 0.71</td>" in summary and "<td>0.5 ± 0.71</td>" in summary
    assert "2.5 ± 0.71" in printed  # the CLI's summary, the same view
    explorers = table[table["entry"] == "explore"]["run_name"]
    for run in explorers:
        images = explorer_images(tmp_path / "runs" / "demo" / run / "notebook.ipynb")
        assert len(images) == 1 and f"data:image/png;base64,{images[0]}" in page
    toy = table[table["entry"] == "toy"]["run_name"].iloc[0]
    assert explorer_images(tmp_path / "runs" / "demo" / toy / "notebook.ipynb") == []
    assert page.count("explorer: the last figure of the notebook") == len(explorers) == 2


def test_jobs_run_at_once_keep_the_yaml_order_and_split_the_cores(project, tmp_path, monkeypatch):
    """--jobs 2: two kernels at a time, each told to use its share of the cores (two kernels
    of all the cores each run several times slower than one after another); the table is in
    the YAML's order, whichever run finished first; the caller's environment is restored."""
    import os
    import time
    write_threads_notebook(project, "slow", "time.sleep(1.5 if x == 1 else 0.5)")
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/slow.ipynb
    grid: {x: [1, 2, 3]}
""")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    started = time.perf_counter()
    table = run_pipeline(yaml_path, runs_root=tmp_path / "runs", jobs=2)
    took = time.perf_counter() - started
    assert list(table["param.x"]) == [1, 2, 3] and (table["status"] == "ok").all()
    assert set(table["metric.threads"]) == {max(1, (os.cpu_count() or 1) // 2)}
    assert took < table["duration_s"].sum()  # x=1 ran beside x=2 and x=3
    assert "OMP_NUM_THREADS" not in os.environ
    with pytest.raises(ValueError, match="jobs must be an integer >= 1, got 0"):
        run_pipeline(yaml_path, runs_root=tmp_path / "other", jobs=0)
    assert not (tmp_path / "other").exists()


def test_kernels_run_over_ipc_so_no_tcp_warning_is_printed_and_errors_still_show(
        project, tmp_path, capfd):
    """Two kernels side by side (``jobs=2``), each on sockets of its own."""
    yaml_path = write_pipeline(project, """
notebooks:
  - notebook: notebooks/toy.ipynb
    grid: {fail: [false, true]}
""")
    table = run_pipeline(yaml_path, runs_root=tmp_path / "runs", jobs=2).set_index("param.fail")
    printed = capfd.readouterr()
    assert "Kernel is running over TCP" not in printed.out + printed.err
    assert table.loc[False, "status"] == "ok"
    assert table.loc[True, "error"] == "RuntimeError: asked to fail with x=1"
