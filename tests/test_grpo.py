"""GRPO: advantages and loss against hand-computed values, a real learning signal on a tiny
model, exact resume, and clear errors."""
import math

import pytest
import torch

from workbench.rl import GRPO, GRPOConfig, aggregate, group_advantages, grpo_loss, k3
from workbench.rl.loop import RLLoop
from workbench.tasks import Problem

from .helpers.models import tiny_model
from .helpers.rl import letter_problems, letters_reward


def test_group_advantages_by_hand():
    adv = group_advantages([1, 0, 0, 1, 1, 1, 1, 1, 3, 0], 2, scale=True, eps=0.0)
    # group [1, 0]: mean 0.5, unbiased std sqrt(0.5)
    s = math.sqrt(0.5)
    expect = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0, 0, 1.5 / math.sqrt(4.5),
              -1.5 / math.sqrt(4.5)]
    assert torch.allclose(adv, torch.tensor(expect, dtype=torch.float64))
    raw = group_advantages([1, 0, 0, 0], 4, scale=False)
    assert torch.allclose(raw, torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64))
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages([1, 0, 0, 1], 3)


def _hand_loss(logp, old, adv, mask, eps, how, ref=None, beta=0.0):
    per_seq = []
    for b in range(len(logp)):
        terms = []
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(logp[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - eps), 1 + eps)
            term = -min(ratio * adv[b], clipped * adv[b])
            if ref is not None:
                d = ref[b][t] - logp[b][t]
                term += beta * (math.exp(d) - d - 1)
            terms.append(term)
        per_seq.append(terms)
    if how == "token-mean":
        return sum(sum(t) for t in per_seq) / sum(len(t) for t in per_seq)
    return sum(sum(t) / len(t) for t in per_seq) / len(per_seq)


@pytest.mark.parametrize("how", ["token-mean", "sequence-mean"])
def test_loss_matches_hand_computation(how):
    logp = [[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.5, -9.0, -9.0]]
    old = [[-1.2, -0.5, -1.0, -0.2], [-0.3, -1.0, -9.0, -9.0]]
    ref = [[-1.1, -0.4, -1.5, -0.3], [-0.2, -1.2, -9.0, -9.0]]
    mask = [[1, 1, 1, 1], [1, 1, 0, 0]]
    adv = [0.7, -1.3]
    T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    got = grpo_loss(T(logp), T(old), T(adv), T(mask), 0.2, how, T(ref), 0.05)
    assert got.item() == pytest.approx(_hand_loss(logp, old, adv, mask, 0.2, how, ref, 0.05),
                                       rel=1e-12)
    plain = grpo_loss(T(logp), T(old), T(adv), T(mask), 0.2, how)
    assert plain.item() == pytest.approx(_hand_loss(logp, old, adv, mask, 0.2, how), rel=1e-12)
    # token-mean weighs the long response more than sequence-mean does
    assert aggregate(T([[1.0, 1, 1, 1], [3, 3, 0, 0]]), T(mask), how).item() == pytest.approx(
        10 / 6 if how == "token-mean" else 2.0)


def test_clipped_ratio_stops_the_gradient():
    logp = torch.tensor([[0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss = grpo_loss(logp, old, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2),
                     clip_eps=0.2)
    loss.backward()
    # ratio e^0.5 > 1.2 with a positive advantage: clipped, no gradient; ratio 1: gradient
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0
    assert k3(torch.tensor(0.0)) == 0 and k3(torch.tensor(0.3)) > 0


def test_grpo_raises_the_reward_of_a_tiny_policy(tokenizer):
    torch.manual_seed(0)
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    cfg = GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=8, max_new_tokens=8, lr=3e-2,
                          temperature=1.0, seed=1)
    g = RLLoop(GRPO(model, tokenizer, letter_problems(), letters_reward, cfg))
    hist = g.run(12, progress=False)
    assert list(hist["step"]) == list(range(12))
    assert {"reward", "accuracy", "response_len", "kl_start", "rollout_s",
            "update_s", "step_s"} <= set(hist.columns)
    assert hist["reward"].iloc[-3:].mean() > hist["reward"].iloc[:3].mean() + 0.2
    assert hist["kl_start"].iloc[-1] > hist["kl_start"].iloc[0]


@pytest.mark.parametrize("how", ["token-mean", "sequence-mean"])
def test_resume_is_exact(tokenizer, tmp_path, how):
    cfg = GRPOConfig.flat(prompts_per_step=2, samples_per_prompt=3, max_new_tokens=6, lr=1e-2,
                          epochs=2, minibatches=2, kl_coef=0.1, loss_aggregation=how)

    def fresh(ckpt=None):
        return RLLoop(GRPO(tiny_model("qwen2", tokenizer), tokenizer, letter_problems(),
                           letters_reward, cfg), checkpoint_dir=ckpt)

    straight = fresh()
    straight.run(2, progress=False)
    first = fresh(tmp_path / "ckpt")
    first.run(1, progress=False)
    resumed = fresh(tmp_path / "ckpt")
    assert resumed.rl_step == 1
    resumed.run(1, progress=False)
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    assert straight.history["reward"].tolist() == resumed.history["reward"].tolist()


def test_bad_input_is_refused(tokenizer):
    with pytest.raises(ValueError, match="samples_per_prompt.*>= 2"):
        GRPOConfig.flat(samples_per_prompt=1)
    with pytest.raises(ValueError, match="loss_aggregation"):
        GRPOConfig.flat(loss_aggregation="mean")
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    g = GRPO(model, tokenizer, letter_problems(), lambda p, c, a: "yes",
             GRPOConfig.flat(prompts_per_step=1, samples_per_prompt=2, max_new_tokens=3))
    with pytest.raises(TypeError, match=r"'yes'.*prompt 'q\d\?'"):
        g.step()
    with pytest.raises(ValueError, match="Problem"):
        GRPO(model, tokenizer, ["q?"], letters_reward)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "qwen2_sw", "llama_odd"])
def test_ragged_batch_logprobs_equal_each_sequence_alone(tokenizer, arch):
    """Right padding without a mask is exact: every response token's log-probability in the
    padded batch equals the one of its sequence run alone (sliding windows included)."""
    from workbench.rl.loss import SequenceBatch, sequence_logprobs
    model = tiny_model(arch, tokenizer)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (n,), generator=g).tolist() for n in (3, 9, 5)]
    responses = [torch.randint(3, 60, (n,), generator=g).tolist() for n in (12, 2, 7)]
    with torch.no_grad():
        batch = SequenceBatch.of(prompts, responses, [0, 1, 2], 0, "cpu")
        together = sequence_logprobs(model, batch, 0.7)
        for row, (p, r) in enumerate(zip(prompts, responses)):
            alone = sequence_logprobs(model, SequenceBatch.of([p], [r], [0], 0, "cpu"), 0.7)
            span = slice(len(p) - 1, len(p) + len(r) - 1)
            assert torch.equal(batch.response[row, span], torch.ones(len(r)))
            assert torch.allclose(together[row, span], alone[0, span], atol=1e-12)


def test_groups_with_signal_counts_groups_whose_rewards_differ(tokenizer):
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    g = GRPO(model, tokenizer, letter_problems(), lambda p, c, a: float(p == "q0?"),
             GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=3))
    row = g.step()
    assert row["groups_with_signal"] == 0.0   # every group's rewards are equal
    g2 = GRPO(model, tokenizer, letter_problems(), lambda p, c, a: float(p in ("q0?", "q1?")),
              GRPOConfig.flat(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=3))
    rl = g2.rollout()
    rl.rewards[1] = 1.0 - rl.rewards[0]       # make exactly the first group disagree
    rl.rewards[3] = rl.rewards[2]
    assert g2.update(rl)["groups_with_signal"] == 0.25


def test_a_checkpoint_dir_that_is_a_file_is_refused_before_any_step(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    weights = [p.clone() for p in model.parameters()]
    path = tmp_path / "state.pt"
    path.write_bytes(b"not a folder")
    with pytest.raises(ValueError, match=rf"checkpoint_dir '{path}' is an existing file; it "
                                         "must be a folder"):
        RLLoop(GRPO(model, tokenizer, letter_problems(), letters_reward,
                    GRPOConfig.flat(prompts_per_step=1, samples_per_prompt=2,
                                    max_new_tokens=3)), checkpoint_dir=path)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert path.read_bytes() == b"not a folder"


def test_grpo_accuracy_is_evaluates_definition_whatever_the_reward(tokenizer):
    """GRPO's ``accuracy`` is ``workbench.evaluate.accuracy`` of the step's responses: the
    exact-match reward's mean, as EvalReport reports it, not the mean of the reward the run
    trains on."""
    import pandas as pd
    from workbench.evaluate import EvalReport, accuracy
    from workbench.tasks import exact_match_reward
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    problems = [Problem(prompt=f"q{i}?", answer=str(i % 3), uid=i) for i in range(6)]
    g = GRPO(model, tokenizer, problems, letters_reward,
             GRPOConfig.flat(prompts_per_step=6, samples_per_prompt=2, max_new_tokens=4))
    rl = g.rollout()
    texts = [r.text for r in rl.result.requests]
    asked = [rl.problems[r.prompt_id] for r in rl.result.requests]
    # three responses right (the final answer after '#', as the task states it), nine wrong
    for k, request in enumerate(rl.result.requests):
        request.text = texts[k] = f"x y #{asked[k].answer if k in (0, 3, 4) else 9}"
    row = g.update(rl)
    assert row["accuracy"] == accuracy(asked, texts) == 3 / 12
    table = EvalReport(pd.DataFrame(
        {"reward": [exact_match_reward(p.prompt, t, p.answer) for p, t in zip(asked, texts)],
         "response_tokens": [4] * 12, "finished_eos": [True] * 12}))
    assert table.summary()["accuracy"] == row["accuracy"]
    assert row["reward"] != row["accuracy"]  # the run trains on another reward
    with pytest.raises(ValueError, match="2 completions for 1 problems"):
        accuracy(asked[:1], texts[:2])


def test_flat_parameters_go_to_the_config_that_declares_them():
    cfg = GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=4, max_new_tokens=9,
                          temperature=0.7, lr=1e-3, seed=7, kl_coef=0.05)
    assert (cfg.prompts_per_step, cfg.kl_coef) == (3, 0.05)
    assert (cfg.rollout.samples_per_prompt, cfg.rollout.max_new_tokens) == (4, 9)
    assert (cfg.rollout.temperature, cfg.rollout.seed) == (0.7, 7)
    assert (cfg.train.lr, cfg.train.seed, cfg.train.horizon) == (1e-3, 7, None)
    assert cfg.train.betas == (0.9, 0.99) and not cfg.train.train_mode  # GRPO's defaults
    assert cfg.updated(seed=2).rollout.seed == cfg.updated(seed=2).train.seed == 2
    assert cfg.updated(seed=2).rollout.max_new_tokens == 9  # the rest kept
    with pytest.raises(ValueError, match=r"GRPOConfig has no parameter 'lr_max'; accepted: "
                                         r"\[.*'lr'.*\]"):
        GRPOConfig.flat(lr_max=1.0)
    with pytest.raises(ValueError, match=r"GRPOConfig\.train: TrainConfig\.lr must be"):
        GRPOConfig.flat(lr=-1.0)
    with pytest.raises(ValueError, match=r"GRPOConfig\.rollout\.temperature \(GRPO samples\) "
                                         r"must be a finite number > 0, got 0\.0"):
        GRPOConfig.flat(temperature=0.0)
    with pytest.raises(ValueError, match=r"train\.checkpoint_dir must be None"):
        GRPOConfig.flat(checkpoint_dir="ck")


@pytest.mark.parametrize("epochs, minibatches, kl_coef", [(1, 1, 0.0), (2, 2, 0.1)])
def test_kl_start_is_the_k3_drift_of_the_policy_before_the_update(tokenizer, epochs,
                                                                   minibatches, kl_coef):
    """``kl_start`` measures KL(policy before the step || start) on the sampled tokens of the
    sequences with a reference part, on- and off-policy alike; the update's inputs are one
    frozen value, computed before the first optimizer step."""
    import dataclasses
    model = tiny_model("llama", tokenizer)
    g = GRPO(model, tokenizer, letter_problems(), lambda p, c, a: float(sum(map(ord, c)) % 3),
             GRPOConfig.flat(prompts_per_step=3, samples_per_prompt=2, max_new_tokens=6,
                             lr=5e-2, epochs=epochs, minibatches=minibatches,
                             kl_coef=kl_coef, kl_sample=4))
    g.step()  # the policy moves away from the reference
    rl = g.rollout()
    data = g.update_data(rl)
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.advantages = None
    old = data.logprobs(g.model, len(data), 1.0, 8192)
    sampled = [i for i, ref in enumerate(data.ref_logp) if ref is not None]
    assert len(sampled) == (len(data) if kl_coef else 4)
    expect = torch.cat([k3(data.ref_logp[i] - old[i]) for i in sampled]).mean()
    row = g.update(rl)
    # the log-probabilities are float32 (sequence_logprobs): sums in another order round apart
    assert row["kl_start"] == pytest.approx(float(expect), rel=1e-6) and row["kl_start"] > 0
