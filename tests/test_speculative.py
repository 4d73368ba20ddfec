"""Speculative decoding is lossless, per row, for every drafter (float64 throughout)."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import workbench.rollout.verify as verify
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative import LMDrafter, NGramDrafter

from .drafters import ScriptedDrafter
from workbench.speculative import EagleDrafter, EagleHead
from workbench.speculative.train import (EagleTrainConfig, harvest_pairs, state_regression,
                                         train_eagle)
from workbench.zoo.tokenizer import build_char_tokenizer

from .helpers.models import PROMPTS, hf_greedy, tiny_model
from .helpers.speculative import (chi2_quantile, chi_square, joint_3, peaky_llama, recording,
                                  reference_eagle_drafts, sample_joint)


def drafters_for(model, tokenizer):
    torch.manual_seed(1)
    return {"eagle": EagleDrafter(EagleHead(model)), "ngram": NGramDrafter(),
            "small_lm": LMDrafter(tiny_model("llama", tokenizer, seed=9, layers=1), tokenizer)}


def test_greedy_sd_is_token_identical_for_every_drafter(tiny_gqa, tokenizer):
    prompts = PROMPTS[:5]
    engine = RolloutEngine(tiny_gqa, tokenizer)
    plain = engine.rollout(prompts, max_new_tokens=32, progress=False)
    assert plain.tokens == hf_greedy(tiny_gqa, tokenizer, prompts, 32)
    for k in (1, 3):
        scripted = ScriptedDrafter({r.uid: r.tokens for r in plain.requests},
                                   {r.uid: i % (k + 1) for i, r in enumerate(plain.requests)})
        for name, drafter in {**drafters_for(tiny_gqa, tokenizer), "scripted": scripted}.items():
            res = engine.rollout(prompts, max_new_tokens=32, progress=False, drafter=drafter,
                                 spec_k=k)
            assert res.tokens == plain.tokens, (name, k)
            np.testing.assert_allclose(np.concatenate(res.logprobs),
                                       np.concatenate(plain.logprobs), atol=1e-9)
            assert {"prefill", "draft", "verify"} <= set(res.timeline.steps["kind"]), name


def test_scripted_rows_accept_known_different_counts(tokenizer):
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    k = 4
    plain = engine.rollout(PROMPTS, max_new_tokens=48, progress=False)
    wrong_at = {r.uid: i % (k + 1) for i, r in enumerate(plain.requests)}  # 0..4 per row
    drafter = ScriptedDrafter({r.uid: r.tokens for r in plain.requests}, wrong_at)
    res = engine.rollout(PROMPTS, max_new_tokens=48, progress=False, drafter=drafter, spec_k=k)
    assert res.tokens == plain.tokens
    seen_counts = set()
    for r in res.requests:
        expected = wrong_at[r.uid]  # wrong_at == k: every draft accepted
        # every verify step but the last accepts exactly the scripted count; the last may
        # run past the end of the known continuation
        assert r.accepted_per_step[:-1] == [expected] * (len(r.accepted_per_step) - 1)
        assert r.emitted_per_step[:-1] == [expected + 1] * (len(r.emitted_per_step) - 1)
        assert sum(r.emitted_per_step) == len(r.tokens) - 1  # the first token came from prefill
        seen_counts.add(expected)
    assert seen_counts == set(range(k + 1))
    t = res.timeline.requests.set_index("uid")
    for r in res.requests:
        assert t.loc[r.uid, "accepted"] == sum(r.accepted_per_step)
        assert t.loc[r.uid, "verify_steps"] == len(r.emitted_per_step)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_coupled_sd_reproduces_the_plain_coupled_rollout(arch, tokenizer):
    model = tiny_model(arch, tokenizer, seed=4)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=32, temperature=1.0, top_p=0.9, seed=11,
                        samples_per_prompt=2)
    plain = engine.rollout(PROMPTS[:4], cfg, progress=False)
    for name, drafter in drafters_for(model, tokenizer).items():
        res = engine.rollout(PROMPTS[:4], cfg, progress=False, drafter=drafter, spec_k=3)
        assert res.tokens == plain.tokens, name


def test_speculative_sampling_reproduces_the_policy_joint_distribution(monkeypatch):
    policy, poor_drafter = peaky_llama(0), peaky_llama(1)
    prompt = [1, 2, 3]
    probs = joint_3(policy, prompt)
    counts, acceptance = sample_joint(policy, LMDrafter(poor_drafter), prompt, 6000, seed=5)
    assert acceptance < 0.5  # the drafter is poor, so the rejection path is exercised
    stat, df = chi_square(counts, probs)
    assert df >= 8 and stat < chi2_quantile(df), (stat, df)

    # the same test catches a wrong rule: resampling from p instead of max(0, p - q)
    real = verify.speculative_accept

    def resample_from_p(draft, logp, logq, accept_u, resample_u):
        accepted, _ = real(draft, logp, logq, accept_u, resample_u)
        rows = torch.arange(draft.shape[0])
        cdf = logp[rows, accepted].exp().cumsum(-1)
        u = torch.as_tensor(np.asarray(resample_u), dtype=cdf.dtype)[rows, accepted]
        last = torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:]).contiguous(), right=True)
        return accepted, last.squeeze(-1).clamp(max=logp.shape[-1] - 1)

    monkeypatch.setattr(verify, "speculative_accept", resample_from_p)
    counts, _ = sample_joint(policy, LMDrafter(poor_drafter), prompt, 6000, seed=5)
    stat, df = chi_square(counts, probs)
    assert stat > chi2_quantile(df), (stat, df)


def test_drafter_with_another_vocabulary_or_tokenizer_is_rejected(tokenizer):
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1)).eval()
    with pytest.raises(ValueError, match="vocabulary size 50 does not match the policy's 100"):
        engine.rollout(["a1?"], drafter=LMDrafter(other), progress=False)
    shuffled = build_char_tokenizer()
    shuffled.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match="tokenizer does not match"):
        engine.rollout(["a1?"], drafter=LMDrafter(tiny_model("llama", tokenizer, seed=3),
                                                  shuffled), progress=False)
    with pytest.raises(ValueError, match="cannot serve as its own drafter"):
        engine.rollout(["a1?"], drafter=LMDrafter(model, tokenizer), progress=False)
    with pytest.raises(ValueError, match="spec_k must be an integer >= 1"):
        engine.rollout(["a1?"], drafter=NGramDrafter(), spec_k=0, progress=False)


def test_eagle_checkpoint_of_another_architecture_is_rejected(tokenizer, tmp_path):
    head = EagleHead(tiny_model("llama", tokenizer))
    head.save_pretrained(tmp_path / "head")
    other = tiny_model("qwen2", tokenizer)
    with pytest.raises(ValueError, match="belongs to another policy architecture.*model_type"):
        EagleHead.from_pretrained(tmp_path / "head", other)
    wider = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=96,
                                         intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="hidden_size: head 64 vs policy 96"):
        EagleDrafter(EagleHead.from_pretrained(tmp_path / "head", tiny_model("llama", tokenizer)),
                     wider)


def test_eagle_training_on_harvest_learns_and_round_trips(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, dtype=torch.float32)
    with torch.no_grad():  # a peaked next-token distribution, so top-1 agreement means something
        model.get_output_embeddings().weight.mul_(10)
    engine = RolloutEngine(model, tokenizer)
    res = engine.rollout(PROMPTS * 4, max_new_tokens=24, temperature=1.0, harvest=True,
                         progress=False)
    pairs = harvest_pairs(res)
    head, hist = train_eagle(model, pairs, EagleTrainConfig.flat(horizon=60, batch_size=8, unroll=1),
                             out_dir=tmp_path / "eagle", progress=False)
    first, last = hist.iloc[:5].mean(), hist.iloc[-10:].mean()
    assert last["smooth_l1"] < 0.5 * first["smooth_l1"]
    assert last["soft_ce"] < first["soft_ce"] - 0.5
    assert last["top1_depth1"] > first["top1_depth1"] + 0.08
    back = EagleHead.from_pretrained(tmp_path / "eagle", model)
    for a, b in zip(head.state_dict().values(), back.state_dict().values()):
        assert torch.equal(a, b)
    greedy = engine.rollout(PROMPTS, max_new_tokens=24, progress=False)
    sd = engine.rollout(PROMPTS, max_new_tokens=24, progress=False,
                        drafter=EagleDrafter(back), spec_k=3)
    assert sd.tokens == greedy.tokens


def test_state_regression_in_rms_units_ignores_the_states_scale():
    torch.manual_seed(0)
    target = torch.randn(3, 5, 16, dtype=torch.float64) * 7
    pred = target + torch.randn_like(target)
    rms = state_regression(pred, target, "rms")
    # rescaling both states together (a policy whose states are 10x larger) changes nothing
    torch.testing.assert_close(state_regression(10 * pred, 10 * target, "rms"), rms)
    # and it is the SmoothL1 of the states divided by the target's RMS, position by position
    scale = target.pow(2).mean(-1, keepdim=True).sqrt()
    expected = torch.nn.functional.smooth_l1_loss(pred / scale, target / scale,
                                                  reduction="none").mean(-1)
    torch.testing.assert_close(rms, expected)
    raw = state_regression(pred, target, "raw")
    assert raw.shape == (3, 5)
    assert not torch.allclose(state_regression(10 * pred, 10 * target, "raw"), raw)
    with pytest.raises(ValueError, match="state_units must be one of .*'l2'"):
        state_regression(pred, target, "l2")
    with pytest.raises(ValueError, match="state_units must be one of .*'l2'"):
        train_eagle(None, [], EagleTrainConfig(state_units="l2"))


@pytest.mark.parametrize("arch,batch", [("llama", 1), ("llama", 3), ("qwen2", 3)])
def test_cached_drafts_equal_a_from_scratch_recompute(tokenizer, arch, batch):
    """Losslessness holds whatever a drafter proposes, so this is what guards its quality:
    the cached, ragged, rolled-back chains draft exactly what the drafter computes afresh
    (the EAGLE head on the whole sequence; the small LM's own greedy continuation)."""
    policy = tiny_model(arch, tokenizer, context=512)
    torch.manual_seed(3)
    head = EagleHead(policy)
    assert head.lean  # drafting takes the lean step, checked here against the HF layer
    with torch.no_grad():  # peaked attention, so positions and masks decide the drafts
        head.layer.self_attn.q_proj.weight.mul_(8)
        head.layer.self_attn.k_proj.weight.mul_(8)
    small = tiny_model("qwen2", tokenizer, seed=5, layers=1)
    eagle, lm = recording(EagleDrafter(head)), recording(LMDrafter(small, tokenizer))
    for drafter in (eagle, lm):
        RolloutEngine(policy, tokenizer).rollout(PROMPTS[:4], max_new_tokens=20, spec_k=3,
                                                 max_batch_size=batch, drafter=drafter,
                                                 progress=False)
        assert len(drafter.rounds) >= 4
    for seq, drafts in eagle.rounds:
        assert drafts == reference_eagle_drafts(policy, head, seq, 3)
    for seq, drafts in lm.rounds:
        out = small.generate(torch.tensor([seq]), attention_mask=torch.ones(1, len(seq)),
                             max_new_tokens=3, do_sample=False, eos_token_id=None,
                             pad_token_id=tokenizer.pad_token_id)
        assert drafts == out[0, len(seq):].tolist()


def test_a_truncated_eagle_head_names_its_file_and_the_remedy(tokenizer, tmp_path):
    from workbench.atomic import DamagedFileError
    model = tiny_model("llama", tokenizer)
    EagleHead(model).save_pretrained(tmp_path / "head")
    weights = tmp_path / "head" / "head.pt"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(DamagedFileError, match=r"the EAGLE head's weights .*head\.pt' is "
                                               r"damaged: it is truncated.*delete the folder"):
        EagleHead.from_pretrained(tmp_path / "head", model)
