"""Notebook 05 with a researcher's importance score: the worked example
(tests/plugins/taylor_importance.py) loaded as a plugin and named in ``rankings`` ranks units in
the ablation like a built-in, its row in the written table (the session's run of notebook 05
on a user's model carries it); an unknown ranking is refused before anything runs, listing the
registered names."""
from pathlib import Path

import pandas as pd
import papermill
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05_pruning.ipynb"
TINY = {"calibration_size": 16, "train_size": 112, "eval_size": 8, "max_len": 64,
        "distill_steps": 2, "search_candidates": 4, "search_top": 1, "search_steps": 1,
        "depth_texts": 8, "max_batch": 2, "decode_tokens": 4, "fast_max_flops": 0.7,
        "batch_size": 4, "seeds": [0, 1]}


def _run(tmp_path, **parameters):
    return papermill.execute_notebook(NOTEBOOK, tmp_path / "executed.ipynb",
                                      parameters={**TINY, **parameters}, kernel_name="python3",
                                      language="python", progress_bar=False, cwd=str(ROOT))


def test_notebook_05_ranks_by_a_plugin_score_beside_the_built_ins(notebook_runs):
    """The session's notebook 05 run on the user's model (tests/notebook_runs.py,
    ``USER_PARAMS``) loads the plugin and names ``taylor`` among its rankings."""
    out = notebook_runs.runs["user_05_pruning"].folder
    metrics = notebook_runs.runs["user_05_pruning"].metrics()  # the run went through
    table = pd.read_csv(out / "ablation.csv")
    assert "taylor" in set(table["ranking"])
    assert {"activation l2/mean", "random", "weight magnitude"} <= set(table["ranking"])
    assert table.set_index("ranking").loc["taylor", "lm_loss"] > 0
    assert (out / "ablation.png").is_file()
    assert {"loss_after_prune_l2mean", "loss_after_prune_random"} <= set(metrics)


def test_notebook_05_refuses_an_unknown_ranking_before_anything_runs(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(papermill.PapermillExecutionError,
                       match=r"ranking 'taylor': accepted one of \['activation', "
                             r"'weight_magnitude', 'random'"):
        _run(tmp_path, out_dir=str(out), rankings=["activation", "taylor"])  # no plugin
    assert not out.exists()
