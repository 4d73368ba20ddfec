"""The suffix-tree drafter (``workbench.speculative.suffix``): its counted trie, the chain and
tree it drafts (most frequent continuation, trees scored by log normalised counts), DAS's
length-aware budget and the ``suffix:k_max=K`` arm; lossless in float64 against plain
decoding on every architecture (ragged continuous batches, greedy and coupled, chains, trees
and budgeted steps), and in distribution under speculative sampling."""
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import papermill
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule, StepPlan
from workbench.rollout.drafts import ChainDraft, TreeDraft
from workbench.rollout.request import Request, RequestOutput
from workbench.rollout.schedule import Schedule
from workbench.speculative import DrafterSet, SuffixDrafter
from workbench.speculative.arms import ARMS, arm_of
from workbench.speculative.bandit import AdaptiveSchedule, parse_strategy, strategy_name
from workbench.speculative.drafters import DRAFTERS, NGramDrafter
from workbench.speculative.resolve import comparison_names, drafter_form, resolve_drafter
from workbench.speculative.suffix import SuffixTrie, length_aware_budget
from workbench.speculative.suffix_trie import FILLER_LOGP

from .conftest import PROMPTS, tiny_model

RAGGED = [PROMPTS[0], PROMPTS[2], PROMPTS[5]]  # 6, 1 and 9 characters


# ---- the trie ----------------------------------------------------------------------------
def test_the_trie_counts_every_bounded_substring_and_matches_the_longest_followed_suffix():
    trie = SuffixTrie(max_depth=3)
    active = trie.add([1, 2, 3, 1, 2, 4])
    count = lambda s: trie.count[trie.node(s)]  # noqa: E731
    assert (count([1]), count([2]), count([1, 2]), count([1, 2, 3]), count([2, 4])) == \
        (2, 2, 2, 1, 1)
    assert trie.node([1, 2, 3, 1]) is None  # longer than max_depth: not kept
    assert [trie.depth[v] for v in active] == [0, 1, 2]  # the suffixes (), (4,), (2, 4)
    # growing the sequence counts only the substrings that end in the new tokens
    active = trie.extend(active, [1, 2])
    assert (count([1, 2]), count([4, 1, 2]), count([1])) == (3, 1, 3)
    # the match: the longest suffix (<= max_depth - 1 tokens) followed by something
    assert trie.depth[trie.match([9, 1, 2])] == 2  # (1, 2): followed by 3 and by 4
    assert trie.match([9, 1, 2]) == trie.node([1, 2])
    assert trie.match([7, 3]) == trie.node([3])  # (7, 3) never occurred
    assert trie.match([9]) is None
    # its children, most frequent first, with log shares of their counts
    trie.add([1, 2, 4])
    assert [(t, round(math.exp(lp), 3)) for t, _, lp in trie.ranked(trie.node([1, 2]))] == \
        [(4, 0.667), (3, 0.333)]
    with pytest.raises(ValueError, match="max_depth .* must be an integer >= 2, got 1"):
        SuffixTrie(1)


def test_a_chain_follows_the_most_frequent_child_and_matches_afresh_at_the_depth_bound():
    trie = SuffixTrie(max_depth=3)
    trie.add([5, 6, 7, 8, 9])
    trie.add([5, 6, 1])
    trie.add([5, 6, 7, 2])
    # (5, 6) -> 7 (twice) -> (6, 7) has depth 2 < 3: walk on to 8 (first seen of 8, 2); then
    # (6, 7, 8) is at the bound: matched afresh on (7, 8) -> 9; then nothing follows 9
    assert trie.chain([0, 5, 6], 6) == [7, 8, 9]
    assert trie.chain([0, 3], 2) == []  # nothing follows 3


# ---- drafting from siblings and memory -----------------------------------------------------
def output(prompt, tokens, finish=""):
    r = RequestOutput.of(Request(0, 0, 0, tuple(prompt)), 0)
    r.tokens, r.finish = list(tokens), finish
    return r


def fake_ctx(requests, live, speculative=False):
    """What a drafter reads of a decoder at one step (``rollout.drafts.DraftInput``'s fields)."""
    rows = [requests[i] for i in live]
    return SimpleNamespace(admitted=requests, request_ids=live, rows=rows, device="cpu",
                           response_lengths=[len(r.tokens) for r in rows],
                           needs_logq=speculative)


def test_it_drafts_the_most_frequent_continuation_of_its_prompts_references():
    d = SuffixDrafter(max_depth=4)
    d.vocab_size, d.dtype = 10, torch.float64  # what check_compatible records of a policy
    d.remember([1, 2], [4, 5, 9, 9])
    done = [output([1, 2], [4, 5, 6, 7], finish="eos"), output([1, 2], [4, 5, 6, 8], "eos")]
    row = output([1, 2], [4, 5])
    other = output([3, 3], [3, 5])  # another prompt: only its own prompt and response
    reqs = [*done, row, other]
    tokens, logq = d.draft(fake_ctx(reqs, [2, 3]), 3)
    # after (2, 4, 5): 6 twice (the siblings) against 9 once (memory); then (4, 5, 6) at
    # the depth bound, matched afresh: 7 and 8 once each, 7 seen first; then nothing follows
    # 7, so the chain is padded with it. The other row: nothing follows (3, 5) or (5,): its
    # last token repeated
    assert tokens.tolist() == [[6, 7, 7], [5, 5, 5]] and logq is None
    # one-hot logq for speculative sampling (a deterministic proposal)
    tokens, logq = d.draft(fake_ctx(reqs, [2], speculative=True), 2)
    assert logq.shape == (1, 2, 10) and (logq.exp().argmax(-1) == tokens).all()
    assert logq.exp().sum(-1).eq(1).all()
    # the row grows and is read again (memory's 9 follows it now); a late sibling's (2, 4, 5)
    # is followed by 9 twice (memory, the row) and 6 twice: the tie goes to the first seen
    row.tokens += [9]
    reqs.append(output([1, 2], [4]))
    tokens, _ = d.draft(fake_ctx(reqs, [2, 4]), 2)
    assert tokens.tolist() == [[9, 9], [5, 9]]


def test_a_tree_is_scored_by_log_normalised_counts_and_padded_with_fillers():
    d = SuffixDrafter(max_depth=8)
    reqs = [output([1], [2, 3, 4], "eos"), output([1], [2, 3, 4], "eos"),
            output([1], [2, 5, 6], "eos"), output([1], [])]
    tree = d.draft_tree(fake_ctx(reqs, [3]), k=3, branch=2)
    # root: after (1,) only 2 (3 times: log 1); below it 3 (2/3) and 5 (1/3); then 4 below 3
    # and 6 below 5. Level 1 has one counted candidate: a filler (the row's last token, 1)
    lp = math.log
    assert tree.tokens.tolist() == [[2, 1, 3, 5, 4, 6]]
    assert tree.parents.tolist() == [[-1, -1, 0, 0, 2, 3]]
    np.testing.assert_allclose(tree.scores[0].tolist(),
                               [0, FILLER_LOGP, lp(2 / 3), lp(1 / 3), lp(2 / 3), lp(1 / 3)])
    # pruned to a budget, the fillers go first and the kept nodes stay ancestor-closed
    assert tree.select(4).tokens.tolist() == [[2, 3, 5, 4]]
    with pytest.raises(ValueError, match="branch must be an integer >= 1, got 0"):
        d.draft_tree(fake_ctx(reqs, [3]), k=2, branch=0)


# ---- DAS's budget -------------------------------------------------------------------------
def test_the_budget_grows_with_the_response_length_and_the_acceptance():
    budget = lambda pos, acc=1.0: length_aware_budget(pos, acc, 1, 9, half_length=64)  # noqa
    assert [budget(p) for p in (0, 8, 64, 192, 10_000)] == [1, 2, 5, 7, 9]
    assert [budget(64, a) for a in (0.0, 0.5, 1.0)] == [1, 3, 5]
    assert length_aware_budget(10, 1.0, 4, 4, 1) == 4  # k_min = k_max: fixed
    for args, msg in (((-1, 1.0, 1, 4, 8), "position .* >= 0, got -1"),
                      ((0, 1.5, 1, 4, 8), r"acceptance .* in \[0, 1\], got 1.5"),
                      ((0, 1.0, 0, 4, 8), "k_min must be an integer >= 1, got 0"),
                      ((0, 1.0, 5, 4, 8), r"k_max \(>= k_min = 5\) must be an integer >= 5, "
                                          "got 4"),
                      ((0, 1.0, 1, 4, 0), "half_length must be an integer >= 1, got 0")):
        with pytest.raises(ValueError, match=msg):
            length_aware_budget(*args)


def test_the_steps_budget_follows_the_longest_row_and_what_its_drafts_kept():
    d = SuffixDrafter(k_min=1, half_length=4, decay=0.5)
    fresh, long_row = output([1, 2], []), output([1, 2], [3] * 12)
    reqs = [fresh, long_row]
    ctx = fake_ctx(reqs, [0, 1])
    assert d.budget(ctx, 8) == 1 + round(7 * 12 / 16)  # the long row's: 6
    draft = d.propose_budgeted(ctx, 8)
    # the long row repeats 3: its drafts are 3s; the fresh row's too (its prompt is (1, 2))
    assert isinstance(draft, ChainDraft) and draft.tokens.tolist() == [[3] * 6] * 2
    long_row.tokens += [3, 3, 7]  # two drafts kept, then the policy's own token
    fresh.tokens += [5]  # nothing kept
    ctx = fake_ctx(reqs, [0, 1])
    assert d.acceptance == {}  # read at the next round
    assert d.budget(ctx, 8) == 1 + round(7 * 15 / 19 * (0.5 + 0.5 * 2 / 6))
    assert d.acceptance == {0: 0.5, 1: pytest.approx(0.5 + 0.5 * 2 / 6)}
    assert d.budget(ctx, 2) == 2  # at most k_max


def test_a_budgeted_tree_drops_levels_of_fillers_only():
    d = SuffixDrafter(half_length=1)
    reqs = [output([1], [2, 3, 4, 5], "eos"), output([1], [2, 3], "eos"), output([1], [2])]
    ctx = fake_ctx(reqs, [2])
    assert d.budget(ctx, 6) == 4  # 1 + 5 * 1/2, rounded half up
    draft = d.propose_budgeted(ctx, 6, branch=2)
    # after (1, 2): 3; after (2, 3): 4; after 4: 5; then nothing: three levels, each a counted
    # node then a filler
    assert isinstance(draft, TreeDraft) and draft.k == 3 and draft.size == 6
    assert draft.tokens[0, ::2].tolist() == [3, 4, 5]
    draft = d.propose_budgeted(ctx, 6, branch=2, verify_budget=3)
    assert draft.tokens.tolist() == [[3, 4, 5]]


# ---- the arm and the registry -------------------------------------------------------------
def test_the_suffix_arm_parses_round_trips_and_is_registered():
    plan = parse_strategy("suffix: k_max=6")
    assert (plan.k, plan.branch, plan.verify_budget, plan.drafter) == (6, 1, None, "suffix")
    assert plan.arm == arm_of("suffix:k_max=6") and strategy_name(plan) == "suffix:k_max=6"
    tree = parse_strategy("suffix:k_max=4,b=2,n=5")
    assert tree.tree and strategy_name(tree) == "suffix:k_max=4,b=2,n=5"
    with pytest.raises(ValueError, match="unknown SD strategy 'suffix:k=4'.*'suffix:k_max=K"):
        parse_strategy("suffix:k=4")
    assert "suffix" in ARMS.names() and "suffix" in DRAFTERS.names()
    assert "suffix" not in DRAFTERS.plugin_names()  # a built-in
    assert drafter_form("suffix") == "suffix"
    assert comparison_names("auto", ["suffix", "sibling"]) == ["eagle", "suffix", "sibling"]


def test_the_arm_refuses_a_suffix_member_that_is_no_suffix_drafter(tokenizer):
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    with pytest.raises(ValueError, match="'suffix' member is NGramDrafter, which has no "
                                         "propose_budgeted"):
        engine.rollout(RAGGED, max_new_tokens=4, progress=False,
                       drafter=DrafterSet({"suffix": NGramDrafter()}),
                       schedule=Always(parse_strategy("suffix:k_max=3")))


# ---- lossless -----------------------------------------------------------------------------
class Always(Schedule):
    """Every step the same plan (an arm's plan, with its arm)."""

    def __init__(self, plan: StepPlan):
        self.step, self.needs_trees = plan, plan.tree
        self.drafter_names = frozenset({plan.drafter} - {None})

    def plan(self, batch_size: int, worker: int) -> StepPlan:
        return self.step


SHAPES = {"chain": lambda: StaticSchedule(3), "tree": lambda: StaticSchedule(3, 3, 6),
          "budget": lambda: Always(parse_strategy("suffix:k_max=5")),
          "budget_tree": lambda: Always(parse_strategy("suffix:k_max=4,b=2,n=5"))}


@pytest.mark.parametrize("arch", ["llama", "qwen2_sw", "qwen3", "mistral"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_suffix_drafts_are_lossless_with_siblings_and_memory(tokenizer, arch, temperature):
    """Ragged prompts, 3 siblings each, a continuous batch of 4 refilled slot by slot; chains,
    trees and budgeted steps (chains and trees); then a second step that also drafts from the
    first one's responses (memory). Greedy or coupled: the plain rollout's tokens and
    logprobs, in float64."""
    engine = RolloutEngine(tiny_model(arch, tokenizer, seed=2), tokenizer)
    cfg = RolloutConfig(max_new_tokens=16, temperature=temperature, top_p=0.9, seed=3,
                        samples_per_prompt=3, max_batch_size=4, refill_slots=1,
                        workers=2 if arch == "mistral" else 1)
    plain = engine.rollout(RAGGED, cfg, progress=False)
    second = engine.rollout(RAGGED, cfg, progress=False, rl_step=1)
    for shape, schedule in SHAPES.items():
        drafter = SuffixDrafter(half_length=4)
        res = engine.rollout(RAGGED, cfg, progress=False, drafter=drafter, schedule=schedule())
        assert res.tokens == plain.tokens, shape
        np.testing.assert_allclose(np.concatenate(res.logprobs),
                                   np.concatenate(plain.logprobs), atol=1e-9)
        t = res.timeline.requests
        assert t["drafted"].sum() > 0
        if temperature == 0:  # identical siblings: drafts are accepted
            assert t["accepted"].sum() > 0, shape
        drafter.remember_result(res)
        res = engine.rollout(RAGGED, cfg, progress=False, drafter=drafter, rl_step=1,
                             schedule=schedule())
        assert res.tokens == second.tokens, shape


def test_a_lone_row_accepts_drafts_on_its_own_repeating_text_and_more_with_memory(tokenizer):
    """One row, no sibling: the tiny greedy model repeats itself, and the trie over its own
    prompt and response proposes the repeats; a second rollout of the same prompt drafts its
    earlier response from memory and keeps most drafts."""
    engine = RolloutEngine(tiny_model("llama", tokenizer, seed=2), tokenizer)
    cfg, k = RolloutConfig(max_new_tokens=32, max_batch_size=1), 4
    drafter = SuffixDrafter()
    first = engine.rollout([PROMPTS[1]], cfg, progress=False, drafter=drafter, spec_k=k)
    t = first.timeline.requests
    assert t["accepted"].sum() > 0
    drafter.remember_result(first)
    second = engine.rollout([PROMPTS[1]], cfg, progress=False, drafter=drafter, spec_k=k)
    assert second.tokens == first.tokens
    t2 = second.timeline.requests
    rate, rate2 = (x["accepted"].sum() / x["drafted"].sum() for x in (t, t2))
    assert rate2 > 0.8 and rate2 > rate, (rate, rate2)  # the last step is cut at the cap


def test_an_adaptive_schedule_chooses_among_budgets_losslessly(tokenizer):
    policy = tiny_model("llama", tokenizer, seed=2)
    engine = RolloutEngine(policy, tokenizer)
    cfg = RolloutConfig(max_new_tokens=16, temperature=1.0, seed=5, samples_per_prompt=3,
                        max_batch_size=4, refill_slots=1)
    schedule = AdaptiveSchedule(["chain:k=3", "suffix:k_max=2", "suffix:k_max=6"],
                                epsilon=1.0, explore_budget=1.0)
    drafters = DrafterSet({"ngram": NGramDrafter(), "suffix": SuffixDrafter(half_length=2)})
    plain = engine.rollout(RAGGED, cfg, progress=False)
    res = engine.rollout(RAGGED, cfg, progress=False, drafter=drafters, schedule=schedule)
    assert res.tokens == plain.tokens
    steps = res.timeline.steps
    spec = steps[steps["kind"].isin(["draft", "verify"]) & steps["decision"].notna()]
    assert set(spec["arm"]) == {"chain:k=3", "suffix:k_max=2", "suffix:k_max=6"}
    assert set(spec.loc[spec["arm"].str.startswith("suffix"), "plan_drafter"]) == {"suffix"}
    assert set(schedule.table()["arm"]) == {"plain", "chain:k=3", "suffix:k_max=2",
                                            "suffix:k_max=6"}


def test_resolve_builds_a_suffix_drafter(tokenizer):
    drafter = resolve_drafter("suffix", tiny_model("llama", tokenizer), tokenizer)
    assert isinstance(drafter, SuffixDrafter) and drafter.module is None
    assert drafter.supports_trees and drafter.name == "suffix"
    with pytest.raises(ValueError, match="max_per_prompt must be an integer >= 1, got 0"):
        SuffixDrafter(max_per_prompt=0)
    with pytest.raises(ValueError, match=r"decay .* in \[0, 1\), got 1"):
        SuffixDrafter(decay=1)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        drafter.remember([], [1])


# ---- speculative sampling: the policy's distribution exactly --------------------------------
class NoEosTokenizer:
    """The three attributes the engine needs, for a vocabulary of bare ids."""

    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def peaky_llama(seed: int, vocab: int = 5):
    """A one-layer Llama far from uniform (a wrong acceptance rule shows)."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=False)).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model


def joint_3(model, prompt, vocab: int = 5) -> dict:
    """The policy's exact probability of every 3-token response."""
    seqs = [[a, b, c] for a in range(vocab) for b in range(vocab) for c in range(vocab)]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + s[:2] for s in seqs])).logits, -1)
    n = len(prompt)
    return {tuple(s): float(sum(logp[i, n - 1 + j, s[j]] for j in range(3)).exp())
            for i, s in enumerate(seqs)}


def chi_square(counts: dict, probs: dict) -> tuple[float, int]:
    """Pearson's statistic over cells expected >= 5 (the rest pooled), its degrees of freedom."""
    n = sum(counts.values())
    big = [c for c in probs if probs[c] * n >= 5]
    stat = sum((counts.get(c, 0) - probs[c] * n) ** 2 / (probs[c] * n) for c in big)
    rest_p, rest_n = 1 - sum(probs[c] for c in big), n - sum(counts.get(c, 0) for c in big)
    if rest_p * n >= 5:
        stat += (rest_n - rest_p * n) ** 2 / (rest_p * n)
        big.append(None)
    df = len(big) - 1
    return stat, df


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_speculative_sampling_with_suffix_drafts_keeps_the_policy_joint_distribution(shape):
    """Drafts read from the other rows' draws are proposals independent of the row's own
    uniforms, so the rejection rule samples the policy exactly (chi-square at p = 0.001,
    Wilson-Hilferty)."""
    policy, prompt = peaky_llama(0), [1, 2, 3]
    schedule = StaticSchedule(2) if shape == "chain" else StaticSchedule(2, 2)
    res = RolloutEngine(policy, NoEosTokenizer()).rollout(
        [prompt], progress=False, drafter=SuffixDrafter(), max_new_tokens=3, temperature=1.0,
        samples_per_prompt=4000, seed=7, schedule=schedule, spec_mode="speculative",
        max_batch_size=1000)
    counts: dict = {}
    for t in res.tokens:
        counts[tuple(t)] = counts.get(tuple(t), 0) + 1
    t = res.timeline.requests
    assert 0.2 < t["accepted"].sum() / t["drafted"].sum() < 0.95  # both paths exercised
    stat, df = chi_square(counts, joint_3(policy, prompt))
    quantile = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    assert df >= 8 and stat < quantile, (stat, df)


# ---- where drafters are named -------------------------------------------------------------
def test_notebook_02_compares_the_suffix_drafter(tmp_path):
    """Notebook 02, tiny, with ``other_drafters=["suffix"]``: its rows are in every table it
    writes, and SD with it reproduced plain decoding in the float64 check."""
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "02"
    papermill.execute_notebook(
        root / "notebooks" / "02_speculative_decoding.ipynb", tmp_path / "executed.ipynb",
        parameters={"drafter": "ngram", "other_drafters": ["suffix"], "num_prompts": 2,
                    "samples_per_prompt": 1,
                    "batch_sizes": [1], "ks": [2], "curve_k": 2, "temperatures": [0.0, 1.0],
                    "repeats": 3, "max_new_tokens": 12, "lossless_prompts": 2,
                    "whatif_workers": 2, "whatif_samples": 2, "out_dir": str(out)},
        kernel_name="python3", language="python", progress_bar=False, cwd=str(root))
    for table in ("drafters", "curve", "lossless"):
        assert set(pd.read_csv(out / f"{table}.csv")["drafter"]) == {"ngram", "suffix"}, table
    exact = pd.read_csv(out / "lossless.csv")
    mine = exact[exact["drafter"] == "suffix"]
    assert sorted(mine["temperature"]) == [0.0, 1.0] and mine["identical"].all()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["lossless"] is True and metrics["accept_len_suffix"] >= 1.0
