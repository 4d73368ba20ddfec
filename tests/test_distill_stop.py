"""The stop token in distillation: a task's distillation texts end with EOS where the response
ends, the position that predicts it is in the loss mask, the KD loss counts it, and a few KD
steps train it (the student's KL to its teacher at the stop token falls, and falls less when the
stop token is masked out)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.models import tiny_model
from workbench.compress.data import distill_data
from workbench.compress.distill import DistillConfig, Distiller


def config(**kw):
    base = dict(horizon=20, batch_size=4, lr=1e-2, warmup=0, eval_every=0, seed=5,
                schedule="constant", progress=False)
    return DistillConfig.flat(**{**base, **kw})


@pytest.fixture(scope="module")
def data(tokenizer):
    """Whole examples (no max_len: nothing cut before its stop token)."""
    return distill_data(tokenizer, "running_sum", num=96, eval_num=8, batch_size=4)


def stop_targets(batch, eos: int) -> torch.Tensor:
    """``[B, T-1]``: 1 where the next token is a scored stop token (the position whose loss is
    the stop token's)."""
    ids, _, scored = batch
    return ((ids[:, 1:] == eos) & (scored[:, 1:] == 1)).long()


def kl_per_position(student, teacher, ids, mask) -> torch.Tensor:
    """``[B, T-1]`` KL(teacher || student) of each next-token distribution, by hand."""
    with torch.no_grad():
        s = student(input_ids=ids, attention_mask=mask).logits[:, :-1]
        t = teacher(input_ids=ids, attention_mask=mask).logits[:, :-1]
    p = F.softmax(t, -1)
    return (p * (F.log_softmax(t, -1) - F.log_softmax(s, -1))).sum(-1)


def stop_kl(student, teacher, batches, eos: int) -> float:
    """The student's mean KL to its teacher at the stop-token positions of ``batches``."""
    total, count = 0.0, 0
    for batch in batches:
        at_stop = stop_targets(batch, eos)
        total += float((kl_per_position(student, teacher, *batch[:2]) * at_stop).sum())
        count += int(at_stop.sum())
    return total / count


def peaked_teacher(tokenizer):
    """A random teacher far from uniform, so that a student has something to learn."""
    teacher = tiny_model("llama", tokenizer, layers=2)
    with torch.no_grad():
        teacher.get_output_embeddings().weight.mul_(20)
    return teacher


def test_every_example_ends_with_a_scored_stop_token(tokenizer, data):
    train, held_out = data
    for ids, mask, scored in train + held_out:
        lengths = mask.sum(1)
        rows = torch.arange(len(ids))
        assert (ids[rows, lengths - 1] == tokenizer.eos_token_id).all()  # the last real token
        assert (scored[rows, lengths - 1] == 1).all()                     # scored
        valid = scored[:, 1:]  # the distiller's loss mask over next-token targets
        assert (valid[rows, lengths - 2] == 1).all()
    assert sum(int(stop_targets(b, tokenizer.eos_token_id).sum()) for b in train) == 96


def test_the_kd_loss_counts_the_stop_position(tokenizer, data):
    """Step 1's KL is the mean over every scored position, the stop token's included (float64,
    by hand); leaving the stop positions out would give another number."""
    train, _ = data
    teacher = peaked_teacher(tokenizer)
    student = tiny_model("llama", tokenizer, seed=1, layers=1)
    ids, mask, scored = train[0]
    per_position = kl_per_position(student, teacher, ids, mask)
    valid, at_stop = scored[:, 1:], stop_targets(train[0], tokenizer.eos_token_id)
    with_stop = float((per_position * valid).sum() / valid.sum())
    no_stop = valid * (1 - at_stop)
    without_stop = float((per_position * no_stop).sum() / no_stop.sum())
    history = Distiller(student, teacher, train, config(horizon=1)).run()
    assert history.loc[0, "kl"] == pytest.approx(with_stop, rel=1e-9)
    assert history.loc[0, "kl"] != pytest.approx(without_stop, rel=1e-6)
    assert history.loc[0, "tokens"] == int(valid.sum())


def without_stop(batches, eos: int) -> list:
    """The same batches with every stop token unscored (the old data, for the control)."""
    out = []
    for ids, mask, scored in batches:
        unscored = scored.clone()
        unscored[(ids == eos)] = 0
        out.append((ids, mask, unscored))
    return out


def test_a_few_kd_steps_train_the_stop_token(tokenizer, data):
    train, held_out = data
    eos = tokenizer.eos_token_id
    teacher = peaked_teacher(tokenizer)
    start = tiny_model("llama", tokenizer, seed=1, layers=1)
    before = stop_kl(start, teacher, held_out, eos)
    trained, control = copy.deepcopy(start), copy.deepcopy(start)
    Distiller(trained, teacher, train, config()).run()
    Distiller(control, teacher, without_stop(train, eos), config()).run()
    after, after_control = (stop_kl(m, teacher, held_out, eos) for m in (trained, control))
    assert after < 0.5 * before                     # the stop token's loss is trained
    assert after < 0.9 * after_control              # by its own term, not only by the others
