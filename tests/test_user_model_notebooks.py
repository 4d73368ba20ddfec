"""A researcher's own model and data through every notebook (issue #26's "must show").

The model is a tiny 4-layer Qwen2 saved with ``save_pretrained`` beside its own byte-level BPE
tokenizer (``tests/user_model.py``: the family whose tokenizer transformers substitutes on
reload), the task a JSONL file of ``{"prompt", "answer"}`` word problems without references.
Notebooks 00-07 run at their smoke parameters on them, in the session's pipeline of notebook
runs, two at a time (tests/notebook_runs.py: ``USER_PARAMS``); the SD and RL notebooks fit
their drafters on the spot (cached under a temporary ``WORKBENCH_CACHE`` that the runs share),
except notebook 02, which is handed the head that ``workbench drafter train`` fitted for the
model and fits its small LM on the spot.
Every notebook must write its ``metrics.json`` and leave no blank figure. One more run is
notebook 04 with the baseline alone: an accuracy curve and no drafter.
"""
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from .notebook_runs import USER_PARAMS
from .helpers.notebooks import SMOKE, assert_reads_well, last_cell_images, printed


@pytest.fixture(scope="module")
def user_runs(notebook_runs):
    """stem -> run of every notebook on the user's model and task, "04_baseline_alone" too;
    and the task's path (the session's notebook runs, tests/notebook_runs.py)."""
    runs = {name[len("user_"):]: run for name, run in notebook_runs.runs.items()
            if name.startswith("user_")}
    return runs, notebook_runs.user_task


def _not_blank(png: Path) -> bool:
    pixels = imread(png)[..., :3]
    return float(np.ptp(pixels)) > 0.1 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 8


@pytest.mark.parametrize("name", list(USER_PARAMS))
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
    float64 exactness check reuses it; the curve covers every drafter of the default
    comparison."""
    runs, task = user_runs
    run = runs["02_speculative_decoding"]
    metrics = run.metrics()
    assert metrics["lossless"] is True and metrics["drafter"] == "eagle"
    assert all(metrics[f"accept_len_{d}"] >= 1 for d in ("eagle", "ngram", "small_lm"))
    curve = pd.read_csv(run.folder / "curve.csv")
    # the default comparison: the head, n-gram and the small LM over the grid, the sibling
    # and suffix drafters (model-free, from a group's responses) at batch 1 (narrow_drafters)
    assert set(curve["drafter"]) == {"eagle", "ngram", "small_lm", "sibling", "suffix"}
    assert set(curve["batch_size"]) == {1, 2}
    text = printed(run.executed)
    assert "fitted the EAGLE head" not in text and "reusing the EAGLE head" not in text
    fitted, reused = text.count("fitted the small-LM drafter"), text.count("reusing the small-LM drafter")
    assert fitted <= 1 and fitted + reused == 2, text
    assert "1 prompts of " + str(task) + " x 2 samples" in text  # the smoke run's groups


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


def test_notebooks_06_and_07_report_error_bars_and_name_the_best_compressed_drafter(user_runs):
    """06: every student's accuracy with its sd and an interval around its mean, scored on
    the problems asked for, and the KD-against-CE verdict agreeing with its interval; 07: the
    best compressed drafter is the fastest of the compressed ones it measured."""
    runs, _ = user_runs
    m6 = runs["06_distillation"].metrics()
    assert m6["eval_problems"] == 3 and m6["seeds"] == 2
    for s in ("student_kd", "student_kd_hidden", "student_ce", "scratch"):
        assert m6[f"accuracy_{s}_sd"] >= 0
        assert m6[f"accuracy_{s}_lo"] <= m6[f"accuracy_{s}"] <= m6[f"accuracy_{s}_hi"]
    assert m6["kd_beats_ce_significant"] == (m6["kd_minus_ce_accuracy_lo"] > 0)
    m7 = runs["07_minitron_pipeline"].metrics()
    drafters = {k[len("speedup_drafter_"):]: v for k, v in m7.items()
                if k.startswith("speedup_drafter_")}
    assert set(drafters) == {"width_50pct", "width_25pct", "depth_50pct"}
    assert m7["best_compressed_drafter"] == max(drafters, key=drafters.get)
    assert m7["speedup_best_compressed_drafter"] == max(drafters.values())
