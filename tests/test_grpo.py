"""GRPO: advantages and loss against hand-computed values, a real learning signal on a tiny
model, exact resume, and clear errors."""
import math

import pytest
import torch

from workbench.rl import GRPO, GRPOConfig, aggregate, group_advantages, grpo_loss, k3
from workbench.tasks import Problem

from .conftest import tiny_model


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


def _letters_reward(prompt, completion, answer):
    return completion.count("a") / max(1, len(completion))


def _problems(n=8):
    return [Problem(prompt=f"q{i}?", answer="a", uid=i) for i in range(n)]


def test_grpo_raises_the_reward_of_a_tiny_policy(tokenizer):
    torch.manual_seed(0)
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    cfg = GRPOConfig(prompts_per_step=4, samples_per_prompt=8, max_new_tokens=8, lr=3e-2,
                     temperature=1.0, seed=1)
    g = GRPO(model, tokenizer, _problems(), _letters_reward, cfg)
    hist = g.run(12, progress=False)
    assert list(hist["step"]) == list(range(12))
    assert {"reward", "accuracy", "response_len", "kl_start", "rollout_s",
            "update_s", "step_s"} <= set(hist.columns)
    assert hist["reward"].iloc[-3:].mean() > hist["reward"].iloc[:3].mean() + 0.2
    assert hist["kl_start"].iloc[-1] > hist["kl_start"].iloc[0]


@pytest.mark.parametrize("how", ["token-mean", "sequence-mean"])
def test_resume_is_exact(tokenizer, tmp_path, how):
    cfg = GRPOConfig(prompts_per_step=2, samples_per_prompt=3, max_new_tokens=6, lr=1e-2,
                     epochs=2, minibatches=2, kl_coef=0.1, loss_aggregation=how)

    def fresh(ckpt=None):
        return GRPO(tiny_model("qwen2", tokenizer), tokenizer, _problems(), _letters_reward,
                    cfg, checkpoint_dir=ckpt)

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
        GRPOConfig(samples_per_prompt=1)
    with pytest.raises(ValueError, match="loss_aggregation"):
        GRPOConfig(loss_aggregation="mean")
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    g = GRPO(model, tokenizer, _problems(), lambda p, c, a: "yes",
             GRPOConfig(prompts_per_step=1, samples_per_prompt=2, max_new_tokens=3))
    with pytest.raises(TypeError, match=r"'yes'.*prompt 'q\d\?'"):
        g.step()
    with pytest.raises(ValueError, match="Problem"):
        GRPO(model, tokenizer, ["q?"], _letters_reward)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "qwen2_sw", "llama_odd"])
def test_ragged_batch_logprobs_equal_each_sequence_alone(tokenizer, arch):
    """Right padding without a mask is exact: every response token's log-probability in the
    padded batch equals the one of its sequence run alone (sliding windows included)."""
    from workbench.rl.grpo import SequenceBatch, sequence_logprobs
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
    g = GRPO(model, tokenizer, _problems(), lambda p, c, a: float(p == "q0?"),
             GRPOConfig(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=3))
    row = g.step()
    assert row["groups_with_signal"] == 0.0   # every group's rewards are equal
    g2 = GRPO(model, tokenizer, _problems(), lambda p, c, a: float(p in ("q0?", "q1?")),
              GRPOConfig(prompts_per_step=4, samples_per_prompt=2, max_new_tokens=3))
    rl = g2.rollout()
    rl.rewards[1] = 1.0 - rl.rewards[0]       # make exactly the first group disagree
    rl.rewards[3] = rl.rewards[2]
    assert g2.update(rl)["groups_with_signal"] == 0.25
