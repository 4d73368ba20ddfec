"""Tree drafts: the tree helpers, the tree mask, and lossless tree verification (float64)."""
import copy
from collections import Counter, defaultdict

import pytest
import torch
from transformers import DynamicCache

from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule, StepPlan
from workbench.rollout.batch import DecodeBatch
from workbench.rollout.decoder import BatchDecoder
from workbench.rollout.forward import policy_forward
from workbench.rollout.request import RequestOutput
from workbench.rollout.sampling import SamplingParams, adjusted_logprobs
from workbench.rollout.tree import DraftTree, grow_level, grow_tree
from workbench.rollout.verify import speculative_accept_tree
from workbench.rollout.worker import StepRecorder
from workbench.speculative import EagleDrafter, EagleHead, LMDrafter

from .helpers.models import ARCHS, PROMPTS, tiny_model, visible_cache_equals_fresh_recompute
from .drafters import ScriptedTreeDrafter


def random_tree(rows: int, k: int, branch: int, vocab: int, seed: int) -> DraftTree:
    """A tree grown from random drafter logits; some logprobs are exactly 0 (score ties)."""
    gen = torch.Generator().manual_seed(seed)

    def logits(w):
        out = torch.randn(rows, w, vocab, generator=gen, dtype=torch.float64)
        out[0, 0, 3] = 1e4  # row 0's first node: one certain child, a tie with its parent
        return out

    return grow_tree(lambda x, depth: torch.log_softmax(x, -1), logits(1)[:, 0], k, branch,
                     lambda levels: logits(levels[-1][0].shape[1]))


# ---- the tree structure -----------------------------------------------------------------
def test_ancestor_matrix_and_depths_of_a_hand_built_tree():
    #   root -> 0 -> 2 -> 4 ; 0 -> 3 ; root -> 1 -> 5     (fed index = node + 1)
    tree = DraftTree(torch.arange(6)[None], torch.tensor([[-1, -1, 0, 0, 2, 1]]),
                     torch.zeros(1, 6))
    expected = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 4], 5: [0, 1, 3, 5],
                6: [0, 2, 6]}
    anc = tree.ancestors()[0]
    for i, cols in expected.items():
        assert torch.nonzero(anc[i]).flatten().tolist() == cols
    assert tree.depths()[0].tolist() == [0, 1, 1, 2, 2, 3, 2]
    assert tree.sibling_ranks()[0].tolist() == [0, 1, 0, 1, 0, 0]


def test_levels_keep_the_best_candidates_by_cumulative_logprob():
    gen = torch.Generator().manual_seed(0)
    frontier = -torch.rand(2, 3, generator=gen, dtype=torch.float64)
    logprobs = torch.log_softmax(torch.randn(2, 3, 11, generator=gen, dtype=torch.float64), -1)
    tokens, slot, score = grow_level(frontier, logprobs, branch=3)
    for r in range(2):
        top_per_parent = [(float(frontier[r, f] + logprobs[r, f, t]), f, t) for f in range(3)
                          for t in logprobs[r, f].topk(3).indices.tolist()]
        best = sorted(top_per_parent, reverse=True)[:3]
        assert [(f, t) for _, f, t in best] == list(zip(slot[r].tolist(), tokens[r].tolist()))
        torch.testing.assert_close(score[r], torch.tensor([s for s, _, _ in best],
                                                          dtype=torch.float64))


@pytest.mark.parametrize("budget", [1, 3, 7, 12, None])
def test_selection_by_cumulative_logprob_is_ancestor_closed(budget):
    full = random_tree(rows=3, k=4, branch=3, vocab=9, seed=budget or 0)
    assert full.size == 12 and (full.parents < torch.arange(12)).all()
    tree = full.select(budget)
    kept = min(budget or 12, 12)
    assert tree.size == kept
    for r in range(3):
        scores = full.scores[r].tolist()
        chosen = sorted(scores, reverse=True)[:kept]
        assert sorted(tree.scores[r].tolist(), reverse=True) == chosen
        for j, p in enumerate(tree.parents[r].tolist()):  # each parent is kept, before it
            assert -1 <= p < j
            if p >= 0:  # and is the same node as in the full tree
                assert tree.scores[r, p] >= tree.scores[r, j]
        # the root-to-node token paths of the kept nodes exist in the full tree
        paths_full = {tuple(full.tokens[r, torch.nonzero(a[1:]).flatten()].tolist())
                      for a in full.ancestors()[r][1:]}
        for a in tree.ancestors()[r][1:]:
            assert tuple(tree.tokens[r, torch.nonzero(a[1:]).flatten()].tolist()) in paths_full


# ---- the tree mask ----------------------------------------------------------------------
@pytest.mark.parametrize("arch,lean", [("llama", None), ("llama", False), ("qwen3", None),
                                       ("mistral", None), ("llama_odd", None)])
def test_tree_forward_equals_a_recompute_of_each_branch(tokenizer, arch, lean):
    """Every node's logits from one tree forward over a ragged batch equal a plain forward of
    the prompt followed by that node's root-to-node path."""
    model = tiny_model(arch, tokenizer)
    fwd = policy_forward(model, lean)
    prompts = RolloutEngine(model, tokenizer).encode([PROMPTS[i] for i in (0, 1, 3)])
    batch, ids, pos = DecodeBatch.from_prompts(prompts, range(3), tokenizer.pad_token_id, "cpu")
    fwd(ids, pos, batch.mask, batch.col_pos, batch.cache)
    tree = random_tree(rows=3, k=4, branch=3, vocab=len(tokenizer), seed=1).select(9)
    visible = tree.ancestors()
    fed = torch.cat([torch.tensor([[7], [8], [9]]), tree.tokens], dim=1)
    pos = batch.append_columns(10, positions=batch.next_pos[:, None] + visible.sum(-1) - 1)
    logits, _ = fwd(fed, pos, batch.mask, batch.col_pos, batch.cache, logits_from=0,
                    tree=visible)
    for r, prompt in enumerate(prompts):
        for i in range(10):
            path = fed[r, visible[r, i]].tolist()
            with torch.no_grad():
                ref = model(torch.tensor([prompt + path])).logits[0, -1]
            torch.testing.assert_close(logits[r, i], ref, atol=1e-9, rtol=0)


# ---- lossless tree verification ---------------------------------------------------------
def scripted_tree_drafter(plain):
    """Row ``i`` accepts ``i % 5`` drafts per step (all of them at depth 4)."""
    return ScriptedTreeDrafter({r.uid: r.tokens for r in plain.requests},
                               {r.uid: i % 5 for i, r in enumerate(plain.requests)})


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_sd_is_token_identical_to_plain_decoding(tokenizer, arch, temperature):
    """Greedy and coupled, ragged prompts, continuous batching (3 slots for 6 requests);
    the scripted tree hides the right token among siblings and is sometimes all wrong, so
    rows accept 0..4 drafts through non-first children."""
    model = tiny_model(arch, tokenizer, seed=1)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=28, temperature=temperature, seed=4, max_batch_size=3)
    prompts = PROMPTS[:6]
    plain = engine.rollout(prompts, cfg, progress=False)
    res = engine.rollout(prompts, cfg, drafter=scripted_tree_drafter(plain), progress=False,
                         schedule=StaticSchedule(4, branch=3, verify_budget=8))
    assert res.tokens == plain.tokens
    torch.testing.assert_close(torch.tensor(sum(res.logprobs, [])),
                               torch.tensor(sum(plain.logprobs, [])), atol=1e-9, rtol=0)
    for i, r in enumerate(res.requests):  # the scripted count, up to the row's last step
        assert r.accepted_per_step[:-1] == [i % 5] * (len(r.accepted_per_step) - 1)
    assert max(a for r in res.requests for a in r.accepted_per_step) >= 3
    t = res.timeline.requests
    assert (t["drafted"] == 8 * t["verify_steps"]).all()  # drafted counts the nodes verified


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_tree_sd_with_an_eagle_head_is_lossless(tokenizer, arch):
    model = tiny_model(arch, tokenizer, seed=2)
    engine = RolloutEngine(model, tokenizer)
    torch.manual_seed(0)
    drafter = EagleDrafter(EagleHead(model))
    for temperature in (0.0, 1.0):
        cfg = RolloutConfig(max_new_tokens=24, temperature=temperature, seed=1,
                            max_batch_size=3)
        plain = engine.rollout(PROMPTS[:5], cfg, progress=False)
        res = engine.rollout(PROMPTS[:5], cfg, drafter=drafter, progress=False,
                             schedule=StaticSchedule(3, branch=4, verify_budget=10))
        assert res.tokens == plain.tokens
        assert sum(sum(r.accepted_per_step) for r in res.requests) > 0


def test_cache_after_tree_steps_equals_a_fresh_recompute(tokenizer):
    model = tiny_model("llama", tokenizer, seed=3)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=60)
    plain = engine.rollout(PROMPTS, cfg, progress=False)
    reqs = [RequestOutput.of(q, 0) for q in engine.make_requests(engine.encode(PROMPTS), cfg)]
    drafter = scripted_tree_drafter(plain)
    drafter.check_compatible(model, tokenizer)
    dec = BatchDecoder(policy_forward(model), cfg, StepRecorder(0, "sim"), engine.eos_id,
                       engine.pad_id, drafter=drafter)
    dec.admit(reqs[:3])
    for k, budget in ((4, 8), (2, None), (3, 5)):
        dec.step(StepPlan("speculative", k, 3, budget), 0)  # rejected nodes leave holes
    assert (dec.batch.mask == 0).any()
    visible_cache_equals_fresh_recompute(model, dec)
    dec.admit(reqs[3:6])
    dec.plain_step()
    dec.step(StepPlan("speculative", 4, 2, 6), 0)
    visible_cache_equals_fresh_recompute(model, dec)


# ---- the EAGLE drafter's own tree attention ---------------------------------------------
@torch.no_grad()
def eagle_path_logprob(policy, head, seq, path):
    """The cumulative logprob the EAGLE head gives ``path`` after ``seq``, each step
    recomputed from scratch on the whole sequence (no cache, no tree mask)."""
    from workbench.rollout.forward import causal_mask_4d
    ids = torch.tensor([seq])
    pos = torch.arange(len(seq))[None]
    _, states = policy_forward(policy, lean=False)(ids, pos, torch.ones_like(ids), pos,
                                                   DynamicCache())
    decoder, lm_head = policy.get_decoder(), policy.get_output_embeddings()
    feats, toks, total = states[0, :-1], ids[0, 1:], 0.0
    for token in path:
        n = len(toks)
        emb = policy.get_input_embeddings()(toks)[None]
        out = head(emb, feats[None], causal_mask_4d(torch.ones(1, n, dtype=torch.long), n,
                                                    emb.dtype),
                   decoder.rotary_emb(emb, torch.arange(n)[None]))
        total += float(torch.log_softmax(lm_head(decoder.norm(out[0, -1])), -1)[token])
        feats, toks = torch.cat([feats, out[0, -1:]]), torch.cat([toks, torch.tensor([token])])
    return total


def test_eagle_tree_scores_equal_a_from_scratch_recompute_of_each_path(tokenizer):
    policy = tiny_model("llama", tokenizer, context=512)
    torch.manual_seed(3)
    head = EagleHead(policy)
    with torch.no_grad():  # peaked attention, so masks and positions decide the scores
        head.layer.self_attn.q_proj.weight.mul_(8)
        head.layer.self_attn.k_proj.weight.mul_(8)
    drafter, rounds = EagleDrafter(head), []
    inner = drafter.draft_tree

    def draft_tree(ctx, k, branch):
        tree = inner(ctx, k, branch)
        rounds.append((ctx.sequences, tree))
        return tree

    drafter.draft_tree = draft_tree
    RolloutEngine(policy, tokenizer).rollout(PROMPTS[:3], max_new_tokens=12, drafter=drafter,
                                             schedule=StaticSchedule(3, branch=3),
                                             progress=False)
    checked = 0
    for seqs, tree in rounds[:3]:
        anc = tree.ancestors()
        for r, seq in enumerate(seqs):
            for j in range(tree.size):
                path = tree.tokens[r, torch.nonzero(anc[r, j + 1, 1:]).flatten()].tolist()
                assert abs(eagle_path_logprob(policy, head, seq, path)
                           - float(tree.scores[r, j])) < 1e-9
                checked += 1
    assert checked >= 3 * 9


# ---- speculative sampling through a tree ------------------------------------------------
#   root -> A=2 (-> 1, 3), B=0 (-> 5, 0, 1), C=2 (-> 4): C duplicates A, and A's child 3 has
#   policy probability 0 (fed index = node + 1)
SPEC_TOKENS = torch.tensor([[2, 0, 2, 1, 3, 5, 0, 1, 4]])
SPEC_PARENTS = torch.tensor([[-1, -1, -1, 0, 0, 1, 1, 1, 2]])
REJECT = 1 - 2**-53  # the largest uniform: rejects every child short of all the residual mass


def spec_policy() -> torch.Tensor:
    """``[1, 10, 6]`` policy logprobs at the fed nodes of the tree above."""
    gen = torch.Generator().manual_seed(7)
    logp = torch.randn(1, 10, 6, generator=gen, dtype=torch.float64)
    logp[0, 1, 3] = float("-inf")
    return torch.log_softmax(logp, -1)


def expected_first_two(logp: torch.Tensor) -> dict[tuple, float]:
    """The policy's law of what a step emits first: ``(x1, x2)`` when ``x1`` is a child of the
    root (the walk then emits a second token, from the node of ``x1``), ``(x1,)`` otherwise."""
    p = logp[0].exp()
    node_of = {2: 1, 0: 2}
    out = {}
    for x1 in range(6):
        if x1 in node_of:
            out.update({(x1, x2): float(p[0, x1] * p[node_of[x1], x2]) for x2 in range(6)})
        else:
            out[(x1,)] = float(p[0, x1])
    return out


def first_two(paths, last, tokens) -> list[tuple]:
    return [tuple(([tokens[0, c - 1].item() for c in path] + [x])[:2])
            for path, x in zip(paths, last)]


def integrated_first_two(logp: torch.Tensor, grid: int = 2**13) -> dict[tuple, float]:
    """The law of what ``speculative_accept_tree`` emits first on the tree above, integrated
    over its uniforms. Every decision is a threshold in its own uniform, so the walk is followed
    decision by decision, each measured on a midpoint grid of its uniform (error <= 1/grid)
    with the earlier decisions forced (u = 0 accepts a child, REJECT rejects it). A first pass
    collects the decisions, one batched call measures them all, a second pass multiplies."""
    n = SPEC_TOKENS.shape[1]
    children = defaultdict(list)
    for j, par in enumerate(SPEC_PARENTS[0].tolist()):
        children[par + 1].append(j + 1)
    answers, out = {}, defaultdict(float)

    def outcome(forced, column):  # (paths, last) over the grid of one decision's uniform
        return answers.setdefault((tuple(sorted(forced.items())), column), ([], []))

    def walk(node, forced, prob, emitted):
        if len(emitted) == 2:
            out[tuple(emitted)] += prob
            return
        for c in children[node]:
            p_acc = sum(c in path for path in outcome(forced, ("accept", c - 1))[0]) / grid
            walk(c, {**forced, c - 1: 0.0}, prob * p_acc,
                 emitted + [SPEC_TOKENS[0, c - 1].item()])
            forced, prob = {**forced, c - 1: REJECT}, prob * (1 - p_acc)
        for x, count in Counter(outcome(forced, ("resample", node))[1]).items():
            out[tuple(emitted + [x])] += prob * count / grid

    walk(0, {}, 1.0, [])
    keys = list(answers)
    acc = torch.full((len(keys), grid, n), 0.5, dtype=torch.float64)
    res = torch.full((len(keys), grid, n + 1), 0.5, dtype=torch.float64)
    for i, (forced, (kind, col)) in enumerate(keys):
        for j, u in forced:
            acc[i, :, j] = u
        (acc if kind == "accept" else res)[i, :, col] = (torch.arange(grid) + 0.5) / grid
    rows = len(keys) * grid
    paths, last = speculative_accept_tree(SPEC_TOKENS.expand(rows, -1),
                                          SPEC_PARENTS.expand(rows, -1),
                                          logp.expand(rows, -1, -1), acc.flatten(0, 1),
                                          res.flatten(0, 1))
    for i, key in enumerate(keys):
        answers[key] = (paths[i * grid:(i + 1) * grid], last[i * grid:(i + 1) * grid])
    out.clear()
    walk(0, {}, 1.0, [])
    return dict(out)


def test_speculative_tree_walk_emits_exactly_the_policys_distribution():
    """Integrated over the uniforms, the first token has the root's distribution and the first
    two the policy's joint law, duplicates and zero-probability children included."""
    logp = spec_policy()
    expected, got = expected_first_two(logp), integrated_first_two(logp)
    assert set(got) <= set(expected)
    assert max(abs(got.get(key, 0.0) - v) for key, v in expected.items()) < 5e-4
    first = defaultdict(float)
    for key, v in got.items():
        first[key[0]] += v
    torch.testing.assert_close(torch.tensor([first[x] for x in range(6)], dtype=torch.float64),
                               logp[0, 0].exp(), atol=5e-4, rtol=0)
    assert got[(2, 3)] == 0                         # A's child 3 has probability 0


def test_speculative_tree_walk_matches_the_policy_by_monte_carlo():
    """20k batched walks with random uniforms: frequencies within 5 sigma of the policy's law,
    and every accepted path a root-to-leaf chain of the tree."""
    logp, rows = spec_policy(), 20_000
    gen = torch.Generator().manual_seed(11)
    acc = torch.rand(rows, 9, generator=gen, dtype=torch.float64)
    res = torch.rand(rows, 10, generator=gen, dtype=torch.float64)
    paths, last = speculative_accept_tree(SPEC_TOKENS.expand(rows, -1),
                                          SPEC_PARENTS.expand(rows, -1),
                                          logp.expand(rows, -1, -1), acc, res)
    parents = SPEC_PARENTS[0].tolist()
    for path in paths:
        assert [parents[c - 1] + 1 for c in path] == ([0] + path)[:len(path)]
    counts = Counter(first_two(paths, last, SPEC_TOKENS))
    for key, p in expected_first_two(logp).items():
        sigma = (p * (1 - p) / rows) ** 0.5
        assert abs(counts[key] / rows - p) <= 5 * sigma + 1e-9, key
    p = logp[0].exp()   # accepted nodes: x1 in {2, 0}, then x2 among that node's children
    mean_len = p[0, 2] * (1 + p[1, [1, 3]].sum()) + p[0, 0] * (1 + p[2, [5, 0, 1]].sum())
    lengths = torch.tensor([len(path) for path in paths], dtype=torch.float64)
    assert abs(lengths.mean() - mean_len) <= 5 * lengths.std() / rows ** 0.5


def test_speculative_tree_walk_edge_cases():
    """No nodes: a plain draw from the root. All the mass on one child: always accepted."""
    logp = torch.log_softmax(torch.tensor([[[0.0, 1.0, 2.0]]], dtype=torch.float64), -1)
    paths, last = speculative_accept_tree(torch.zeros(1, 0, dtype=torch.long),
                                          torch.zeros(1, 0, dtype=torch.long), logp,
                                          [[]], [[0.5]])
    cdf = logp[0, 0].exp().cumsum(0)
    assert paths == [[]] and last == [int((cdf <= 0.5).sum())]
    sure = torch.tensor([[[0.0, float("-inf"), float("-inf")], [0.0] * 3, [0.0] * 3]])
    paths, last = speculative_accept_tree(torch.tensor([[1, 0]]), torch.tensor([[-1, -1]]),
                                          torch.log_softmax(sure, -1), [[0.3, REJECT]],
                                          [[0.2, 0.2, 0.9]])
    assert paths == [[2]] and last == [2]   # float32 logprobs, a uniform just below 1


def policy_probs_along(model, prompt, responses, temperature):
    """``[S, L, V]``: the policy's adjusted distribution of each response token given its
    prefix, by one plain forward over prompt + response (responses of equal length ``L``)."""
    ids = torch.tensor([prompt + r for r in responses])
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1:-1]
    return adjusted_logprobs(logits, SamplingParams(temperature=temperature)).exp()


def test_speculative_tree_sd_samples_the_policy(tokenizer):
    """400 samples of one prompt, a tree drafter equal to a copy of the policy: the tokens the
    tree steps emit (response positions 1 and 2, after the prefill's token) follow the policy
    given their prefixes (chi-square over tokens), the reported logprobs are the policy's, and
    a close drafter gets more than one token accepted per step."""
    model = tiny_model("llama", tokenizer, seed=1)
    engine = RolloutEngine(model, tokenizer)
    temperature, length = 0.05, 4
    cfg = RolloutConfig(max_new_tokens=length, temperature=temperature, seed=5,
                        spec_mode="speculative", samples_per_prompt=400)
    res = engine.rollout(PROMPTS[:1], cfg, drafter=LMDrafter(copy.deepcopy(model), tokenizer),
                         progress=False, schedule=StaticSchedule(3, branch=3, verify_budget=8))
    full = [r for r in res.requests if len(r.tokens) == length]
    assert len(full) >= 350 and all(len(r.tokens) <= length for r in res.requests)
    probs = policy_probs_along(model, engine.encode(PROMPTS[:1])[0],
                               [r.tokens for r in full], temperature)
    emitted = torch.tensor([r.tokens for r in full])
    torch.testing.assert_close(torch.tensor([r.logprobs for r in full], dtype=torch.float64),
                               probs.gather(-1, emitted[..., None]).squeeze(-1).log(),
                               atol=1e-9, rtol=0)
    for pos in (1, 2):
        observed = torch.bincount(emitted[:, pos], minlength=probs.shape[-1]).double()
        expected, var = probs[:, pos].sum(0), (probs[:, pos] * (1 - probs[:, pos])).sum(0)
        big = expected >= 5                     # the rest pooled into one bin
        stat = ((observed[big] - expected[big]) ** 2 / var[big]).sum() \
            + (observed[~big].sum() - expected[~big].sum()) ** 2 / var[~big].sum()
        df = int(big.sum())
        assert df >= 3 and stat < df + 5 * (2 * df) ** 0.5, (pos, float(stat), df)
    steps = [a for r in res.requests for a in r.accepted_per_step]
    assert sum(steps) / len(steps) > 1
