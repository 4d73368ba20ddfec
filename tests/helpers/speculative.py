"""Speculative-decoding test pieces: peaky models, joint-distribution sampling and chi-square
checks, recording drafters, reference EAGLE drafts, a schedule of one plan."""
import math

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from workbench.rollout import RolloutEngine
from workbench.rollout.forward import policy_forward
from workbench.rollout.schedule import Schedule, StepPlan


def peaky_llama(seed, vocab=5):
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # far from uniform, so a wrong rule shows
    return model


def chi_square(counts: dict, probs: dict) -> tuple[float, int]:
    """Pearson's statistic over cells expected >= 5 (the rest pooled) and its degrees of freedom."""
    n = sum(counts.values())
    big = [c for c in probs if probs[c] * n >= 5]
    stat = sum((counts.get(c, 0) - probs[c] * n) ** 2 / (probs[c] * n) for c in big)
    rest_p = 1 - sum(probs[c] for c in big)
    rest_n = n - sum(counts.get(c, 0) for c in big)
    cells = len(big)
    if rest_p * n >= 5:
        stat += (rest_n - rest_p * n) ** 2 / (rest_p * n)
        cells += 1
    return stat, cells - 1


def chi2_quantile(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def joint_3(model, prompt, vocab=5):
    seqs = [[a, b, c] for a in range(vocab) for b in range(vocab) for c in range(vocab)]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + s[:2] for s in seqs])).logits, -1)
    n = len(prompt)
    out = {}
    for i, s in enumerate(seqs):
        out[tuple(s)] = float(sum(logp[i, n - 1 + j, s[j]] for j in range(3)).exp())
    return out


def sample_joint(policy, drafter, prompt, n, seed, **overrides):
    """``n`` responses of 3 tokens to ``prompt`` by speculative sampling with ``drafter``
    (config ``overrides`` on top): how often each came, and the drafts' acceptance rate."""
    engine = RolloutEngine(policy, NoEosTokenizer())
    res = engine.rollout([prompt], progress=False, drafter=drafter, max_new_tokens=3,
                         temperature=1.0, samples_per_prompt=n, seed=seed, spec_k=2,
                         spec_mode="speculative", **overrides)
    counts = {}
    for t in res.tokens:
        counts[tuple(t)] = counts.get(tuple(t), 0) + 1
    t = res.timeline.requests
    return counts, t["accepted"].sum() / t["drafted"].sum()


def recording(drafter):
    """The drafter, keeping every round's committed sequences and drafts in ``.rounds``."""
    inner, drafter.rounds = drafter.draft, []

    def draft(ctx, k):
        seqs = ctx.sequences
        tokens, logq = inner(ctx, k)
        drafter.rounds += [(s, t) for s, t in zip(seqs, tokens.tolist())]
        return tokens, logq

    drafter.draft = draft
    return drafter


def reference_eagle_drafts(policy, head, seq, k):
    """The chain an EAGLE head should draft after ``seq``, recomputed from scratch each depth
    on the whole sequence: no cache, no rotary table, full causal mask."""
    from workbench.rollout.forward import causal_mask_4d
    ids = torch.tensor([seq])
    pos = torch.arange(len(seq))[None]
    _, states = policy_forward(policy, lean=False)(ids, pos, torch.ones_like(ids), pos,
                                                   DynamicCache())
    decoder, lm_head = policy.get_decoder(), policy.get_output_embeddings()
    feats, toks, drafts = states[0, :-1], ids[0, 1:], []
    for _ in range(k):
        n = len(toks)
        emb = policy.get_input_embeddings()(toks)[None]
        out = head(emb, feats[None], causal_mask_4d(torch.ones(1, n, dtype=torch.long), n, emb.dtype),
                   decoder.rotary_emb(emb, torch.arange(n)[None]))
        drafts.append(int(lm_head(decoder.norm(out[0, -1])).argmax()))
        feats, toks = torch.cat([feats, out[0, -1:]]), torch.cat([toks, torch.tensor(drafts[-1:])])
    return drafts


class NoEosTokenizer:
    """The three attributes the engine needs, for a vocabulary of bare ids."""

    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class Always(Schedule):
    """Every decode step the same plan (a plugin arm's, say)."""

    def __init__(self, plan: StepPlan):
        self.step = plan

    def plan(self, batch_size, worker):
        return self.step
