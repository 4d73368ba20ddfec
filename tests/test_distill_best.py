"""A schedule that cannot hurt a good student: distillation warms up then decays by a cosine by
default, and keeps the weights of its best held-out evaluation, restored at the horizon (also
across an interruption), so a student within 0.01 nats of its teacher does not end worse than
it started, even at a learning rate far too large for it."""
import copy
import math

import pytest
import torch

from tests.helpers.models import tiny_model
from workbench.compress.data import distill_data, lm_loss
from workbench.compress.distill import DistillConfig, Distiller
from workbench.train_config import lr_at


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def data(tokenizer):
    return distill_data(tokenizer, "running_sum", num=160, eval_num=8, batch_size=4, max_len=48)


def near_teacher(tokenizer, held_out):
    """``(teacher, student)``: the student is the teacher with its weights nudged, within 0.01
    nats of it on ``held_out``."""
    teacher = tiny_model("llama", tokenizer, layers=2)
    student = copy.deepcopy(teacher)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    assert 0 < abs(lm_loss(student, held_out) - lm_loss(teacher, held_out)) < 0.01
    return teacher, student


def too_fast(**kw):
    """A few KD steps at an lr far too large for a student near its teacher."""
    base = dict(horizon=6, batch_size=4, lr=0.3, warmup=0, eval_every=2, seed=5,
                checkpoint_every=1, progress=False)
    return DistillConfig.flat(**{**base, **kw})


def test_the_default_schedule_warms_up_then_decays_by_a_cosine():
    train = DistillConfig().train
    assert (train.schedule, train.warmup, train.lr_floor) == ("cosine", 10, 0.1)
    lrs = [lr_at(step, train) for step in range(train.horizon + 1)]
    assert lrs[:10] == pytest.approx([train.lr * (s + 1) / 10 for s in range(10)])
    assert lrs[10] == train.lr and max(lrs) == train.lr
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # decays, never rises again
    assert lrs[train.horizon] == pytest.approx(0.1 * train.lr)
    assert DistillConfig.flat(horizon=50).train.schedule == "cosine"  # flat keeps it


def test_a_near_teacher_student_does_not_end_worse_than_it_started(tokenizer, data, capsys):
    train, held_out = data
    teacher, student = near_teacher(tokenizer, held_out)
    start_loss = lm_loss(student, held_out)
    start = {k: v.clone() for k, v in student.state_dict().items()}
    distiller = Distiller(student, teacher, train, too_fast(progress=True), held_out)
    distiller.run()
    evals = distiller.evals
    assert evals["step"].tolist() == [0, 2, 4, 6]
    assert evals["eval_loss"].iloc[-1] > start_loss + 0.01  # the lr did hurt the last weights
    assert lm_loss(student, held_out) <= start_loss            # ... but the student ends no worse
    best = int(evals["eval_loss"].idxmin())
    assert evals["best"].tolist() == [i == best for i in range(4)]
    assert distiller.restored == evals["step"][best]
    assert lm_loss(student, held_out) == evals["eval_loss"][best]  # the weights of that row
    if distiller.restored == 0:
        assert all(torch.equal(v, start[k]) for k, v in student.state_dict().items())
    assert (f"kept the step-{distiller.restored} weights (held-out LM loss "
            f"{evals['eval_loss'][best]:.4f}), the best of 4 evaluations; step 6 had "
            f"{evals['eval_loss'].iloc[-1]:.4f}") in capsys.readouterr().out


def test_without_keep_best_the_student_keeps_its_last_weights(tokenizer, data):
    train, held_out = data
    teacher, student = near_teacher(tokenizer, held_out)
    distiller = Distiller(student, teacher, train, too_fast(keep_best=False), held_out)
    distiller.run()
    assert distiller.restored is None and not distiller.evals["best"].any()
    assert lm_loss(student, held_out) == distiller.evals["eval_loss"].iloc[-1]
    with pytest.raises(ValueError, match=r"keep_best must be True or False, got 'yes'"):
        too_fast(keep_best="yes")


def test_the_best_weights_survive_an_interruption(tokenizer, data, tmp_path):
    train, held_out = data
    teacher, student = near_teacher(tokenizer, held_out)
    whole = Distiller(copy.deepcopy(student), teacher, train, too_fast(), held_out)
    whole.run()

    def crashing(step):
        if step == 5:
            raise Interrupted
        return train[step % len(train)]

    with pytest.raises(Interrupted):  # the checkpoint at step 5 holds the best so far
        Distiller(copy.deepcopy(student), teacher, crashing, too_fast(), held_out,
                  checkpoint_dir=tmp_path / "state").run()
    resumed = Distiller(copy.deepcopy(student), teacher, train, too_fast(), held_out,
                        checkpoint_dir=tmp_path / "state")
    assert resumed.trainer.steps_done == 5 and resumed.restored is None
    resumed.run()
    assert resumed.restored == whole.restored and resumed.evals.equals(whole.evals)
    assert resumed.restored < 5  # kept before the interruption, restored after it
    mine, theirs = resumed.student.state_dict(), whole.student.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert math.isfinite(resumed.evals["eval_loss"].min())
