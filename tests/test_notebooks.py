"""Papermill runs of the notebooks with their smoke parameters (each well under a minute), in
the session's pipeline of notebook runs, two at a time (tests/notebook_runs.py)."""
import json
from pathlib import Path

import papermill
import pytest

from .notebook_runs import ROOT, NotebookRun
from .helpers.notebooks import SMOKE, assert_reads_well, last_cell_images, printed

# notebooks that report a speedup: their output must say whether its spread is wide
SAYS_SPREAD = {"02_speculative_decoding": 2}  # one note under each sd_sweep table
# notebooks that end with an explorer: under papermill it must still leave its figure (a PNG)
ENDS_WITH_EXPLORER = {"01_long_tail_rollout", "02_speculative_decoding", "04_tlt_rl", "05_pruning",
                      "10_cluster_what_if"}


@pytest.fixture(scope="module")
def smoke_runs(notebook_runs, quickstart_runs):
    """Every notebook at its smoke parameters: 00 and 01 (seed 0) from the quickstart pipeline
    on the embedded default model, the others from the session's notebook runs
    (conftest.py): on the default model, or, for those the session runs on the user's model
    alone (``notebook_runs.DEFAULT_COVERED_BY_USER``), on the user's."""
    runs = {name: notebook_runs.runs.get(name, notebook_runs.runs.get("user_" + name))
            for name in SMOKE}
    for folder in quickstart_runs.iterdir():
        record = folder / "run.json"
        if record.is_file():
            record = json.loads(record.read_text())
            if record["parameters"].get("seed", 0) == 0:
                runs[Path(record["notebook"]).stem] = NotebookRun(folder)
    return runs


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_notebook_smoke_run_writes_metrics(name, smoke_runs):
    run = smoke_runs[name]
    metrics, executed, out_dir = run.metrics(), run.executed, run.folder
    assert set(SMOKE[name][1]) <= set(metrics)
    assert_reads_well(executed)
    assert all(not isinstance(v, (dict, list)) for v in metrics.values())
    assert list(out_dir.glob("*.png"))
    if "lossless" in metrics:
        assert metrics["lossless"] is True
    if "tokens_equal" in metrics:  # 08: every backend decoded the same tokens
        assert metrics["tokens_equal"] is True
    if name in ENDS_WITH_EXPLORER:
        assert last_cell_images(executed) == 1
    if name in SAYS_SPREAD:
        text = printed(executed)
        notes = text.count("Spread: every per-repeat ratio") + text.count("WIDE SPREAD in")
        assert notes == SAYS_SPREAD[name], text
        assert metrics["speedup_bs1_min"] <= metrics["speedup_bs1"] <= metrics["speedup_bs1_max"]


def test_notebook_refuses_an_out_dir_that_is_a_file(tmp_path):
    bad = tmp_path / "file"
    bad.write_text("x")
    with pytest.raises(papermill.PapermillExecutionError, match="existing file"):
        papermill.execute_notebook(ROOT / "notebooks" / "00_task_and_policy.ipynb",
                                   tmp_path / "executed.ipynb",
                                   parameters={"num_problems": 2, "out_dir": str(bad)},
                                   kernel_name="python3", language="python", progress_bar=False,
                                   cwd=str(ROOT))
    assert bad.read_text() == "x"


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_every_parameter_is_visible_to_papermill(name):
    """papermill silently skips lines it cannot parse; the pipeline's undeclared-parameter check
    relies on it seeing every assignment of the parameters cell."""
    import ast

    import nbformat
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assigned = {t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                for t in node.targets}
    assert set(papermill.inspect_notebook(ROOT / "notebooks" / f"{name}.ipynb")) == assigned
    assert "out_dir" in assigned
