"""A researcher's own model and data through every notebook (issue #26's "must show").

The model is a tiny Qwen2 saved with ``save_pretrained`` beside its own byte-level BPE
tokenizer (``tests/user_model.py``: the family whose tokenizer transformers substitutes on
reload), the task a JSONL file of ``{"prompt", "answer"}`` word problems without references.
Notebooks 00-07 run through papermill at their smoke parameters on them; the SD and RL notebooks
fit their drafters on the spot (cached under a temporary ``WORKBENCH_CACHE``), except notebook
02, which is handed the head that ``workbench drafter train`` fitted for the model, and must
report lossless SD with it. Every notebook must write its ``metrics.json`` and leave no blank
figure.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import papermill
import pytest
from matplotlib.image import imread

from .test_notebooks import ROOT, SMOKE
from .user_model import save_user_model, word_problems

# answers of word problems are 2-4 tokens, so 05-07 need ~700 of them to reach the 2,000 scored
# tokens below which compression data is refused
NOTEBOOK_PARAMS = {
    "00_task_and_policy": {},
    "01_long_tail_rollout": {},
    "02_speculative_decoding": {"fit_minutes": 0.05},  # drafter: the CLI's head (fixture)
    "03_adaptive_drafter": {"drafter": "auto", "fit_minutes": 0.05},
    "04_tlt_rl": {"drafter": "auto", "fit_minutes": 0.05},
    "05_pruning": {"train_size": 800},
    "06_distillation": {"train_size": 800},   # layer_pairs: spread over its 2 layers
    "07_minitron_pipeline": {"train_size": 800, "fit_minutes": 0.05},
}


@pytest.fixture(scope="module")
def user_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    model = save_user_model(root / "model", "qwen2")
    task = root / "word_problems.jsonl"
    task.write_text("".join(json.dumps(p) + "\n" for p in word_problems(1200, seed=3)))
    cache = root / "cache"
    before = os.environ.get("WORKBENCH_CACHE")
    os.environ["WORKBENCH_CACHE"] = str(cache)  # the kernels papermill starts inherit it
    head = root / "eagle"
    cli = subprocess.run([sys.executable, "-m", "workbench", "drafter", "train", "--model",
                          str(model), "--task", str(task), "--out", str(head), "--minutes",
                          "0.1"], capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "tau" in cli.stdout and (head / "provenance.json").is_file(), cli.stdout[-2000:]
    yield model, task, cache, head
    if before is None:
        os.environ.pop("WORKBENCH_CACHE", None)
    else:
        os.environ["WORKBENCH_CACHE"] = before


def _not_blank(png: Path) -> bool:
    pixels = imread(png)[..., :3]
    return float(np.ptp(pixels)) > 0.1 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 8


@pytest.mark.parametrize("name", list(NOTEBOOK_PARAMS))
def test_every_notebook_runs_on_a_users_model_and_jsonl_task(name, user_setup, tmp_path):
    model, task, cache, head = user_setup
    smoke, keys = SMOKE[name]
    out_dir = tmp_path / "out"
    params = {**smoke, **NOTEBOOK_PARAMS[name], "model": str(model), "task": str(task),
              "out_dir": str(out_dir)}
    if name == "02_speculative_decoding":
        params["drafter"] = str(head)
    papermill.execute_notebook(ROOT / "notebooks" / f"{name}.ipynb", tmp_path / "run.ipynb",
                               parameters=params, kernel_name="python3", language="python",
                               progress_bar=False, cwd=str(ROOT))
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert set(keys) <= set(metrics), sorted(set(keys) - set(metrics))
    figures = sorted(out_dir.rglob("*.png"))
    assert figures and all(_not_blank(f) for f in figures), [f.name for f in figures]
    if name == "02_speculative_decoding":  # lossless SD with the CLI's head for this model
        assert metrics["lossless"] is True or metrics["lossless"] == 1
        assert metrics["accept_len_eagle"] >= 1
