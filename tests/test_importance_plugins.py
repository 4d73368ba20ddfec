"""The importance-score seam (``workbench.compress.rankings``): a score plugin is checked when
it registers (a missing or misspelled hook refused, naming it), an unknown ranking is refused
listing the registered names, and the worked example (tests/plugins/taylor_importance.py)
ranks units in the ranking ablation and the pipeline like a built-in, into a valid HF model."""
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from workbench.compress.data import distill_data, lm_loss
from workbench.compress.distill import DistillConfig
from workbench.compress.importance import calibration_batches, importance_from_batches
from workbench.compress.iterative import compress_step, pick_plan, seeded_pipelines
from workbench.compress.prune import prune
from workbench.compress.rankings import (DEFAULT_RANKINGS, IMPORTANCE, ImportanceScore,
                                         check_ranking, check_rankings, importance_score,
                                         resolve)
from workbench.compress.scores import UnitScores
from workbench.compress.studies import ranking_ablation
from workbench.plugins import load_plugins
from workbench.registry import PluginError

TAYLOR = Path(__file__).resolve().parent / "plugins" / "taylor_importance.py"
BUILT_INS = r"\['activation', 'weight_magnitude', 'random'"


@pytest.fixture(scope="module")
def teacher(tokenizer):
    """A 4-layer Llama (GQA 4/2), float32, random weights."""
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def data(tokenizer):
    calibration = calibration_batches(tokenizer, num=8, batch_size=4, max_len=32)
    train, held_out = distill_data(tokenizer, num=128, eval_num=4, batch_size=4, max_len=48)
    return calibration, train, held_out


@pytest.fixture
def taylor():
    """The worked example loaded as a plugin, forgotten afterwards."""
    load_plugins([str(TAYLOR)])
    yield "taylor"
    IMPORTANCE.unregister("taylor")


def test_the_built_ins_and_the_default_set_are_todays_rankings():
    assert IMPORTANCE.names()[:3] == ["activation", "weight_magnitude", "random"]
    labels = [resolve(r).label for r in check_rankings(DEFAULT_RANKINGS)]
    assert labels == ["activation l2/mean", "activation mean/mean", "activation mean/l2",
                      "activation l2/l2", "activation var/mean", "activation var/l2",
                      "weight magnitude", "random"]
    assert resolve("activation").variant == "l2/mean" and resolve("random").draws_randomly
    assert not resolve("weight_magnitude").needs_calibration


def test_a_score_without_its_scores_hook_is_refused_naming_it():
    with pytest.raises(PluginError, match=r"'lazy'.*lacks the required hook\(s\) \['scores'\]"):
        @importance_score("lazy")
        class Lazy(ImportanceScore):
            label = "lazy"

    with pytest.raises(PluginError, match=r"lacks the required hook\(s\) \['scores'\]"):
        @importance_score("duck")
        class Duck:  # not a subclass: the registry's own hook check
            label = "duck"
    assert "lazy" not in IMPORTANCE and "duck" not in IMPORTANCE


@pytest.mark.parametrize("typo, hook", [("score", "scores"),
                                        ("needs_calibraton", "needs_calibration"),
                                        ("draw_randomly", "draws_randomly")])
def test_a_misspelled_hook_is_refused_at_registration_naming_the_hook(typo, hook):
    def scores(self, teacher, calibration, seed):
        return None
    body = {typo: scores if typo == "score" else False}  # "score": the only scores it has
    if typo != "score":
        body["scores"] = scores
    with pytest.raises(PluginError, match=rf"defines '{typo}', .* looks like the hook '{hook}'"):
        importance_score("typo")(type("Typo", (ImportanceScore,), body))
    assert "typo" not in IMPORTANCE


def test_a_hook_of_the_wrong_kind_is_refused_naming_it():
    with pytest.raises(PluginError, match=r"draws_randomly 'yes'; accepted True or False"):
        @importance_score("bad_flag")
        class BadFlag(ImportanceScore):
            draws_randomly = "yes"

            def scores(self, teacher, calibration, seed):
                return None
    assert "bad_flag" not in IMPORTANCE


def test_an_unknown_ranking_is_refused_listing_the_registered_names(teacher, data, taylor):
    with pytest.raises(ValueError, match=rf"ranking 'taylr': accepted one of {BUILT_INS}, "
                                         r"'taylor'\]"):
        check_rankings(["activation", "taylr"])
    with pytest.raises(ValueError, match=r"variant 'l1/mean' of 'activation'; accepted one of "
                                         r"\['l2/mean'"):
        check_rankings(["activation:l1/mean"])
    with pytest.raises(ValueError, match=r"'activation' and 'activation:l2/mean' are the same"):
        check_rankings(["activation", "activation:l2/mean"])
    with pytest.raises(ValueError, match=r"'taylor:x'.*accepted no variant"):
        check_ranking("taylor:x")
    calibration, _, held_out = data
    plan = pick_plan(teacher.config, 0.5)
    with pytest.raises(ValueError, match=rf"accepted one of {BUILT_INS}"):
        ranking_ablation(teacher, plan, calibration, held_out, rankings=["magnitude"],
                         progress=False)


def test_the_ablation_gives_a_row_per_ranking_the_plugin_among_them(teacher, data, taylor,
                                                                     tmp_path):
    calibration, _, held_out = data
    plan = pick_plan(teacher.config, 0.5)
    table = ranking_ablation(teacher, plan, calibration, held_out, seeds=[0, 1], progress=False,
                             rankings=["activation", "weight_magnitude", "random", "taylor"])
    assert sorted(table["ranking"]) == ["activation l2/mean", "random", "taylor",
                                        "weight magnitude"]
    assert table["lm_loss"].is_monotonic_increasing and table["lm_loss"].notna().all()
    by = table.set_index("ranking")["lm_loss_sd"]
    assert by["taylor"] == 0 and by["random"] > 0  # taylor draws nothing: one score

    scores = resolve("taylor").scores(teacher, calibration, 0)
    assert all(p.grad is None for p in teacher.parameters()) and not teacher.training
    student = prune(teacher, plan, scores)
    student.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([[1, 5, 7, 9]])
    assert torch.equal(again(ids).logits, student(ids).logits)


def test_taylor_scores_a_neuron_by_its_weights_times_their_gradient(teacher, data, taylor):
    """One neuron's score written out: |w * dL/dw| over its gate and up rows and its down
    column, the gradient of the mean loss over the calibration batches."""
    calibration, _, _ = data
    scores = resolve("taylor").scores(teacher, calibration, 0)
    mlp = teacher.model.layers[1].mlp
    params = [mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight]
    grads = [torch.zeros_like(p) for p in params]
    for ids, mask in calibration:
        loss = teacher(input_ids=ids, attention_mask=mask,
                       labels=ids.masked_fill(mask == 0, -100)).loss
        for acc, g in zip(grads, torch.autograd.grad(loss, params)):
            acc += g / len(calibration)
    sal = [(p.detach() * g).abs() for p, g in zip(params, grads)]
    hand = sal[0][7].sum() + sal[1][7].sum() + sal[2][:, 7].sum()
    assert scores.neurons[1, 7].item() == pytest.approx(hand.item(), rel=1e-4)
    assert not torch.equal(scores.neurons.argsort(dim=1), importance_from_batches(
        teacher, calibration, progress=False).scores.neurons.argsort(dim=1))


def test_a_score_without_calibration_gets_none_and_wrong_shapes_name_the_score(teacher, data):
    seen = []

    @importance_score("first_units")
    class FirstUnits(ImportanceScore):
        needs_calibration = False

        def scores(self, teacher, calibration, seed):
            seen.append(calibration)
            c = teacher.config
            return UnitScores(-torch.arange(c.num_attention_heads).repeat(c.num_hidden_layers, 1),
                              torch.zeros(c.num_hidden_layers, c.intermediate_size),
                              torch.zeros(c.hidden_size + 1))
    try:
        with pytest.raises(ValueError, match=r"importance score 'first_units': UnitScores.channels "
                                             r"has shape \(65,\)"):
            resolve("first_units").scores(teacher, data[0], 0)
        assert seen == [None]
    finally:
        IMPORTANCE.unregister("first_units")


def test_the_pipeline_prunes_by_a_registered_ranking(teacher, data, taylor):
    calibration, train, held_out = data
    config = DistillConfig.flat(horizon=1, batch_size=4, eval_every=0, progress=False)
    stage = compress_step(teacher, 0.5, train, held_out, calibration, config=config,
                          progress=False, ranking="taylor")
    plan, scores = stage.plan, resolve("taylor").scores(teacher, calibration, 0)
    ids = torch.tensor([[1, 5, 7, 9]])
    fresh = prune(teacher, plan, scores)
    assert stage.loss_after_prune == pytest.approx(
        lm_loss(fresh, held_out))
    assert fresh(ids).logits.shape[-1] == teacher.config.vocab_size
    with pytest.raises(ValueError, match=rf"ranking 'tayler': accepted one of {BUILT_INS}"):
        seeded_pipelines(teacher, (0.5,), train, held_out, calibration, config=config,
                         ranking="tayler", progress=False)
