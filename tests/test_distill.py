"""Distillation: the KD loss against a hand computation, exact resume with projections, KD that
moves a student towards its teacher, teacher correction, a narrower student, the CE / scratch
baselines through the same entry point, and clear errors."""
import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from tests.helpers.models import tiny_model
from workbench.compress.data import distill_data, lm_loss
from workbench.compress.distill import (DistillConfig, Distiller, correct_teacher, distill,
                                        kl_to_teacher, scratch_like)
from workbench.compress.kd_loss import kd_loss
from workbench.train import isolated_rng, train_state_dir


class Interrupted(Exception):
    pass


def config(**kw):
    base = dict(horizon=6, batch_size=4, lr=1e-2, warmup=0, eval_every=3, checkpoint_every=2,
                seed=5, progress=False)
    return DistillConfig.flat(**{**base, **kw})


@pytest.fixture(scope="module")
def data(tokenizer):
    return distill_data(tokenizer, "running_sum", num=160, eval_num=4, batch_size=4, max_len=32)


def narrow_model(tokenizer, hidden=48, layers=1, seed=1, vocab=None):
    """A small Llama of width ``hidden`` (4 heads) beside the conftest's width-64 ones."""
    cfg = LlamaConfig(vocab_size=vocab or len(tokenizer), hidden_size=hidden,
                      intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2,
                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    with isolated_rng(seed):
        return LlamaForCausalLM(cfg).double()


def peaked_teacher(tokenizer):
    """A random teacher whose next-token distributions are far from uniform (its LM head
    scaled up), so that a student has something to learn."""
    teacher = tiny_model("llama", tokenizer, layers=2)
    with torch.no_grad():
        teacher.get_output_embeddings().weight.mul_(20)
    return teacher


def random_case(seed=0, batch=2, length=5, vocab=7):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64)
    teacher = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64)
    targets = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 3:] = 0
    return student, teacher, targets, mask


def hand_kl(student, teacher, mask, tau):
    """KL(teacher || student) at temperature tau, tau^2-scaled, mean over the masked tokens."""
    def log_softmax(z):
        e = torch.exp(z / tau)
        return torch.log(e / e.sum(-1, keepdim=True))
    p_teacher = torch.exp(log_softmax(teacher))
    per_token = (p_teacher * (log_softmax(teacher) - log_softmax(student))).sum(-1) * tau ** 2
    return (per_token * mask).sum() / mask.sum()


def hand_ce(logits, targets, mask):
    logp = torch.log(torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True))
    picked = logp.gather(-1, targets[..., None])[..., 0]
    return -(picked * mask).sum() / mask.sum()


def hand_cosine(student_state, teacher_state, weight, mask):
    projected = student_state @ weight.T
    cos = (projected * teacher_state).sum(-1) / (projected.norm(dim=-1)
                                                 * teacher_state.norm(dim=-1))
    return ((1 - cos) * mask).sum() / mask.sum()


def test_kd_loss_matches_hand_computation_on_logits():
    student, teacher, _, mask = random_case()
    total, metrics = kd_loss(student, teacher, mask, temperature=2.0)
    expected = hand_kl(student, teacher, mask, 2.0)
    assert torch.allclose(total, expected, rtol=1e-12, atol=0)
    assert torch.allclose(metrics["kl"], expected, rtol=1e-12, atol=0)
    assert set(metrics) == {"kl"}


def test_kd_loss_adds_weighted_cross_entropy():
    student, teacher, targets, mask = random_case(seed=1)
    total, metrics = kd_loss(student, teacher, mask, 1.5, targets=targets, ce_weight=0.3)
    ce = hand_ce(student, targets, mask)
    assert torch.allclose(metrics["ce"], ce, rtol=1e-12, atol=0)
    assert torch.allclose(total, hand_kl(student, teacher, mask, 1.5) + 0.3 * ce,
                          rtol=1e-12, atol=0)


def test_kd_loss_balances_an_intermediate_pair_with_detached_alpha():
    student, teacher, _, mask = random_case(seed=2)
    g = torch.Generator().manual_seed(3)
    student_state = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    teacher_state = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    projection = torch.nn.Linear(3, 4, bias=False).double()
    total, metrics = kd_loss(student, teacher, mask, 1.0, student_hidden=[student_state],
                             teacher_hidden=[teacher_state], projections=[projection])
    kl = hand_kl(student, teacher, mask, 1.0)
    weight = projection.weight.detach().clone().requires_grad_(True)
    cosine = hand_cosine(student_state, teacher_state, weight, mask)
    alpha = kl / cosine.detach()
    assert torch.allclose(metrics["intermediate"], cosine.detach(), rtol=1e-12, atol=0)
    assert torch.allclose(metrics["alpha"], alpha, rtol=1e-12, atol=0)
    assert torch.allclose(total, kl + alpha * cosine, rtol=1e-12, atol=0)
    # alpha is a constant to the gradient: d total / dW = alpha * d cosine / dW (were alpha
    # not detached, alpha * cosine would be the constant kl and the gradient would vanish)
    total.backward()
    cosine.backward()
    assert torch.allclose(projection.weight.grad, alpha * weight.grad, rtol=1e-10, atol=0)
    assert projection.weight.grad.abs().max() > 1e-6


def test_a_student_identical_to_its_teacher_has_zero_loss(tokenizer, data):
    teacher = tiny_model("llama", tokenizer)
    distiller = Distiller(copy.deepcopy(teacher), teacher, data[0], config(horizon=1))
    history = distiller.run()
    assert history.loc[0, "kl"] == 0.0
    assert history.loc[0, "loss"] == 0.0
    assert history.loc[0, "ce"] > 0  # reported, not added: ce_weight is 0


def run_narrow(tokenizer, data, checkpoint_dir=None, batches=None, steps=None):
    teacher = tiny_model("llama", tokenizer, layers=2)
    distiller = Distiller(narrow_model(tokenizer), teacher, batches or data[0],
                          config(layer_pairs=[(1, 2)], ce_weight=0.5), data[1],
                          checkpoint_dir=checkpoint_dir)
    distiller.run(steps)
    return distiller


def test_interrupted_distillation_resumes_to_the_same_weights(tokenizer, data, tmp_path):
    whole = run_narrow(tokenizer, data)

    def crashing(step):
        if step == 5:
            raise Interrupted
        return data[0][step % len(data[0])]

    with pytest.raises(Interrupted):  # the last checkpoint is at step 4
        run_narrow(tokenizer, data, tmp_path / "state", batches=crashing)
    resumed = run_narrow(tokenizer, data, tmp_path / "state")
    assert resumed.trainer.steps_done == whole.trainer.steps_done == 6
    mine, theirs = resumed.module.state_dict(), whole.module.state_dict()
    assert mine.keys() == theirs.keys() and "projections.0.weight" in mine
    for key in mine:
        if key != "_extra_state":
            assert torch.equal(mine[key], theirs[key]), key
    assert resumed.evals.equals(whole.evals)
    assert list(resumed.evals["step"]) == [0, 3, 6]
    assert resumed.history["loss"].tolist() == whole.history["loss"].tolist()


def test_kd_moves_the_student_towards_the_teacher(tokenizer, data):
    teacher = peaked_teacher(tokenizer)
    student = tiny_model("llama", tokenizer, seed=1, layers=1)
    before = kl_to_teacher(student, teacher, data[1])
    teacher_weights = {k: v.clone() for k, v in teacher.state_dict().items()}
    distiller = Distiller(student, teacher, data[0],  # a random teacher: its KL, not the data's
                          config(horizon=30, eval_every=0, keep_best=False), data[1])
    distiller.run()
    after = kl_to_teacher(student, teacher, data[1])
    assert after < 0.7 * before
    assert all(torch.equal(v, teacher_weights[k]) for k, v in teacher.state_dict().items())
    assert all(p.requires_grad for p in teacher.parameters())  # its flags came back
    evals = distiller.evals
    assert evals["step"].tolist() == [0, 30]
    assert evals["eval_kl"].tolist() == [before, after]


def test_teacher_correction_trains_a_copy(tokenizer, data):
    teacher = tiny_model("llama", tokenizer)
    original = {k: v.clone() for k, v in teacher.state_dict().items()}
    corrected = correct_teacher(teacher, data[0], steps=8, lr=1e-2)
    assert corrected is not teacher
    for key, value in teacher.state_dict().items():
        assert torch.equal(value, original[key]), key
    assert any(not torch.equal(v, original[k]) for k, v in corrected.state_dict().items())
    assert lm_loss(corrected, data[0]) < lm_loss(teacher, data[0])


def test_a_narrower_student_learns_through_its_projection(tokenizer, data):
    distiller = run_narrow(tokenizer, data, steps=12)
    projection = distiller.projections[0].weight
    assert projection.shape == (64, 48)
    with isolated_rng(5):
        initial = torch.nn.Linear(48, 64, bias=False).weight.double()
    assert not torch.equal(projection.detach(), initial)
    intermediate = distiller.history["intermediate"]
    assert intermediate.tail(4).mean() < intermediate.head(4).mean()
    assert math.isfinite(distiller.history["loss"].iloc[-1])


def test_ce_and_scratch_run_through_distill_with_token_counts(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer)
    fresh = scratch_like(model, seed=2)
    assert type(fresh) is type(model) and fresh.dtype == model.dtype
    assert not torch.equal(fresh.lm_head.weight, model.lm_head.weight)
    out = tmp_path / "ce"
    student, history, evals = distill(fresh, None, tokenizer, num=160, eval_num=4, max_len=32,
                                      config=config(mode="ce", eval_every=2), out_dir=out)
    assert student is fresh and {"ce", "tokens", "tokens_seen"} <= set(history.columns)
    assert history["tokens_seen"].tolist() == history["tokens"].cumsum().tolist()
    assert evals["step"].tolist() == [0, 2, 4, 6]
    assert evals["tokens_seen"].iloc[-1] == history["tokens_seen"].iloc[-1]
    assert evals["eval_loss"].iloc[-1] < evals["eval_loss"].iloc[0]
    assert not train_state_dir(out).exists() and (out / "evals.csv").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
    ids = torch.tensor([[1, 5, 9, 12]])
    assert torch.equal(loaded(input_ids=ids).logits, student(input_ids=ids).logits)


def test_bad_input_gets_a_clear_error(tokenizer, data):
    teacher = tiny_model("llama", tokenizer)
    with pytest.raises(ValueError, match=r"vocabulary mismatch.*101.*100"):
        Distiller(narrow_model(tokenizer, vocab=101), teacher, data[0], config())
    for bad in (0, -1.0, math.inf):
        with pytest.raises(ValueError, match=rf"temperature must be a finite number > 0, "
                                             rf"got {bad!r}"):
            config(temperature=bad)
    with pytest.raises(ValueError, match=r"layer pair \(5, 1\): student index 5 .* 0\.\.1"):
        Distiller(narrow_model(tokenizer), teacher, data[0], config(layer_pairs=[(5, 1)]))
    with pytest.raises(ValueError, match=r"layer pair \(0, 3\): teacher index 3 .* 0\.\.2"):
        Distiller(narrow_model(tokenizer), teacher, data[0], config(layer_pairs=[(0, 3)]))
    with pytest.raises(ValueError, match=r"mode must be one of 'kd', 'ce', got 'mse'"):
        config(mode="mse")
    with pytest.raises(ValueError, match=r"mode='kd' needs a teacher"):
        Distiller(narrow_model(tokenizer), None, data[0], config())
    with pytest.raises(ValueError, match=r"DistillConfig\.train: TrainConfig\.lr must be"):
        config(lr=0)
    with pytest.raises(ValueError, match=r"needs mode='kd'"):
        config(mode="ce", layer_pairs=[(0, 0)])
    with pytest.raises(ValueError, match=r"\(1, -2\): the teacher index must be an integer "
                                         r">= 0, got -2"):
        config(layer_pairs=[(1, -2)])
    with pytest.raises(ValueError, match=r"ce_weight must be a finite number >= 0, got -0.5"):
        config(ce_weight=-0.5)


def test_spread_layer_pairs_fit_any_depth():
    from types import SimpleNamespace

    from workbench.compress.distill import spread_layer_pairs

    def model(layers):
        return SimpleNamespace(config=SimpleNamespace(num_hidden_layers=layers))
    assert spread_layer_pairs(model(6), model(6)) == ((2, 2), (4, 4), (6, 6))  # the old default
    assert spread_layer_pairs(model(2), model(2)) == ((1, 1), (2, 2))          # a user's 2 layers
    assert spread_layer_pairs(model(3), model(6)) == ((1, 2), (2, 4), (3, 6))  # depth-pruned
    assert spread_layer_pairs(model(1), model(4)) == ((1, 4),)
