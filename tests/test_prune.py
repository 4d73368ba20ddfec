"""Structured pruning (compress.plan / prune / search): exact slicing against zeroed references,
HF round trips in a fresh process, decoding and drafting with pruned models, counts, search."""
import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoConfig, GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

from workbench.compress.plan import PrunePlan, flops_per_token, head_dim, param_count
from workbench.compress.prune import kept_units, prune
from workbench.compress.scores import UnitScores
from workbench.compress.search import enumerate_plans, rank_candidates
from workbench.models import EMBEDDED
from workbench.rollout import RolloutEngine
from workbench.speculative import LMDrafter

from .helpers.models import ARCHS, PROMPTS, hf_greedy, tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: a second intra-op thread only adds a hand-off to every matmul,
    and when the other core is busy each hand-off waits for it (10x-1000x slower steps)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_scores(config, seed=0) -> UnitScores:
    g = torch.Generator().manual_seed(seed)
    return UnitScores(torch.rand(config.num_hidden_layers, config.num_attention_heads, generator=g),
                      torch.rand(config.num_hidden_layers, config.intermediate_size, generator=g),
                      torch.rand(config.hidden_size, generator=g))


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def ids_for(tokenizer):
    return torch.tensor([tokenizer.encode("a12 b33 c4 d5 e6?")] * 2)


def variant(arch, tokenizer, tied, layers=3):
    """A tiny model of ``arch`` with tied or untied embeddings."""
    model = tiny_model(arch, tokenizer, layers=layers)
    if model.config.tie_word_embeddings == tied:
        return model
    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = tied
    torch.manual_seed(1)
    return type(model)(config).to(torch.float64).eval()


# ---- keep everything ---------------------------------------------------------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_full_plan_reproduces_the_model_exactly(arch, tokenizer):
    model = tiny_model(arch, tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruned = prune(model, PrunePlan.full(model.config), random_scores(model.config))
    ids = ids_for(tokenizer)
    assert torch.equal(logits(pruned, ids), logits(model, ids))
    assert type(pruned) is type(model) and pruned is not model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(pruned.parameters(),
                                                           model.parameters()))


# ---- slicing is exact: pruned == original with the dropped units zeroed --------------------
def _kept_mean_norm(norm, channels):
    """HF's RMSNorm arithmetic with the variance taken over the kept channels only."""
    def forward(x):
        h = x.to(torch.float32)
        variance = h[..., channels].pow(2).mean(-1, keepdim=True)
        return norm.weight * (h * torch.rsqrt(variance + norm.variance_epsilon)).to(x.dtype)
    norm.forward = forward


def _dropped(kept, size):
    mask = torch.ones(size, dtype=torch.bool)
    mask[kept] = False
    return mask.nonzero().flatten()


@torch.no_grad()
def zeroed_reference(model, plan, kept):
    """The model with every dropped unit silenced: dropped layers and heads write nothing,
    dropped neurons feed nothing, dropped channels stay zero in the residual stream and the
    hidden-size norms average over the kept channels."""
    ref = copy.deepcopy(model)
    cfg, decoder = ref.config, ref.get_decoder()
    d = head_dim(cfg)
    off = _dropped(kept.channels, cfg.hidden_size)
    decoder.embed_tokens.weight[:, off] = 0
    for i, layer in enumerate(decoder.layers):
        o, down = layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight
        if i not in plan.layers:
            o.zero_(), down.zero_()
            continue
        j = plan.layers.index(i)
        for h in _dropped(kept.heads[j], cfg.num_attention_heads):
            o[:, h * d:(h + 1) * d] = 0
        down[:, _dropped(kept.neurons[j], cfg.intermediate_size)] = 0
        o[off], down[off] = 0, 0
    if plan.hidden_size < cfg.hidden_size:
        for layer in decoder.layers:
            _kept_mean_norm(layer.input_layernorm, kept.channels)
            _kept_mean_norm(layer.post_attention_layernorm, kept.channels)
        _kept_mean_norm(decoder.norm, kept.channels)
    return ref


def _plan(config, axis):
    full = PrunePlan.full(config)
    group = config.num_attention_heads // config.num_key_value_heads
    changes = {"heads": dict(heads_per_group=max(1, group // 2)),
               "neurons": dict(intermediate_size=96),
               "layers": dict(layers=(0, 2)),
               "channels": dict(hidden_size=40)}
    if axis == "all":
        return PrunePlan(**{**full.__dict__, **{k: v for c in changes.values()
                                                for k, v in c.items()}})
    return PrunePlan(**{**full.__dict__, **changes[axis]})


AXES = ["heads", "neurons", "layers", "channels", "all"]


@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("arch", list(ARCHS))
def test_pruning_equals_the_zeroed_original(arch, axis, tokenizer):
    model = tiny_model(arch, tokenizer, layers=3)
    plan, scores = _plan(model.config, axis), random_scores(model.config, seed=3)
    kept = kept_units(model.config, plan, scores)
    pruned = prune(model, plan, scores)
    ids = ids_for(tokenizer)
    want = logits(zeroed_reference(model, plan, kept), ids)
    torch.testing.assert_close(logits(pruned, ids), want, rtol=1e-12, atol=1e-12)
    assert pruned.config.num_hidden_layers == len(plan.layers)
    assert [layer.self_attn.layer_idx for layer in pruned.get_decoder().layers] == \
        list(range(len(plan.layers)))


def test_kept_units_are_the_best_scored_in_original_order(tokenizer):
    config = tiny_model("llama", tokenizer).config  # 4 heads in 2 KV groups
    scores = UnitScores(torch.tensor([[1., 3., 2., 0.], [0., 1., 5., 4.]]),
                        torch.arange(128.).flip(0).expand(2, -1), torch.arange(64.))
    kept = kept_units(config, PrunePlan((1,), 62, 100, 1), scores)
    assert kept.heads[0].tolist() == [1, 2]  # best of heads {0, 1} and of {2, 3}, layer 1
    assert kept.neurons[0].tolist() == list(range(100))
    assert kept.channels.tolist() == list(range(2, 64))
    unscored = kept_units(config, PrunePlan((0, 1), 64, 128, 1))
    assert unscored.heads[1].tolist() == [0, 2]


def test_layer_types_follow_the_kept_layers(tokenizer):
    model = tiny_model("qwen2_sw", tokenizer, layers=3)  # full, sliding, sliding
    for layers, types in [((1, 2), ["sliding_attention"] * 2),
                          ((0, 2), ["full_attention", "sliding_attention"])]:
        pruned = prune(model, PrunePlan(layers, 64, 128, 2))
        assert pruned.config.layer_types == types
        assert pruned.config.max_window_layers == types.count("full_attention")
        assert [a.self_attn.sliding_window for a in pruned.get_decoder().layers] == \
            [8 if t == "sliding_attention" else None for t in types]


# ---- HF in and out ---------------------------------------------------------------------------
RELOAD = textwrap.dedent("""
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    out = {}
    for folder in json.loads(sys.argv[1]):
        want = torch.load(f"{folder}/expected.pt")
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
        with torch.no_grad():
            got = model(want["ids"]).logits
        emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        out[folder] = {"equal": bool(torch.equal(got, want["logits"])), "tied": emb is head,
                       "layers": model.config.num_hidden_layers,
                       "hidden": model.config.hidden_size}
    print(json.dumps(out))
""")


def test_pruned_models_round_trip_in_a_fresh_process(tokenizer, tmp_path):
    ids, expected = ids_for(tokenizer), {}
    for arch in ("llama", "qwen2", "qwen3", "mistral"):
        for tied in (False, True):
            model = variant(arch, tokenizer, tied)
            pruned = prune(model, _plan(model.config, "all"), random_scores(model.config))
            folder = str(tmp_path / f"{arch}_{tied}")
            pruned.save_pretrained(folder)
            torch.save({"ids": ids, "logits": logits(pruned, ids)}, f"{folder}/expected.pt")
            expected[folder] = {"equal": True, "tied": tied, "layers": 2, "hidden": 40}
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", RELOAD, json.dumps(list(expected))],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected


# ---- pruned models run in the rollout engine and draft for their teacher --------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2_sw", "qwen3"])  # lean and HF forwards
def test_pruned_model_decodes_and_drafts_losslessly(arch, tokenizer):
    teacher = tiny_model(arch, tokenizer, layers=3)
    student = prune(teacher, PrunePlan((0, 2), 48, 64, 1), random_scores(teacher.config))
    prompts = PROMPTS[:3]
    own = RolloutEngine(student, tokenizer).rollout(prompts, max_new_tokens=10, progress=False)
    assert own.tokens == hf_greedy(student, tokenizer, prompts, 10)
    engine = RolloutEngine(teacher, tokenizer)
    plain = engine.rollout(prompts, max_new_tokens=12, progress=False)
    sd = engine.rollout(prompts, max_new_tokens=12, progress=False,
                        drafter=LMDrafter(student, tokenizer), spec_k=3)
    assert sd.tokens == plain.tokens


# ---- counts -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_param_count_equals_numel(arch, tokenizer):
    for tied in (False, True):
        model = variant(arch, tokenizer, tied)
        for plan in (None, _plan(model.config, "all"), _plan(model.config, "heads")):
            built = model if plan is None else prune(model, plan)
            assert param_count(model.config, plan) == sum(p.numel() for p in built.parameters())


def test_param_count_with_biases(tokenizer):
    model = tiny_model("llama", tokenizer, layers=3)
    config = copy.deepcopy(model.config)
    config.attention_bias, config.mlp_bias = True, True
    biased = type(model)(config).to(torch.float64)
    plan = _plan(config, "all")
    assert param_count(config, plan) == sum(p.numel() for p in prune(biased, plan).parameters())


def test_flops_of_a_depth_half_plan():
    config = AutoConfig.from_pretrained(EMBEDDED["default"])
    half = PrunePlan((0, 1, 5), 256, 512, 4)
    lm_head = 2 * config.hidden_size * config.vocab_size  # the same in both: full width
    assert (flops_per_token(config, half) - lm_head) / (flops_per_token(config) - lm_head) == 0.5
    total = flops_per_token(config, half) / flops_per_token(config)
    assert 0.5 < total < 0.6  # the LM head stays
    assert flops_per_token(config, context=1024) > flops_per_token(config, context=512)


# ---- search -----------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [0.5, 0.25])
def test_enumeration_finds_plans_near_the_target(target):
    config = AutoConfig.from_pretrained(EMBEDDED["default"])
    table = enumerate_plans(config, target)
    assert len(table) >= 8
    assert table["params_ratio"].between(0.95 * target, 1.05 * target).all()
    assert {"width", "both"} <= set(table["kind"])
    row = table.iloc[0]
    assert row["params"] == param_count(config, row["plan"])
    assert (table["hidden_size"] % 8 == 0).all() and (table["intermediate_size"] % 8 == 0).all()
    depth = enumerate_plans(config, 0.5, layer_scores=[5, 1, 2, 3, 4, 6])
    assert [p.layers for p in depth.loc[depth["kind"] == "depth", "plan"]] == [(0, 4, 5)]


def test_rank_candidates_sorts_by_score():
    config = AutoConfig.from_pretrained(EMBEDDED["default"])
    table = enumerate_plans(config, 0.5).head(5)
    ranked = rank_candidates(table, lambda plan: plan.hidden_size, column="loss")
    assert ranked["loss"].is_monotonic_increasing
    assert ranked["loss_rank"].tolist() == [1, 2, 3, 4, 5]
    best = rank_candidates(ranked, lambda plan: plan.hidden_size, "acc", higher_is_better=True)
    assert best["acc"].is_monotonic_decreasing and "loss_rank" in best


# ---- errors ------------------------------------------------------------------------------------
def test_plan_errors_name_the_field(tokenizer):
    config = tiny_model("llama", tokenizer).config  # 4 heads, 2 KV heads, 2 layers
    cases = [(PrunePlan((0,), 64, 128, 3), r"heads_per_group is 3.*accepted: 1\.\.2"),
             (PrunePlan((0,), 80, 128, 1), r"hidden_size 80 is larger than the source's 64"),
             (PrunePlan((0,), 64, 256, 1), r"intermediate_size 256 is larger"),
             (PrunePlan((0, 2), 64, 128, 1), r"indices \[2\] out of range; accepted: 0\.\.1"),
             (PrunePlan((0,), 62, 128, 2), r"hidden_size 62 is not a multiple of the pruned "
                                           r"model's 4 query heads.*LlamaConfig")]
    for plan, message in cases:
        with pytest.raises(ValueError, match=message):
            plan.check(config)
    for kwargs, message in [(dict(layers=()), "empty"),
                            (dict(heads_per_group=0), "heads_per_group"),
                            (dict(layers=(1, 0)), "ascending and unique")]:
        with pytest.raises(ValueError, match=message):
            PrunePlan(**{**dict(layers=(0,), hidden_size=64, intermediate_size=128,
                                heads_per_group=1), **kwargs})
    with pytest.raises(ValueError, match="UnitScores.channels has shape"):
        prune(tiny_model("llama", tokenizer), PrunePlan.full(config),
              UnitScores(torch.rand(2, 4), torch.rand(2, 128), torch.rand(63)))


def test_unsupported_architectures_are_refused(tokenizer):
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2))
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, intermediate_size=64))
    for model, name in ((gpt2, "gpt2"), (neox, "gpt_neox")):
        with pytest.raises(ValueError, match=f"model_type '{name}'.*llama, qwen2, qwen3, mistral"):
            prune(model, PrunePlan((0,), 16, 16, 1))


def test_search_errors():
    config = AutoConfig.from_pretrained(EMBEDDED["default"])
    with pytest.raises(ValueError, match="larger than the source's 3371264 parameters"):
        enumerate_plans(config, 1.2)
    with pytest.raises(ValueError, match=r"target 2000 \(2000 parameters\).*nearest counts are "
                                         r"None below and \d+ above"):
        enumerate_plans(config, 2000)  # the smallest plan (1 layer, widths 8) has ~3,900
    with pytest.raises(ValueError, match="layer_scores has 2 entries"):
        enumerate_plans(config, 0.5, layer_scores=[1, 2])


def test_every_enumerated_plan_builds_a_loadable_config(tokenizer):
    """transformers' LlamaConfig refuses a hidden size its heads do not divide: the search
    offers only plans that build."""
    model = tiny_model("llama", tokenizer)
    table = enumerate_plans(model.config, 0.5, tolerance=0.2, multiple=4, steps=8)
    assert len(table) >= 8
    for plan in table["plan"]:
        prune(model, plan)  # raises if the config is invalid
