"""Drafter-KD (compress.drafter_kd): the data are the teacher's own rollouts, the KD moves a
depth-pruned student toward the teacher on them, and the distilled student drafts losslessly."""
import copy

import pytest
import torch

from tests.helpers.models import tiny_model
from workbench.compress.distill import DistillConfig, kl_to_teacher
from workbench.compress.drafter_kd import (agreement, distill_drafter, rollout_batches,
                                           rollout_sequences)
from workbench.compress.plan import PrunePlan
from workbench.compress.prune import prune
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative import LMDrafter
from workbench.tasks import get_problems

ROLLOUTS = dict(samples=2, max_new_tokens=24)


def prompts(n, seed):
    return [p.prompt for p in get_problems("running_sum", n, seed=seed)]


@pytest.fixture(scope="module")
def teacher(tokenizer):
    """A 2-layer random teacher with peaked next-token distributions (its LM head scaled up),
    so that a student has something to learn."""
    model = tiny_model("llama", tokenizer, layers=2)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8)
    return model


def depth_pruned(teacher):
    """The teacher's last layer alone: a depth-pruned student, every width kept."""
    c = teacher.config
    return prune(teacher, PrunePlan((1,), c.hidden_size, c.intermediate_size, 2))


def config(**kw):
    return DistillConfig.flat(**{**dict(horizon=30, batch_size=8, lr=1e-3, warmup=0,
                                        eval_every=0, keep_best=False, seed=0,
                                        progress=False), **kw})


def test_rollout_sequences_are_the_engines_greedy_and_sampled_rollouts(teacher, tokenizer):
    ps = prompts(3, seed=11)
    seqs, starts = rollout_sequences(teacher, tokenizer, ps, seed=4, **ROLLOUTS)
    engine = RolloutEngine(teacher, tokenizer)
    greedy = engine.rollout(ps, RolloutConfig(max_new_tokens=24), progress=False)
    sampled = engine.rollout(ps, RolloutConfig(max_new_tokens=24, temperature=1.0, seed=4,
                                               samples_per_prompt=2), progress=False)
    expected = [(r.prompt_ids + r.tokens, len(r.prompt_ids))
                for r in greedy.requests + sampled.requests]
    assert list(zip(seqs, starts)) == expected
    assert starts[0] == len(tokenizer(ps[0])["input_ids"])  # as the engine encodes a prompt
    batches = rollout_batches(teacher, tokenizer, ps, batch_size=4, seed=4, **ROLLOUTS)
    scored = sum(int(b[2][:, 1:].sum()) for b in batches)
    assert scored == sum(len(s) - st for s, st in zip(seqs, starts))  # responses only


def test_drafter_kd_moves_a_pruned_student_toward_the_teacher_on_its_rollouts(teacher,
                                                                              tokenizer):
    held_out = rollout_batches(teacher, tokenizer, prompts(8, seed=12), temperatures=(0.0,),
                               **ROLLOUTS)
    student = depth_pruned(teacher)
    kl_before = kl_to_teacher(student, teacher, held_out)
    agree_before = agreement(student, teacher, held_out)
    teacher_weights = copy.deepcopy(teacher.state_dict())
    kd = distill_drafter(student, teacher, tokenizer, prompts(24, seed=13),
                         prompts(8, seed=12), config(), **ROLLOUTS)
    kl_after = kl_to_teacher(student, teacher, held_out)
    assert kl_after < 0.5 * kl_before
    assert agreement(student, teacher, held_out) > agree_before
    assert kd.evals["eval_kl"].tolist() == pytest.approx([kl_before, kl_after])
    assert all(torch.equal(v, teacher_weights[k]) for k, v in teacher.state_dict().items())


def test_a_distilled_drafter_stays_lossless(teacher, tokenizer):
    student = depth_pruned(teacher)
    distill_drafter(student, teacher, tokenizer, prompts(16, seed=13), (),
                    config(horizon=10), **ROLLOUTS)
    engine = RolloutEngine(teacher, tokenizer)
    ps = prompts(6, seed=14)
    cfg = RolloutConfig(max_new_tokens=32, max_batch_size=3)
    plain = engine.rollout(ps, cfg, progress=False)
    for k in (2, 4):
        sd = engine.rollout(ps, cfg, drafter=LMDrafter(student, tokenizer), spec_k=k,
                            progress=False)
        assert sd.tokens == plain.tokens
        assert sd.timeline.requests["verify_steps"].sum() > 0


@pytest.mark.parametrize("kw, match", [
    (dict(prompts=[]), "prompts is empty"),
    (dict(prompts="a1?"), "a non-empty list of prompts"),
    (dict(temperatures=(-1.0,)), "temperatures"),
    (dict(temperatures=()), "temperatures is empty"),
    (dict(samples=0), "samples"),
    (dict(config=DistillConfig.flat(mode="ce")), "accepted: 'kd'"),
])
def test_bad_input_is_refused_before_anything_runs(teacher, tokenizer, kw, match):
    student = depth_pruned(teacher)
    weights = copy.deepcopy(student.state_dict())
    args = {"prompts": prompts(2, seed=15), **kw}
    with pytest.raises(ValueError, match=match):
        distill_drafter(student, teacher, tokenizer, **args)
    assert all(torch.equal(v, weights[k]) for k, v in student.state_dict().items())
