"""Papermill runs of the notebooks with their smoke parameters (each well under a minute)."""
import json
from pathlib import Path

import papermill
import pytest

ROOT = Path(__file__).resolve().parent.parent

SMOKE = {
    "00_task_and_policy": ({"num_problems": 12},
                           ["accuracy", "length_p50", "length_p99", "eos_rate_tail"]),
    "01_long_tail_rollout": ({"num_prompts": 6, "samples_per_prompt": 2, "workers": 2},
                             ["num_requests", "workers", "makespan_s", "idle_fraction",
                              "tail_share", "length_p50", "length_p90", "length_p99",
                              "tokens_per_s", "accuracy"]),
    "02_speculative_decoding": ({"num_prompts": 2, "batch_sizes": [1, 2], "ks": [2],
                                 "curve_k": 2, "temperatures": [0.0, 1.0], "repeats": 3,
                                 "max_new_tokens": 16, "lossless_prompts": 2},
                                ["accept_len_eagle", "accept_len_ngram", "accept_len_small_lm",
                                 "speedup_bs1", "speedup_bs8", "speedup_bs32", "speedup_bs1_t1",
                                 "speedup_bs1_min", "speedup_bs1_max", "speedup_bs1_t1_min",
                                 "speedup_bs1_t1_max", "speedup_spread_wide", "bound_bs1",
                                 "lossless"]),
    "03_adaptive_drafter": ({"rl_problems": 32, "prompts_per_step": 2, "samples_per_prompt": 2,
                             "max_new_tokens": 24, "steps": 2, "workers": 2, "probe_prompts": 3,
                             "tree_budget": 8, "tree_k": 3},
                            ["accept_len_static_first", "accept_len_static_final",
                             "accept_len_adaptive_first", "accept_len_adaptive_final",
                             "accept_len_tree", "accept_len_chain", "accept_len_export_final",
                             "accept_len_export_pre_rl", "kl_final"]),
    "04_tlt_rl": ({"rl_problems": 32, "eval_problems": 4, "prompts_per_step": 2,
                   "samples_per_prompt": 2, "max_new_tokens": 24, "steps": 2, "seeds": [0, 1],
                   "workers": 2, "explore_budget": 0.5, "divergence_steps": 1},
                  ["e2e_speedup_tlt", "amdahl_prediction_tlt", "rollout_speedup_tlt",
                   "drafter_overrun_s_max", "explore_cost_tlt", "plain_share_tlt",
                   "rollout_fraction_baseline", "accuracy_start", "accuracy_final_baseline",
                   "reward_final_baseline", "reward_final_tlt", "reward_final_sd_baseline",
                   "idle_fraction_baseline", "idle_fraction_tlt", "rl_steps",
                   "first_divergence_step"]),
    "05_pruning": ({"calibration_size": 16, "train_size": 112, "eval_size": 8, "max_len": 64,
                    "distill_steps": 2, "search_candidates": 8, "search_top": 1,
                    "search_steps": 1, "depth_texts": 8, "max_batch": 2, "decode_tokens": 4,
                    "fast_max_flops": 0.7,
                    "batch_size": 4},
                   ["params_teacher", "params_width", "params_depth", "loss_after_prune_l2mean",
                    "loss_after_prune_random", "loss_after_prune_magnitude",
                    "loss_width_distilled", "loss_depth_distilled", "saturation_batch",
                    "teacher_tok_s", "throughput_ratio_width", "throughput_ratio_depth"]),
    "06_distillation": ({"calibration_size": 8, "train_size": 128, "eval_size": 4, "max_len": 48,
                         "steps": 2, "eval_every": 1, "batch_size": 4, "eval_problems": 3,
                         "max_new_tokens": 16},
                        ["params_teacher", "params_student", "accuracy_teacher",
                         "accuracy_student_kd", "accuracy_student_ce", "accuracy_scratch",
                         "token_savings_vs_scratch", "accuracy_student_kd_hidden"]),
    "07_minitron_pipeline": ({"calibration_size": 8, "train_size": 128, "eval_size": 4,
                              "max_len": 48, "steps": 2, "batch_size": 4, "eval_problems": 3,
                              "max_new_tokens": 16, "max_batch": 2, "decode_tokens": 4,
                              "drafter_prompts": 2},
                             ["params_teacher", "params_student", "accuracy_teacher",
                              "accept_len_compressed_drafter", "speedup_compressed_drafter",
                              "saturation_batch", "lossless"]),
}
# notebooks that report a speedup: their output must say whether its spread is wide
SAYS_SPREAD = {"02_speculative_decoding": 2}  # one note under each sd_sweep table
# notebooks that end with an explorer: under papermill it must still leave its figure (a PNG)
ENDS_WITH_EXPLORER = {"01_long_tail_rollout", "02_speculative_decoding", "04_tlt_rl", "05_pruning"}


def last_cell_images(executed) -> int:
    """PNG outputs of the executed notebook's last code cell."""
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    return sum("image/png" in o.get("data", {}) for o in last.outputs)


def printed(executed) -> str:
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.output_type == "stream")


def display_texts(executed) -> list[str]:
    """The text/plain of every display output saved in an executed notebook."""
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    return [o.get("data", {}).get("text/plain", "") for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if o.output_type == "display_data"]


def assert_reads_well(executed) -> None:
    """Saved progress bars show their final state (none frozen at 0%), no loading noise."""
    texts = display_texts(executed)
    frozen = [t for t in texts if " 0%|" in t]
    assert not frozen, frozen
    assert not [t for t in texts if "Loading weights" in t]
    assert printed(executed).count("Loading weights") == 0


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_notebook_smoke_run_writes_metrics(name, tmp_path):
    params, keys = SMOKE[name]
    out_dir = tmp_path / "out"
    papermill.execute_notebook(ROOT / "notebooks" / f"{name}.ipynb", tmp_path / "executed.ipynb",
                               parameters={**params, "out_dir": str(out_dir)},
                               kernel_name="python3", language="python", progress_bar=False,
                               cwd=str(ROOT))
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert set(keys) <= set(metrics)
    assert_reads_well(tmp_path / "executed.ipynb")
    assert all(not isinstance(v, (dict, list)) for v in metrics.values())
    assert list(out_dir.glob("*.png"))
    if "lossless" in metrics:
        assert metrics["lossless"] is True
    if name in ENDS_WITH_EXPLORER:
        assert last_cell_images(tmp_path / "executed.ipynb") == 1
    if name in SAYS_SPREAD:
        text = printed(tmp_path / "executed.ipynb")
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


def test_notebook_04_runs_the_baseline_alone_with_an_accuracy_curve(tmp_path):
    """The long-baseline entry of pipelines/tlt.yaml: one variant, evaluations along the run,
    no coupled pair; the notebook still writes its figures and metrics."""
    params = {**SMOKE["04_tlt_rl"][0], "variants": ["baseline"], "seeds": [0], "steps": 2,
              "eval_every": 1, "divergence_steps": 0, "out_dir": str(tmp_path / "out")}
    papermill.execute_notebook(ROOT / "notebooks" / "04_tlt_rl.ipynb", tmp_path / "executed.ipynb",
                               parameters=params, kernel_name="python3", language="python",
                               progress_bar=False, cwd=str(ROOT))
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["compared_variant"] == "baseline" and metrics["e2e_speedup_baseline"] == 1.0
    assert metrics["first_divergence_step"] is None and metrics["rl_steps"] == 2
    evals = (tmp_path / "out" / "evals.csv").read_text().splitlines()
    assert len(evals) == 1 + 3                                # header, steps 0, 1, 2
    assert (tmp_path / "out" / "heldout_accuracy.png").exists()


def jsonl_without_references(path: Path, num: int) -> Path:
    """A user task as the README shows it: one {"prompt", "answer"} per line, no reference."""
    from workbench.tasks import get_problems
    lines = [json.dumps({"prompt": p.prompt, "answer": p.answer})
             for p in get_problems("running_sum", num)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("name", ["00_task_and_policy", "01_long_tail_rollout"])
def test_notebook_runs_on_a_jsonl_task_without_references(name, tmp_path):
    """No reference traces: the figures that need them are skipped with a printed reason, the
    others are drawn, and metrics.json is written."""
    import pandas as pd
    params, keys = SMOKE[name]
    task = jsonl_without_references(tmp_path / "task.jsonl", 12)
    out_dir = tmp_path / "out"
    executed = tmp_path / "executed.ipynb"
    papermill.execute_notebook(ROOT / "notebooks" / f"{name}.ipynb", executed,
                               parameters={**params, "task": str(task), "out_dir": str(out_dir)},
                               kernel_name="python3", language="python", progress_bar=False,
                               cwd=str(ROOT))
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert set(keys) <= set(metrics) and metrics["task"] == str(task)
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert list(out_dir.glob("*.png"))
    if name == "00_task_and_policy":
        text = printed(executed)
        assert "no reference traces" in text and "skipped" in text, text
        assert pd.read_parquet(out_dir / "evaluation.parquet")["reference_tokens"].isna().all()
        buckets = pd.read_csv(out_dir / "accuracy_by_bucket.csv")
        assert "response_tokens bucket" in buckets.columns
        assert buckets["problems"].sum() == metrics["num_problems"] == 12
        assert {"lengths.png", "accuracy_by_bucket.png"} <= {p.name for p in out_dir.glob("*.png")}
    else:
        assert last_cell_images(executed) == 1  # the explorer's figure is left behind


def test_notebook_05_runs_a_4_layer_model_on_a_jsonl_task_at_the_default_target(tmp_path,
                                                                                tokenizer):
    """Another user's setting: their own 4-layer model and a {"prompt", "answer"} JSONL task
    (with worked solutions); the default target 0.5 snaps to the nearest plans and says so."""
    import torch

    from tests.conftest import tiny_model
    from workbench.models import save_model
    from workbench.tasks import get_problems
    model = save_model(tiny_model("llama", tokenizer, layers=4, dtype=torch.float32), tokenizer,
                       tmp_path / "model")
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer,
                                        "reference": p.reference}) + "\n"
                            for p in get_problems("running_sum", 130, seed=7)))
    params, keys = SMOKE["05_pruning"]
    out_dir = tmp_path / "out"
    papermill.execute_notebook(ROOT / "notebooks" / "05_pruning.ipynb", tmp_path / "executed.ipynb",
                               parameters={**params, "model": str(model), "task": str(task),
                                           "out_dir": str(out_dir)},
                               kernel_name="python3", language="python", progress_bar=False,
                               cwd=str(ROOT))
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert set(keys) <= set(metrics)
    text = printed(tmp_path / "executed.ipynb")
    assert "depth plan: asked 0.5 of the parameters, got 0.54 (2 of 4 layers," in text
    assert metrics["params_depth"] / metrics["params_teacher"] == pytest.approx(0.54, abs=0.005)


def user_model(tmp_path, tokenizer, monkeypatch):
    """A tiny model saved as a user's folder, and a drafter cache of the test's own."""
    import torch

    from workbench.models import save_model
    from workbench.speculative.cache import CACHE_ENV

    from .conftest import tiny_model
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    folder = tmp_path / "model"
    save_model(tiny_model("llama", tokenizer, dtype=torch.float32), tokenizer, folder)
    return str(folder)


def test_notebook_04_runs_a_user_models_baseline_without_any_drafter(tmp_path, tokenizer,
                                                                     monkeypatch):
    """No head is loaded or fitted where no variant speculates, and the coupled pair, which
    needs one, is skipped."""
    params = {**SMOKE["04_tlt_rl"][0], "model": user_model(tmp_path, tokenizer, monkeypatch),
              "variants": ["baseline"], "seeds": [0], "steps": 1, "out_dir": str(tmp_path / "out")}
    papermill.execute_notebook(ROOT / "notebooks" / "04_tlt_rl.ipynb", tmp_path / "executed.ipynb",
                               parameters=params, kernel_name="python3", language="python",
                               progress_bar=False, cwd=str(ROOT))
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["compared_variant"] == "baseline" and metrics["rl_steps"] == 1
    assert params["divergence_steps"] == 1 and metrics["first_divergence_step"] is None
    assert not (tmp_path / "cache").exists()


def test_notebook_02_fits_drafters_for_a_user_model_on_a_jsonl_task(tmp_path, tokenizer,
                                                                    monkeypatch):
    """Prompts come from the task; "auto" fits a head and a small LM on the spot, the float64
    exactness check reuses both from the cache, and the curve covers every drafter."""
    import pandas as pd
    task = tmp_path / "words.jsonl"
    task.write_text("".join(json.dumps({"prompt": f"w{i} x{i % 3}?", "answer": str(i % 3)})
                            + "\n" for i in range(12)))
    params = {**SMOKE["02_speculative_decoding"][0], "lossless_prompts": 1,
              "model": user_model(tmp_path, tokenizer, monkeypatch), "task": str(task),
              "fit_minutes": 0.05, "out_dir": str(tmp_path / "out")}
    papermill.execute_notebook(ROOT / "notebooks" / "02_speculative_decoding.ipynb",
                               tmp_path / "executed.ipynb", parameters=params,
                               kernel_name="python3", language="python", progress_bar=False,
                               cwd=str(ROOT))
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["lossless"] is True and metrics["drafter"] == "eagle"
    assert all(metrics[f"accept_len_{d}"] >= 1 for d in ("eagle", "ngram", "small_lm"))
    curve = pd.read_csv(tmp_path / "out" / "curve.csv")
    assert set(curve["drafter"]) == {"eagle", "ngram", "small_lm"}
    assert set(curve["batch_size"]) == {1, 2}
    fitted = sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "drafters").glob("*/*"))
    assert fitted == ["eagle", "lm"]
    text = printed(tmp_path / "executed.ipynb")
    assert text.count("fitted the EAGLE head") == text.count("fitted the small-LM drafter") == 1
    assert text.count("reusing the EAGLE head") == text.count("reusing the small-LM drafter") == 1
    assert "2 prompts of " + str(task) in text
    assert_reads_well(tmp_path / "executed.ipynb")
