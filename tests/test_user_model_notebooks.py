"""A researcher's own model and data through every notebook (issue #26's "must show").

The model is a tiny 4-layer Qwen2 saved with ``save_pretrained`` beside its own byte-level BPE
tokenizer (``tests/user_model.py``: the family whose tokenizer transformers substitutes on
reload), the task a JSONL file of ``{"prompt", "answer"}`` word problems without references.
Notebooks 00-07 run at their smoke parameters on them, as one pipeline two runs at a time
(tests/notebook_runs.py); the SD and RL notebooks fit their drafters on the spot (cached under
a temporary ``WORKBENCH_CACHE`` that the runs share), except notebook 02, which is handed the
head that ``workbench drafter train`` fitted for the model and fits its small LM on the spot.
Every notebook must write its ``metrics.json`` and leave no blank figure. One more run is
notebook 04 with the baseline alone: an accuracy curve and no drafter.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from .notebook_runs import ROOT, run_notebooks
from .test_notebooks import SMOKE, assert_reads_well, last_cell_images, printed
from .user_model import save_user_model, word_problems

# answers of word problems are 2-4 tokens, so 05-07 need ~700 of them to reach the 2,000 scored
# tokens below which compression data is refused
NOTEBOOK_PARAMS = {
    "00_task_and_policy": {},
    "01_long_tail_rollout": {},
    "02_speculative_decoding": {"fit_minutes": 0.02},  # drafter: the CLI's head (fixture)
    "03_adaptive_drafter": {"drafter": "auto", "fit_minutes": 0.02},
    "04_tlt_rl": {"drafter": "auto", "fit_minutes": 0.02},
    "05_pruning": {"train_size": 800},
    "06_distillation": {"train_size": 800},   # layer_pairs: spread over its 4 layers
    "07_minitron_pipeline": {"train_size": 800, "fit_minutes": 0.02},
}
BASELINE_ALONE = {"variants": ["baseline"], "seeds": [0], "steps": 2, "eval_every": 1,
                  "divergence_steps": 1}


@pytest.fixture(scope="module")
def user_runs(tmp_path_factory):
    """name -> run of every notebook on the user's model and task, and "04_baseline_alone"."""
    root = tmp_path_factory.mktemp("user")
    model = save_user_model(root / "model", "qwen2", num_hidden_layers=4)
    task = root / "word_problems.jsonl"
    task.write_text("".join(json.dumps(p) + "\n" for p in word_problems(1200, seed=3)))
    cache = root / "cache"
    head = root / "eagle"
    cli = subprocess.run([sys.executable, "-m", "workbench", "drafter", "train", "--model",
                          str(model), "--task", str(task), "--out", str(head), "--minutes",
                          "0.03"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "WORKBENCH_CACHE": str(cache)})
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "tau" in cli.stdout and (head / "provenance.json").is_file(), cli.stdout[-2000:]
    user = {"model": str(model), "task": str(task)}
    entries = {name: (name, {**SMOKE[name][0], **extra, **user})
               for name, extra in NOTEBOOK_PARAMS.items()}
    entries["02_speculative_decoding"][1]["drafter"] = str(head)
    entries["04_baseline_alone"] = ("04_tlt_rl", {**SMOKE["04_tlt_rl"][0], **BASELINE_ALONE,
                                                  **user})
    runs = run_notebooks(root, entries, env={"WORKBENCH_CACHE": str(cache)})
    return runs, task


def _not_blank(png: Path) -> bool:
    pixels = imread(png)[..., :3]
    return float(np.ptp(pixels)) > 0.1 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 8


@pytest.mark.parametrize("name", list(NOTEBOOK_PARAMS))
def test_every_notebook_runs_on_a_users_model_and_jsonl_task(name, user_runs):
    runs, task = user_runs
    run = runs[name]
    metrics = run.metrics()
    assert set(SMOKE[name][1]) <= set(metrics), sorted(set(SMOKE[name][1]) - set(metrics))
    figures = sorted(run.folder.rglob("*.png"))
    assert figures and all(_not_blank(f) for f in figures), [f.name for f in figures]
    assert_reads_well(run.executed)


@pytest.mark.parametrize("name", ["00_task_and_policy", "01_long_tail_rollout"])
def test_a_task_without_references_skips_only_the_figures_that_need_them(name, user_runs):
    """No reference traces in the user's JSONL: the figures that need them are skipped with a
    printed reason, the others are drawn, and metrics.json is written."""
    runs, task = user_runs
    run = runs[name]
    metrics = run.metrics()
    assert metrics["task"] == str(task) and 0.0 <= metrics["accuracy"] <= 1.0
    if name == "00_task_and_policy":
        text = printed(run.executed)
        assert "no reference traces" in text and "skipped" in text, text
        assert pd.read_parquet(run.folder / "evaluation.parquet")["reference_tokens"].isna().all()
        buckets = pd.read_csv(run.folder / "accuracy_by_bucket.csv")
        assert "response_tokens bucket" in buckets.columns
        assert buckets["problems"].sum() == metrics["num_problems"] == 12
        assert {"lengths.png", "accuracy_by_bucket.png"} <= {p.name for p in run.folder.glob("*.png")}
    else:
        assert last_cell_images(run.executed) == 1  # the explorer's figure is left behind


def test_notebook_02_takes_the_clis_head_and_fits_its_small_lm_on_the_spot(user_runs):
    """The CLI's head is lossless; prompts come from the task; "auto" fits a small LM (or reuses
    the one notebook 07 fitted for the same model and task, whichever ran first) and the
    float64 exactness check reuses it; the curve covers every drafter."""
    runs, task = user_runs
    run = runs["02_speculative_decoding"]
    metrics = run.metrics()
    assert metrics["lossless"] is True and metrics["drafter"] == "eagle"
    assert all(metrics[f"accept_len_{d}"] >= 1 for d in ("eagle", "ngram", "small_lm"))
    curve = pd.read_csv(run.folder / "curve.csv")
    assert set(curve["drafter"]) == {"eagle", "ngram", "small_lm"}
    assert set(curve["batch_size"]) == {1, 2}
    text = printed(run.executed)
    assert "fitted the EAGLE head" not in text and "reusing the EAGLE head" not in text
    fitted, reused = text.count("fitted the small-LM drafter"), text.count("reusing the small-LM drafter")
    assert fitted <= 1 and fitted + reused == 2, text
    assert "2 prompts of " + str(task) in text


def test_the_rl_notebooks_fit_an_eagle_head_for_the_users_model(user_runs):
    """Notebooks 03 and 04 ask for "auto": a head is fitted on the spot for the user's model
    (by whichever ran first; the other reuses it from the shared cache, or fits its own when
    both started before either finished)."""
    runs, _ = user_runs
    texts = [printed(runs[n].executed) for n in ("03_adaptive_drafter", "04_tlt_rl")]
    assert sum(t.count("fitted the EAGLE head") for t in texts) >= 1, texts
    assert all(t.count("fitted the EAGLE head") + t.count("reusing the EAGLE head") >= 1
               for t in texts), texts


def test_notebook_05_snaps_the_default_target_to_the_nearest_plans_and_says_so(user_runs):
    """The user's 4-layer model at the default target 0.5: no depth plan lands on 0.5 exactly
    (the embeddings of its 512-token vocabulary are a large share), so the notebook prints
    what it asked, what it got and how many of the 4 layers it kept."""
    runs, _ = user_runs
    run = runs["05_pruning"]
    metrics = run.metrics()
    match = re.search(r"depth plan: asked 0\.5 of the parameters, got (0\.\d+) \([1-3] of 4 layers,",
                      printed(run.executed))
    assert match, printed(run.executed)
    assert metrics["params_depth"] / metrics["params_teacher"] == pytest.approx(
        float(match.group(1)), abs=0.005)


def test_notebook_04_runs_the_baseline_alone_with_an_accuracy_curve_and_no_drafter(user_runs):
    """The long-baseline entry of pipelines/tlt.yaml on a user's model: one variant,
    evaluations along the run, no coupled pair (which needs a drafter), no head loaded or
    fitted; the notebook still writes its figures and metrics."""
    runs, _ = user_runs
    run = runs["04_baseline_alone"]
    metrics = run.metrics()
    assert metrics["compared_variant"] == "baseline" and metrics["e2e_speedup_baseline"] == 1.0
    assert metrics["first_divergence_step"] is None and metrics["rl_steps"] == 2
    evals = (run.folder / "evals.csv").read_text().splitlines()
    assert len(evals) == 1 + 3                                # header, steps 0, 1, 2
    assert (run.folder / "heldout_accuracy.png").exists()
    assert "EAGLE head" not in printed(run.executed)
