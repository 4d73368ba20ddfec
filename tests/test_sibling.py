"""The sibling drafter: lossless with siblings in the batch (greedy, coupled, speculative
sampling), really drafting from siblings and from earlier steps' responses, its incremental
n-gram index, and the adaptive engine's sibling arm beside EAGLE through a DrafterSet."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workbench.rollout import RolloutConfig, RolloutEngine, StepPlan
from workbench.rollout.request import Request, RequestOutput
from workbench.speculative import DrafterSet, EagleDrafter, EagleHead, NGramDrafter, SiblingDrafter
from workbench.speculative.bandit import AdaptiveSchedule, parse_strategy, strategy_name
from workbench.speculative.drafters import SlowedDrafter
from workbench.speculative.sibling import NGramIndex

from .helpers.models import PROMPTS, tiny_model
from .helpers.models import forwards  # noqa: F401 (a fixture: every forward call)
from .helpers.speculative import (chi2_quantile, chi_square, joint_3, peaky_llama, recording,
                                  reference_eagle_drafts, sample_joint)

RAGGED = [PROMPTS[0], PROMPTS[2], PROMPTS[5]]  # 6, 1 and 9 characters


def spec_rollouts(engine, cfg, drafter, rl_step=0, **kw):
    """The plain rollout of ``cfg`` at ``rl_step``, and the same with ``drafter``."""
    plain = engine.rollout(RAGGED, cfg, progress=False, rl_step=rl_step)
    return plain, engine.rollout(RAGGED, cfg, progress=False, drafter=drafter,
                                 rl_step=rl_step, **kw)


# ---- lossless --------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sibling_drafts_are_lossless_with_siblings_in_the_batch(tokenizer, arch, temperature):
    """Ragged prompts, 3 siblings each, a continuous batch of 4 refilled slot by slot (rows
    join while siblings run or after they finished); then a second step that also drafts from
    the first one's responses (memory). Greedy or coupled: the plain rollout's tokens."""
    engine = RolloutEngine(tiny_model(arch, tokenizer, seed=2), tokenizer)
    cfg = RolloutConfig(max_new_tokens=16, temperature=temperature, top_p=0.9, seed=3,
                        samples_per_prompt=3, max_batch_size=4, refill_slots=1,
                        workers=2 if arch == "mistral" else 1)
    drafter = SiblingDrafter()
    plain, res = spec_rollouts(engine, cfg, drafter, spec_k=3)
    assert res.tokens == plain.tokens
    np.testing.assert_allclose(np.concatenate(res.logprobs), np.concatenate(plain.logprobs),
                               atol=1e-9)
    if temperature == 0:  # identical siblings: drafts are accepted
        assert res.timeline.requests["accepted"].sum() > 0
    drafter.remember_result(res)
    plain, res = spec_rollouts(engine, cfg, drafter, rl_step=1, spec_k=3)
    assert res.tokens == plain.tokens


def test_speculative_sampling_from_siblings_keeps_the_policy_joint_distribution():
    """Drafts that depend on the other rows' draws are still proposals independent of the
    row's own uniforms, so the rejection rule samples the policy exactly (the same check as
    for the other drafters, tests/test_speculative.py)."""
    policy, prompt = peaky_llama(0), [1, 2, 3]
    counts, acceptance = sample_joint(policy, SiblingDrafter(), prompt, 6000, seed=7,
                                       max_batch_size=1000)
    assert 0.2 < acceptance < 0.95  # siblings help, and the rejection path is exercised
    stat, df = chi_square(counts, joint_3(policy, prompt))
    assert df >= 8 and stat < chi2_quantile(df), (stat, df)


# ---- it drafts from siblings and memory ------------------------------------------------
def test_a_finished_siblings_response_is_accepted_in_full(tokenizer):
    """Greedy siblings are identical; one row at a time, each after the first drafts from a
    finished sibling, and every verify step but the last (cut at the length cap) accepts
    all k drafts."""
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=2), tokenizer)
    cfg = RolloutConfig(max_new_tokens=24, samples_per_prompt=3, max_batch_size=1)
    k = 4
    res = engine.rollout(RAGGED, cfg, progress=False, drafter=SiblingDrafter(), spec_k=k)
    t = res.timeline.requests
    later, first = t[t["sample_idx"] > 0], t[t["sample_idx"] == 0]
    assert ((later["drafted"] - later["accepted"]) < k).all()
    assert later["accepted"].sum() / later["drafted"].sum() > 0.9
    assert first["accepted"].sum() / first["drafted"].sum() < 0.9  # its own sequence only
    for r in res.requests:
        if r.sample_idx > 0:
            assert r.accepted_per_step[:-1] == [k] * (len(r.accepted_per_step) - 1)


def test_a_second_step_drafts_from_the_first_steps_responses(tokenizer):
    """All rows in one batch, in lockstep: no sibling is ahead. Remembering the first step's
    responses makes a second rollout of the same prompts accept nearly everything."""
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=2), tokenizer)
    cfg, k = RolloutConfig(max_new_tokens=24, samples_per_prompt=2), 4
    fresh, drafter = SiblingDrafter(), SiblingDrafter()
    first = engine.rollout(RAGGED, cfg, progress=False, drafter=drafter, spec_k=k)
    drafter.remember_result(first)
    second = engine.rollout(RAGGED, cfg, progress=False, drafter=drafter, spec_k=k)
    alone = engine.rollout(RAGGED, cfg, progress=False, drafter=fresh, spec_k=k)
    assert second.tokens == first.tokens == alone.tokens
    t, a = second.timeline.requests, alone.timeline.requests
    assert ((t["drafted"] - t["accepted"]) < k).all()
    assert t["accepted"].sum() / t["drafted"].sum() > 0.9 > a["accepted"].sum() / a["drafted"].sum()
    assert drafter.siblings and fresh.memory == {}
    drafter.begin()  # a worker's rollout starts: no siblings, the memory stays
    assert drafter.siblings == {} and len(drafter.memory) == len(RAGGED)


def test_memory_keeps_the_latest_responses_per_prompt():
    drafter = SiblingDrafter(max_per_prompt=2)
    for i in range(5):
        drafter.remember([1, 2], [i, i])
    assert list(drafter.memory[(1, 2)]) == [[3, 3], [4, 4]]
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        drafter.remember([], [1])
    with pytest.raises(ValueError, match="max_per_prompt must be an integer >= 1, got 0"):
        SiblingDrafter(max_per_prompt=0)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram, got 3, 2"):
        SiblingDrafter(max_ngram=2, min_ngram=3)


# ---- the index and the match -----------------------------------------------------------
def test_the_index_grows_with_its_sequences_and_picks_the_nearest_occurrence():
    index = NGramIndex(1, 3)
    a = index.add([7, 1, 2, 3], start=1)
    assert (7,) not in index.ends and index.ends[(7, 1)] == {a: [1]}  # ends before 1: not
    assert index.nearest((1, 2), pos=2, k=3) == (0, [3])
    assert index.nearest((2, 3), pos=3, k=3) is None  # nothing after it yet
    index.extend(a, [1, 2, 5, 6])  # appending indexes the new n-grams only
    assert index.ends[(1, 2)] == {a: [2, 5]} and index.ends[(3, 1, 2)] == {a: [5]}
    assert index.nearest((2, 3), pos=3, k=3) == (0, [1, 2, 5])
    # the occurrence nearest the asking position, whatever came later
    assert index.nearest((1, 2), pos=3, k=2) == (1, [3, 1])
    assert index.nearest((1, 2), pos=6, k=2) == (1, [5, 6])
    # at one distance, more tokens after it win, then the sequence added last
    b = index.add([7, 1, 2, 3, 1, 2, 5], start=1)
    assert index.nearest((1, 2), pos=5, k=3) == (0, [5, 6])  # a's: b has 1 token after
    c = index.add([7, 1, 2, 5, 6], start=1)
    assert index.nearest((1, 2), pos=2, k=2) == (0, [5, 6])  # c's, added last
    assert index.nearest((1, 2), pos=2, k=2, skip=c) == (0, [3, 1])  # b's (or a's: the same)
    assert index.nearest((2, 5), pos=3, k=2) == (0, [6])  # c's at 3 (a's at 6 is farther)
    assert (a, b, c) == (0, 1, 2)


def fake_ctx(requests, live):
    """What a drafter reads of a decoder: every admitted request, the live rows' indices."""
    return SimpleNamespace(admitted=requests, request_ids=live, device="cpu",
                           needs_logq=False)


def output(prompt, tokens, finish="", uid=0):
    r = RequestOutput.of(Request(uid, 0, 0, tuple(prompt)), 0)
    r.tokens, r.finish = list(tokens), finish
    return r


def test_the_match_chosen_is_the_documented_one():
    """Longest n-gram first; the aligned occurrence in a sibling; a sibling before memory at
    the same distance; the row's own sequence when no reference matches; running rows read
    as they grow."""
    d = SiblingDrafter(max_ngram=3, min_ngram=1)
    d.remember([1, 2], [4, 5, 9, 9, 9])
    done = output([1, 2], [4, 5, 6, 7, 8], finish="eos")
    row = output([1, 2], [4, 5])
    other = output([3, 3], [5, 3, 3])  # another prompt: no references, its own sequence
    reqs = [done, row, other]
    tokens, _ = d.draft(fake_ctx(reqs, [1, 2]), 3)
    # (2, 4, 5) ends at the row's position in the sibling and in memory: the sibling's; the
    # other row's (3, 3) occurs earlier in its own prompt + response
    assert tokens.tolist() == [[6, 7, 8], [5, 3, 3]]
    row.tokens += [6, 7]  # it grows, and is read again; (5, 6, 7) is only in the sibling
    late = output([1, 2], [4, 5, 9])  # a sibling joins on memory's path
    reqs.append(late)
    tokens, _ = d.draft(fake_ctx(reqs, [1, 3]), 3)
    assert tokens.tolist() == [[8, 8, 8], [9, 9, 9]]  # done's last token, padded; memory's


# ---- one arm of the bandit -------------------------------------------------------------
def test_the_sibling_strategy_parses_and_round_trips():
    plan = parse_strategy("sibling: k=4")
    assert plan == StepPlan("speculative", 4, drafter="sibling")
    assert strategy_name(plan) == "sibling:k=4" and parse_strategy("sibling:k=4") == plan
    assert plan != parse_strategy("chain:k=4")
    with pytest.raises(ValueError, match="unknown SD strategy 'sibling:k=0'.*'sibling:k=K'"):
        parse_strategy("sibling:k=0")
    with pytest.raises(ValueError, match="sibling:tree"):
        parse_strategy("sibling:tree:k=2,b=2")
    with pytest.raises(ValueError, match="drafter must be None .* got 'x' on a plain plan"):
        StepPlan("plain", drafter="x")
    with pytest.raises(ValueError, match="tree drafted by 'sibling'"):
        strategy_name(StepPlan("speculative", 2, 2, drafter="sibling"))


def eagle_and_siblings(policy):
    """A DrafterSet of a peaked EAGLE head (the main member: its drafts depend on positions
    and masks) and a sibling drafter; the EAGLE member records its rounds."""
    torch.manual_seed(3)
    head = EagleHead(policy)
    with torch.no_grad():
        head.layer.self_attn.q_proj.weight.mul_(8)
        head.layer.self_attn.k_proj.weight.mul_(8)
    return head, DrafterSet({"eagle": recording(EagleDrafter(head)), "sibling": SiblingDrafter()})


def alternating():
    """The adaptive schedule, exploring as much as it likes one step at a time (no runs):
    every step pulls the arm pulled longest ago, so EAGLE chains, sibling chains and plain
    steps take turns."""
    return AdaptiveSchedule(["chain:k=3", "sibling:k=3"], epsilon=1.0, explore_budget=1.0,
                            explore_run=1, settle=0)


def check_drafter_columns(steps):
    """Every speculative step's rows name the drafter its arm asked for; plain steps none."""
    decided = steps[steps["decision"].notna()]
    spec = decided[decided["kind"].isin(["draft", "verify"])]
    expected = spec["arm"].map(lambda a: "sibling" if a.startswith("sibling") else "eagle")
    assert (spec["plan_drafter"] == expected).all()
    assert decided.loc[decided["kind"] == "decode", "plan_drafter"].isna().all()
    return spec.drop_duplicates(["worker", "decision"])["plan_drafter"].tolist()


def test_an_adaptive_schedule_with_a_sibling_arm_is_lossless_and_names_its_drafters(tokenizer):
    policy = tiny_model("llama", tokenizer, seed=2)
    engine = RolloutEngine(policy, tokenizer)
    cfg = RolloutConfig(max_new_tokens=16, temperature=1.0, seed=5, samples_per_prompt=3,
                        max_batch_size=4, refill_slots=1)
    _, drafters = eagle_and_siblings(policy)
    schedule = alternating()
    plain = engine.rollout(RAGGED, cfg, progress=False)
    res = engine.rollout(RAGGED, cfg, progress=False, drafter=drafters, schedule=schedule)
    assert res.tokens == plain.tokens
    ran = check_drafter_columns(res.timeline.steps)
    assert {"eagle", "sibling"} <= set(ran)
    assert set(schedule.table()["arm"]) == {"plain", "chain:k=3", "sibling:k=3"}


def test_the_eagle_member_catches_up_after_rounds_it_skipped(tokenizer):
    """Between two EAGLE rounds, sibling and plain steps commit tokens; the policy states
    of those tokens wait in the decoder until EAGLE drafts again. Every EAGLE round then
    drafts what the head computes afresh on the whole committed sequence."""
    policy = tiny_model("llama", tokenizer, seed=2, context=512)
    head, drafters = eagle_and_siblings(policy)
    cfg = RolloutConfig(max_new_tokens=16, samples_per_prompt=2, max_batch_size=3)
    res = RolloutEngine(policy, tokenizer).rollout(RAGGED, cfg, progress=False,
                                                  drafter=drafters, schedule=alternating())
    ran = check_drafter_columns(res.timeline.steps)
    gaps = sum(a != "eagle" and b == "eagle" for a, b in zip(ran, ran[1:]))
    assert gaps >= 2
    eagle = drafters.members["eagle"]
    assert len(eagle.rounds) >= 6
    for seq, drafts in eagle.rounds:
        assert drafts == reference_eagle_drafts(policy, head, seq, 3)


def test_a_schedule_naming_a_drafter_the_rollout_lacks_is_refused_before_any_forward(
        tokenizer, forwards):  # noqa: F811 (the fixture)
    policy = tiny_model("llama", tokenizer)
    engine = RolloutEngine(policy, tokenizer)
    torch.manual_seed(0)
    for drafter, has in ((EagleDrafter(EagleHead(policy)), r"\['eagle'\]"),
                         (DrafterSet({"a": NGramDrafter(), "b": NGramDrafter()}),
                          r"\['a', 'b'\]")):
        with pytest.raises(ValueError, match=rf"AdaptiveSchedule names drafter 'sibling', "
                                             rf"but the rollout's drafter .* has {has}"):
            engine.rollout(RAGGED, max_new_tokens=8, drafter=drafter, progress=False,
                           schedule=AdaptiveSchedule(["chain:k=2", "sibling:k=2"]))
    assert forwards == []
    # a lone sibling drafter answers to its own name
    engine.rollout(RAGGED, max_new_tokens=8, drafter=SiblingDrafter(), progress=False,
                   schedule=AdaptiveSchedule(["sibling:k=2"]))


def test_a_bad_drafter_set_is_named():
    with pytest.raises(ValueError, match="non-empty dict"):
        DrafterSet({})
    with pytest.raises(ValueError, match=r"main 'c' is not a member; accepted: \['a'\]"):
        DrafterSet({"a": NGramDrafter()}, main="c")
    with pytest.raises(ValueError, match="drafter sets themselves"):
        DrafterSet({"a": DrafterSet({"b": NGramDrafter()})})
    with pytest.raises(ValueError, match="slow its members instead"):
        SlowedDrafter(DrafterSet({"a": NGramDrafter()}), 0.1)
