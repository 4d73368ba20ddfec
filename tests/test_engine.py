"""The engine's seams: continuous batching, step schedules, and the input checks (float64
wherever tokens must be identical). Workers and backends: test_worker_backend.py."""
import numpy as np
import pytest
import torch

from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule, StepPlan
from workbench.rollout.batch import DecodeBatch
from workbench.rollout.decoder import BatchDecoder
from workbench.rollout.forward import policy_forward
from workbench.rollout.request import RequestOutput
from workbench.rollout.schedule import Schedule
from workbench.rollout.worker import StepRecorder
from workbench.speculative import EagleDrafter, EagleHead, LMDrafter, NGramDrafter
from workbench.speculative.train import harvest_pairs

from .helpers.models import (MANY, PROMPTS, hf_greedy, tiny_model,
                             visible_cache_equals_fresh_recompute)
from .drafters import ScriptedDrafter


# ---- continuous batching ----------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_continuous_batching_gives_the_tokens_of_waves_and_of_running_alone(tokenizer,
                                                                            temperature):
    model = tiny_model("llama", tokenizer, seed=0)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=40, temperature=temperature, seed=5, max_batch_size=4,
                        samples_per_prompt=2)
    cont = engine.rollout(MANY, cfg, progress=False)
    waves = engine.rollout(MANY, cfg, batching="waves", progress=False)
    alone = engine.rollout(MANY, cfg, max_batch_size=1, progress=False)
    assert cont.tokens == waves.tokens == alone.tokens
    np.testing.assert_allclose(np.concatenate(cont.logprobs), np.concatenate(alone.logprobs),
                               atol=1e-10)
    if temperature == 0:
        assert cont.tokens == hf_greedy(model, tokenizer, [m for m in MANY for _ in (0, 1)], 40)
    # the active batch stays full until the queue empties, then shrinks into the long tail
    steps = cont.timeline.steps
    prefills = steps.index[steps["kind"] == "prefill"]
    assert len(prefills) > 3  # requests joined mid-run
    before_last_join = steps.loc[:prefills[-1]]
    assert (before_last_join[before_last_join["kind"] == "decode"]["batch_size"] == 4).all()
    active = cont.timeline.active_batch()  # joining prefills count the rows they join too
    joins = steps.loc[prefills[1:], ["worker", "start_s", "batch_size"]].merge(
        active, on=["worker", "start_s"], suffixes=("_own", "_active"))
    assert len(joins) == len(prefills) - 1
    assert (joins["batch_size_active"] >= joins["batch_size_own"]).all()
    assert (joins["batch_size_active"] <= 4).all()
    assert (joins["batch_size_active"] > joins["batch_size_own"]).any()
    wave_sizes = waves.timeline.steps.query("kind == 'decode'")["batch_size"]
    assert (wave_sizes < 4).sum() > (steps.query("kind == 'decode'")["batch_size"] < 4).sum()
    assert len(cont.timeline.steps) < len(waves.timeline.steps)  # fewer, fuller steps


def test_a_request_joining_mid_batch_has_a_cache_equal_to_a_fresh_recompute(tokenizer):
    model = tiny_model("llama", tokenizer, seed=3)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=60)
    plain = engine.rollout(PROMPTS, cfg, progress=False)
    reqs = [RequestOutput.of(q, 0) for q in engine.make_requests(engine.encode(PROMPTS), cfg)]
    drafter = ScriptedDrafter({r.uid: r.tokens for r in plain.requests},
                              {r.uid: i % 3 for i, r in enumerate(plain.requests)})
    drafter.check_compatible(model, tokenizer)
    dec = BatchDecoder(policy_forward(model), cfg, StepRecorder(0, "sim"), engine.eos_id,
                       engine.pad_id, drafter=drafter)
    dec.admit(reqs[:3])
    for k in (4, 2, 3):
        dec.spec_step(StepPlan("speculative", k))  # rejections leave holes
    dec.admit(reqs[3:6])  # short fresh prompts join rows with long, holed caches
    joined = [i for i in dec.batch.request_ids if i >= 3]
    assert len(joined) >= 2 and dec.size > len(joined) and (dec.batch.mask == 0).any()
    visible_cache_equals_fresh_recompute(model, dec)
    dec.plain_step()
    dec.spec_step(StepPlan("speculative", 4))
    visible_cache_equals_fresh_recompute(model, dec)


def test_plain_steps_skip_the_compaction_check_yet_leave_nothing_to_compact(tokenizer,
                                                                            monkeypatch):
    """A plain step that keeps its rows adds no hole, nor do rows joining (the longest of
    them sees all its columns), so a plain step's end skips ``compact`` (a read of the mask
    back every step). Checked against the batch's own rule after every plain step, with
    holes left by rejected drafts and rows joining: compacting then changes nothing."""
    model = tiny_model("llama", tokenizer, seed=3)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=60, ignore_eos=True)
    plain = engine.rollout(PROMPTS, cfg, progress=False)
    reqs = [RequestOutput.of(q, 0) for q in engine.make_requests(engine.encode(PROMPTS), cfg)]
    drafter = ScriptedDrafter({r.uid: r.tokens for r in plain.requests},
                              {r.uid: 0 for r in plain.requests})
    drafter.check_compatible(model, tokenizer)
    dec = BatchDecoder(policy_forward(model), cfg, StepRecorder(0, "sim"), engine.eos_id,
                       engine.pad_id, drafter=drafter)
    done = []  # per compact() call: whether it compacted
    compact = DecodeBatch.compact

    def counted(batch, *args, **kwargs):
        mask = batch.mask
        compact(batch, *args, **kwargs)
        done.append(batch.mask is not mask)
    monkeypatch.setattr(DecodeBatch, "compact", counted)
    dec.admit(reqs[:2])
    for step in range(30):
        if step == 12:
            dec.admit(reqs[2:5])  # short prompts join rows with many holes
        if step % 3 == 0:  # rows take turns rejecting all 6 drafts: each row gets holes
            for i, r in enumerate(reqs):
                drafter.wrong_at[r.uid] = 0 if (i + step // 3) % 2 else 6
            dec.spec_step(StepPlan("speculative", 6))
            continue
        dec.plain_step()
        before = len(done)
        dec.batch.compact()
        assert done[before:] == [False], f"step {step}: a plain step left holes to compact"
    assert any(done)  # the holes did reach the rule's bound (at a verify step's end)
    visible_cache_equals_fresh_recompute(model, dec)


def test_continuous_batching_refills_once_enough_slots_are_free(tokenizer):
    model = tiny_model("llama", tokenizer, seed=0)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=40, max_batch_size=8, refill_slots=3,
                        samples_per_prompt=3)
    res = engine.rollout(MANY, cfg, progress=False)
    assert res.tokens == engine.rollout(MANY, cfg, batching="waves", progress=False).tokens
    steps = res.timeline.steps
    last_join = steps.index[steps["kind"] == "prefill"][-1]
    sizes = steps.loc[:last_join].query("kind == 'decode'")["batch_size"]
    assert sizes.min() >= 8 - 3 + 1 and sizes.max() == 8 and (sizes < 8).any()
    assert RolloutConfig(max_batch_size=32).refill_for(32) == 4
    assert RolloutConfig(max_batch_size=8).refill_for(8) == 1
    with pytest.raises(ValueError, match="refill_slots must be None or an integer >= 1"):
        RolloutConfig(refill_slots=0)


def test_prefill_groups_bound_padding_and_cover_every_request():
    from workbench.rollout.decoder import prefill_groups
    lengths = [79, 7, 40, 38, 12, 75, 9, 41, 30, 60]
    groups = prefill_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        block = max(lengths[i] for i in g) * len(g)
        assert sum(lengths[i] for i in g) >= 0.75 * block
    assert len(groups) < len(lengths) and prefill_groups([5, 5, 5]) == [[0, 1, 2]]


# ---- schedules --------------------------------------------------------------------------
class SwitchingSchedule(Schedule):
    """Plain while the batch is large, then speculative with k cycling 1..4; keeps reports."""

    def __init__(self, threshold=3):
        self.threshold, self.n, self.reports, self.asked = threshold, 0, [], []

    def plan(self, batch_size, worker):
        self.asked.append(batch_size)
        if batch_size > self.threshold:
            return StepPlan()
        self.n += 1
        return StepPlan("speculative", 1 + self.n % 4)

    def observe(self, report):
        self.reports.append(report)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_switching_schedule_is_lossless_and_hears_one_consistent_report_per_step(
        tokenizer, temperature):
    model = tiny_model("llama", tokenizer, seed=4)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=40, temperature=temperature, seed=9, max_batch_size=5)
    plain = engine.rollout(MANY, cfg, progress=False)
    for drafter in (NGramDrafter(), EagleDrafter(EagleHead(model))):
        schedule = SwitchingSchedule()
        res = engine.rollout(MANY, cfg, drafter=drafter, schedule=schedule, progress=False)
        assert res.tokens == plain.tokens
        steps = res.timeline.steps
        assert len(schedule.reports) == steps["kind"].isin(["decode", "verify"]).sum()
        assert schedule.asked == [r.rows for r in schedule.reports]
        kinds = {r.plan.kind for r in schedule.reports}
        assert kinds == {"plain", "speculative"} and len({r.plan.k for r in schedule.reports}) > 2
        for r in schedule.reports:
            if r.plan.speculative:
                assert r.drafted == r.plan.k * r.rows and 0 <= r.accepted <= r.drafted
                assert r.tokens <= r.accepted + r.rows and r.draft_s > 0
            else:
                assert r.drafted == r.accepted == 0 and 1 <= r.tokens <= r.rows
            assert 0 < r.forward_s <= r.elapsed_s
        response_tokens = sum(len(t) for t in res.tokens)
        assert sum(r.tokens for r in schedule.reports) == response_tokens - len(res.tokens)
        assert sum(r.accepted for r in schedule.reports) == res.timeline.requests["accepted"].sum()


def test_static_schedule_reproduces_drafter_and_spec_k(tokenizer):
    model = tiny_model("qwen2", tokenizer, seed=1)
    engine = RolloutEngine(model, tokenizer)
    a = engine.rollout(PROMPTS, max_new_tokens=30, drafter=NGramDrafter(), spec_k=3,
                       progress=False)
    b = engine.rollout(PROMPTS, max_new_tokens=30, drafter=NGramDrafter(),
                       schedule=StaticSchedule(3), progress=False)
    assert a.tokens == b.tokens
    assert a.timeline.requests["drafted"].tolist() == b.timeline.requests["drafted"].tolist()
    with pytest.raises(ValueError, match="has no drafter"):
        engine.rollout(PROMPTS, schedule=StaticSchedule(3), progress=False)
    with pytest.raises(ValueError, match=r"StepPlan\.k .* must be an integer >= 1, got 0"):
        StepPlan("speculative", 0)


# ---- speculative decoding with the new seams --------------------------------------------
@pytest.mark.parametrize("arch", ["mistral", "qwen2_sw"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sd_is_lossless_on_sliding_window_models_at_batch_above_one(tokenizer, arch,
                                                                    temperature):
    model = tiny_model(arch, tokenizer, seed=0)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=48, temperature=temperature, seed=3)
    plain = engine.rollout(PROMPTS, cfg, progress=False)
    if temperature == 0:
        assert plain.tokens == hf_greedy(model, tokenizer, PROMPTS, 48)
    assert max(len(t) for t in plain.tokens) > 3 * model.config.sliding_window
    scripted = ScriptedDrafter({r.uid: r.tokens for r in plain.requests},
                               {r.uid: i % 4 for i, r in enumerate(plain.requests)})
    for drafter in (scripted, NGramDrafter()):
        res = engine.rollout(PROMPTS, cfg, drafter=drafter, spec_k=3, progress=False)
        assert res.tokens == plain.tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sd_with_continuous_batching_is_lossless_for_every_drafter(tokenizer, temperature):
    model = tiny_model("llama", tokenizer, seed=5)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=32, temperature=temperature, seed=2, max_batch_size=3)
    plain = engine.rollout(MANY, cfg, progress=False)
    torch.manual_seed(0)
    drafters = {"eagle": EagleDrafter(EagleHead(model)), "ngram": NGramDrafter(),
                "small_lm": LMDrafter(tiny_model("llama", tokenizer, seed=9, layers=1),
                                      tokenizer)}
    for name, drafter in drafters.items():
        res = engine.rollout(MANY, cfg, drafter=drafter, spec_k=3, progress=False)
        assert res.tokens == plain.tokens, name


def test_harvest_during_sd_keeps_states_only_for_committed_tokens(tokenizer):
    """Verify steps cut at EOS or the length cap emit fewer tokens than they fed; the harvest
    must hold exactly one state per committed token, the same states plain decoding keeps."""
    model = tiny_model("llama", tokenizer, seed=6)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=23)
    plain = engine.rollout(PROMPTS, cfg, progress=False, harvest=True)
    drafter = ScriptedDrafter({r.uid: r.tokens for r in plain.requests},
                              {r.uid: 99 for r in plain.requests})  # every draft right
    sd = engine.rollout(PROMPTS, cfg, drafter=drafter, spec_k=4, progress=False, harvest=True)
    assert sd.tokens == plain.tokens and {r.finish for r in sd.requests} == {"eos", "length"}
    cut = [r for r in sd.requests if sum(r.emitted_per_step) < 5 * len(r.emitted_per_step)]
    assert cut  # some verify steps were cut short
    for (seq, h), (seq_p, h_p) in zip(harvest_pairs(sd), harvest_pairs(plain)):
        assert torch.equal(seq, seq_p)
        torch.testing.assert_close(h, h_p, atol=1e-10, rtol=0)


# ---- input checks -----------------------------------------------------------------------
def test_token_ids_outside_the_vocabulary_are_refused_before_anything_runs(tokenizer):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    for bad in ([5, 100], [-1, 5], [5, 2.0]):
        with pytest.raises(ValueError, match=r"prompt 1 has token id.*accepted: integers in "
                                             r"\[0, 100\)"):
            engine.rollout([[5, 6], bad], progress=False)


@pytest.mark.parametrize("seed", [1.5, -1, 2**64, True, "3"])
def test_bad_seeds_are_refused(seed):
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, "
                                         r"18446744073709551615\], got"):
        RolloutConfig(seed=seed)


def test_seeds_do_not_wrap_around(tokenizer):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    big = engine.rollout(PROMPTS[:2], max_new_tokens=20, temperature=1.0, seed=2**64 - 1,
                         progress=False)
    assert big.tokens != engine.rollout(PROMPTS[:2], max_new_tokens=20, temperature=1.0,
                                        seed=0, progress=False).tokens


def test_bad_config_values_name_the_value():
    with pytest.raises(ValueError, match="batching must be one of .*'waves'.*got 'wave'"):
        RolloutConfig(batching="wave")
    with pytest.raises(ValueError, match="max_batch_size must be None or an integer"):
        RolloutConfig(max_batch_size=True)
