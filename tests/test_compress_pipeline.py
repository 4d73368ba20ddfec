"""The compression recipe end to end on tiny models: prune + distill stages, the iterative
pipeline, the ranking ablation, the architecture search and the comparison table."""
import math
import time
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.helpers.models import tiny_model
from workbench.compress.data import budget_tokens, distill_data, lm_loss, seeded_order
from workbench.compress.distill import DistillConfig
from workbench.compress import evaluate
from workbench.compress.evaluate import compare_models, count_params, steady_decode_tok_s
from workbench.compress.importance import calibration_batches
from workbench.compress.iterative import compress_step, iterative_compress, pick_plan
from workbench.compress.plan import PrunePlan, param_count
from workbench.compress.prune import prune
from workbench.compress.studies import (RETRAININGS, architecture_search, ranking_ablation,
                                        retraining_study, token_savings, tokens_to_reach)


@pytest.fixture(scope="module")
def setup(tokenizer):
    teacher = tiny_model("llama", tokenizer, layers=4, dtype=torch.float32)
    calibration = calibration_batches(tokenizer, num=8, batch_size=4, max_len=48)
    train, held_out = distill_data(tokenizer, num=128, eval_num=4, batch_size=4, max_len=48)
    config = DistillConfig.flat(horizon=3, batch_size=4, eval_every=0, progress=False)
    return teacher, calibration, train, held_out, config


def test_compress_step_gives_a_distilled_hf_model_near_the_target(setup, tmp_path):
    teacher, calibration, train, held_out, config = setup
    full = PrunePlan.full(teacher.config)
    half_depth = param_count(teacher.config, replace(full, layers=(0, 1)))  # untied: not 0.5
    for kind, target in (("width", 0.5), ("depth", half_depth)):
        stage = compress_step(teacher, target, train, held_out, calibration, kind, config,
                              progress=False)
        goal = target if isinstance(target, int) else target * param_count(teacher.config)
        assert abs(stage.params - goal) <= 0.05 * goal
        assert stage.params == count_params(stage.model)
        assert len(stage.history) == 3
        assert stage.loss_after_distill == pytest.approx(lm_loss(stage.model, held_out))
        if kind == "depth":
            assert len(stage.plan.layers) < teacher.config.num_hidden_layers
        else:
            assert len(stage.plan.layers) == teacher.config.num_hidden_layers
    stage.model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 7, 9]])
    assert torch.equal(again(ids).logits, stage.model(ids).logits)


def test_iterative_pipeline_prunes_each_stage_from_the_previous(setup):
    teacher, calibration, train, held_out, config = setup
    stages = iterative_compress(teacher, (0.5, 0.25), train, held_out, calibration,
                                config=config, progress=False)
    source = param_count(teacher.config)
    assert [s.name for s in stages] == ["width_50pct", "width_25pct"]
    for stage, fraction in zip(stages, (0.5, 0.25)):
        assert abs(stage.params / source - fraction) <= 0.05 * fraction + 1e-9
    # the second plan is a plan of the first student, not of the teacher
    stages[1].plan.check(stages[0].model.config)
    assert stages[1].plan.hidden_size <= stages[0].model.config.hidden_size


def test_ranking_ablation_and_search_tables(setup):
    teacher, calibration, train, held_out, config = setup
    plan = pick_plan(teacher.config, 0.5, "width")
    table = ranking_ablation(teacher, plan, calibration, held_out, progress=False)
    assert len(table) == 8 and {"random", "weight magnitude", "activation l2/mean"} <= set(
        table["ranking"])
    assert table["lm_loss"].is_monotonic_increasing
    search = architecture_search(teacher, 0.5, calibration, train, held_out, top=2,
                                 config=config, progress=False)
    assert len(search) >= 8
    assert list(search["loss_pruned_rank"]) == sorted(search["loss_pruned_rank"])
    assert search["loss_retrained_rank"].notna().sum() == 2


def test_compare_models_table(setup, tokenizer, tmp_path):
    teacher, *_ = setup
    student = tiny_model("llama", tokenizer, layers=2, dtype=torch.float32)
    text = tmp_path / "notes.txt"
    text.write_text("the first line of a text file\n\nand a second one\n")
    table = compare_models({"teacher": teacher, "student": student}, tokenizer,
                           batch_sizes=(1, 2), num=3, max_new_tokens=8, decode_tokens=4,
                           text_file=text, progress=False).set_index("model")
    assert table.loc["student", "ppl_text"] == pytest.approx(
        math.exp(table.loc["student", "lm_loss_text"]))
    assert table.loc["teacher", "ideal_speedup"] == 1.0
    assert table.loc["student", "ideal_speedup"] > 1.5
    assert table.loc["student", "params"] == count_params(student)
    assert {"lm_loss_task", "accuracy", "tok_s_b1", "speedup_b2", "speedup_b2_range"} <= set(
        table.columns)
    assert table["disturbed_share_b2"].between(0, 1).all()  # the timed repeats' share


def test_the_teacher_is_timed_long_enough_to_repeat(tokenizer, monkeypatch):
    """Waves of ``wave_tokens`` per row after a warm-up, until ``min_seconds`` and
    ``min_waves``; the fastest wave (other work only slows a wave down)."""
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    waves = []

    def recorded(engine, prompts, batch_size, max_new_tokens):
        waves.append((batch_size, max_new_tokens,
                      real(engine, prompts, batch_size, max_new_tokens)))
        return waves[-1][2]

    real = evaluate.decode_tok_s
    monkeypatch.setattr(evaluate, "decode_tok_s", recorded)
    start = time.perf_counter()
    tok_s = steady_decode_tok_s(model, tokenizer, 2, min_seconds=0.5, wave_tokens=8)
    assert time.perf_counter() - start >= 0.5
    assert len(waves) >= 1 + 3 and {w[:2] for w in waves} == {(2, 8)}
    assert tok_s == max(rate for *_, rate in waves[1:]) > 0  # the warm-up wave is not counted
    for bad, message in ((dict(batch_size=0), "batch_size must be an integer >= 1"),
                         (dict(min_seconds=-1.0), "min_seconds must be a finite number >= 0"),
                         (dict(wave_tokens=2.5), "wave_tokens must be an integer >= 1")):
        with pytest.raises(ValueError, match=message):
            steady_decode_tok_s(model, tokenizer, **{"batch_size": 2, **bad})


def test_bad_targets_and_kinds(setup):
    teacher, calibration, train, held_out, config = setup
    with pytest.raises(ValueError, match="largest first"):
        iterative_compress(teacher, (0.25, 0.5), train, held_out, calibration, config=config)
    with pytest.raises(ValueError, match="kind must be one of 'width', .*, got 'sideways'"):
        pick_plan(teacher.config, 0.5, "sideways")
    with pytest.raises(ValueError, match=r"target 1000000000 is not accepted.*feasible "
                                         r"width plans keep 0\.\d\d-0\.\d\d"):
        pick_plan(teacher.config, 10 ** 9, "width")


def test_retraining_study_runs_every_retraining_on_equal_tokens(setup):
    teacher, calibration, train, held_out, config = setup
    student = prune(teacher, pick_plan(teacher.config, 0.5, "width"))
    cfg = config.updated(horizon=4, eval_every=2)
    curves, models = retraining_study(teacher, student, train, held_out, cfg,
                                      layer_pairs=((2, 2), (4, 4)), progress=False)
    assert list(models) == [(r, 0) for r in RETRAININGS]
    final = curves[curves["step"] == 4].set_index("run")["tokens"]
    assert final.nunique() == 1 and final.iloc[0] == budget_tokens(seeded_order(train, 0), 4)
    assert (curves.groupby("run")["best"].sum() == 1).all()  # the evaluation each model keeps
    assert not any(torch.equal(a, b) for a, b in zip(models[RETRAININGS[0], 0].parameters(),
                                                     models[RETRAININGS[2], 0].parameters()))


def test_tokens_to_reach_interpolates_between_evaluations():
    import pandas as pd
    curves = pd.DataFrame({"run": "a", "tokens": [0, 100, 200], "lm_loss": [3.0, 2.0, 1.0]})
    assert tokens_to_reach(curves, "a", 1.5) == 150.0
    assert tokens_to_reach(curves, "a", 3.5) == 0.0
    assert math.isnan(tokens_to_reach(curves, "a", 0.5))


def test_token_savings_reads_the_curves():
    import pandas as pd
    curves = pd.DataFrame({
        "run": [RETRAININGS[0]] * 3 + [RETRAININGS[3]] * 3,
        "tokens": [0, 100, 200] * 2,
        "lm_loss": [3.0, 1.0, 0.5, 5.0, 3.0, 2.0]})
    out = token_savings(curves)
    # scratch ends at 2.0 after 200 tokens; KD passes 2.0 half way between 0 and 100 tokens
    assert out["tokens_kd_to_scratch_loss"] == 50.0
    assert out["token_savings_vs_scratch"] == 4.0
    assert out["token_savings_lower_bound"] == 2.0  # first evaluation at or below: 100 tokens
