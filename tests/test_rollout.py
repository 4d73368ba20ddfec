import math

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.rollout import RolloutConfig, RolloutEngine, Timeline
from workbench.rollout.sampling import SamplingParams, adjusted_logprobs, make_uid, split_uid

from .helpers.models import PROMPTS, hf_greedy, tiny_model


def test_greedy_matches_hf_generate(tiny_gqa, tokenizer):
    engine = RolloutEngine(tiny_gqa, tokenizer)
    res = engine.rollout(PROMPTS, RolloutConfig(max_new_tokens=48), progress=False)
    assert res.tokens == hf_greedy(tiny_gqa, tokenizer, PROMPTS, 48)
    finishes = {r.finish for r in res.requests}
    assert finishes == {"eos", "length"}  # the test covers both ways of stopping
    # finished rows left the batch: batch size only shrinks, down from the full batch
    sizes = res.timeline.steps.query("kind == 'decode'")["batch_size"].tolist()
    assert sizes[0] == sum(len(t) > 1 for t in res.tokens)  # all but those done at prefill
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < 8


def test_batched_waves_and_workers_do_not_change_greedy_output(tokenizer):
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    ref = engine.rollout(PROMPTS, max_new_tokens=32, progress=False).tokens
    res = engine.rollout(PROMPTS, max_new_tokens=32, workers=3, max_batch_size=2,
                         progress=False)
    assert res.tokens == ref
    assert sorted(res.timeline.requests["worker"].unique()) == [0, 1, 2]


def test_ignore_eos_decodes_every_row_to_the_cap_and_agrees_before_eos(tokenizer):
    model = tiny_model("llama", tokenizer)
    engine = RolloutEngine(model, tokenizer)
    ref = engine.rollout(PROMPTS, max_new_tokens=24, progress=False)
    assert any(r.finish == "eos" for r in ref.requests)  # the test needs rows that stop early
    full = engine.rollout(PROMPTS, max_new_tokens=24, ignore_eos=True, progress=False)
    assert all(len(t) == 24 and r.finish == "length" for t, r in zip(full.tokens, full.requests))
    assert [t[:len(r)] for t, r in zip(full.tokens, ref.tokens)] == ref.tokens


def test_coupled_sampling_is_independent_of_batch_mates(tokenizer):
    model = tiny_model("qwen2", tokenizer, seed=1)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=40, temperature=1.0, top_p=0.95, seed=7)
    target = "a12 b33 c4?"
    others = ["x", "a much much longer prompt than the others, with many tokens?", "q1?",
              "hello", "a1 b2 c3 d4 e5 f6 g7 h8 i9?", "zz"]
    batch = others[:3] + [target] + others[3:]  # the target is request 3 of a batch of 7
    alone = engine.rollout([target], cfg, progress=False).requests[0]
    together = engine.rollout(batch, cfg, progress=False)
    # the target keeps its uid (prompt id 0) by giving it prompt_ids explicitly
    ids = engine.encode(batch)
    reqs = engine.make_requests(ids, cfg)
    assert [r.prompt_id for r in reqs] == list(range(7))
    # uid depends on prompt id: compare against the request with the same uid
    alone_same_uid = engine.rollout([others[0]] * 3 + [target], cfg, progress=False).requests[3]
    assert together.requests[3].tokens == alone_same_uid.tokens
    assert together.requests[3].logprobs == pytest.approx(alone_same_uid.logprobs, abs=1e-12)
    # and the draws really are random: different uids give different samples
    assert alone.tokens != alone_same_uid.tokens or alone.uid == alone_same_uid.uid


def test_logprobs_equal_a_separate_forward_of_the_adjusted_distribution(tokenizer):
    model = tiny_model("llama", tokenizer, seed=2)
    engine = RolloutEngine(model, tokenizer)
    params = dict(temperature=0.7, top_p=0.9, seed=3)
    res = engine.rollout(PROMPTS[:3], max_new_tokens=24, progress=False, **params)
    for r in res.requests:
        seq = torch.tensor([r.prompt_ids + r.tokens])
        with torch.no_grad():
            logits = model(seq).logits[0, len(r.prompt_ids) - 1:-1]
        logp = adjusted_logprobs(logits, SamplingParams(**params))
        expected = logp.gather(-1, torch.tensor(r.tokens)[:, None]).squeeze(-1)
        assert torch.isfinite(expected).all()  # every sampled token lies inside the nucleus
        np.testing.assert_allclose(r.logprobs, expected.numpy(), atol=1e-10)


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    logp = adjusted_logprobs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    np.testing.assert_allclose(logp.exp()[0].numpy(), [0.625, 0.375, 0, 0], atol=1e-12)
    logp = adjusted_logprobs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert (logp.exp()[0] > 0).tolist() == [True, True, True, False]


def test_uid_round_trip():
    uid = make_uid(123, 7, 5)
    assert split_uid(uid) == (123, 7, 5)
    with pytest.raises(ValueError, match="sample_idx"):
        make_uid(0, 70000)


def test_timeline_invariants_and_parquet_round_trip(tokenizer, tmp_path):
    model = tiny_model("llama", tokenizer, seed=3)
    engine = RolloutEngine(model, tokenizer)
    res = engine.rollout(PROMPTS * 2, max_new_tokens=40, workers=3, temperature=1.0,
                         progress=False)
    tl = res.timeline
    steps = tl.steps.sort_values(["worker", "start_s"])
    for _, s in steps.groupby("worker"):
        assert (s["end_s"] >= s["start_s"]).all()
        assert (s["start_s"].to_numpy()[1:] >= s["end_s"].to_numpy()[:-1] - 1e-12).all()
    assert tl.makespan_s == steps["end_s"].max()
    busy = (steps["end_s"] - steps["start_s"]).groupby(steps["worker"]).sum()
    np.testing.assert_allclose(tl.idle_s().to_numpy(), tl.makespan_s - busy.to_numpy())
    assert tl.idle_fraction() == pytest.approx(tl.idle_s().sum() / (3 * tl.makespan_s))
    assert 0 <= tl.tail_share() < 1 and len(tl.requests) == 16
    assert (tl.requests["end_s"] <= tl.makespan_s).all()
    assert tl.requests["response_tokens"].tolist() == [len(t) for t in res.tokens]
    # response tokens on the steps table add up to the requests table
    assert steps["tokens"].sum() == tl.requests["response_tokens"].sum()
    tl.save(tmp_path / "tl")
    back = Timeline.load(tmp_path / "tl")
    pd.testing.assert_frame_equal(back.steps, tl.steps)
    pd.testing.assert_frame_equal(back.requests, tl.requests)
    assert (back.num_workers, back.clock) == (3, "sim")
    assert back.summary() == tl.summary()


def test_harvest_keeps_one_hidden_state_per_fed_token(tokenizer):
    model = tiny_model("llama", tokenizer)
    res = RolloutEngine(model, tokenizer).rollout(PROMPTS[:4], max_new_tokens=20, harvest=True,
                                                  progress=False)
    for r in res.requests:
        assert r.hidden.shape == (len(r.prompt_ids) + len(r.tokens) - 1, 64)
        seq = torch.tensor([r.prompt_ids + r.tokens[:-1]])
        with torch.no_grad():
            out = model(seq, output_hidden_states=True)
            # the harvest is the pre-norm state: the final norm maps it onto HF's last hidden state
            normed = model.get_decoder().norm(r.hidden)
        np.testing.assert_allclose(normed.numpy(), out.hidden_states[-1][0].numpy(), atol=1e-10)


@pytest.mark.parametrize("field,value,match", [
    ("workers", 0, "workers must be an integer >= 1"),
    ("max_new_tokens", 0, "max_new_tokens must be an integer >= 1"),
    ("temperature", -0.5, r"temperature \(0: greedy\) must be a finite number >= 0"),
    # refused since the shared checks: a bool is no temperature, inf and NaN sample nothing
    ("temperature", True, r"temperature \(0: greedy\) must be a finite number >= 0, got True"),
    ("temperature", math.inf, r"temperature .* must be a finite number >= 0, got inf"),
    ("temperature", math.nan, r"temperature .* must be a finite number >= 0, got nan"),
    ("top_p", 0.0, r"top_p must be a number in \(0, 1\]"),
    ("top_p", 1.5, r"top_p must be a number in \(0, 1\]"),
    ("top_p", True, r"top_p must be a number in \(0, 1\], got True"),
    ("ignore_eos", 1, "ignore_eos must be True or False"),
])
def test_bad_config_is_rejected(field, value, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(**{field: value})


def test_prompt_longer_than_context_is_rejected_before_running(tokenizer):
    model = tiny_model("llama", tokenizer, context=16)
    engine = RolloutEngine(model, tokenizer)
    with pytest.raises(ValueError, match=r"prompt 1 has \d+ tokens, but the model's context is 16"):
        engine.rollout(["short", "a prompt that is far too long"], progress=False)


def test_generation_stops_at_the_context(tokenizer):
    model = tiny_model("llama", tokenizer, context=24)
    with torch.no_grad():
        model.get_output_embeddings().weight[tokenizer.eos_token_id] = 0  # no early EOS
    res = RolloutEngine(model, tokenizer).rollout(["a1 b2?"], max_new_tokens=100,
                                                  progress=False)
    r = res.requests[0]
    assert r.finish == "length" and len(r.prompt_ids) + len(r.tokens) == 24
