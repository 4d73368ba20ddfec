"""Friendlier plans: every public entry of ``compress`` that reads a model refuses another model
family by name before touching it; a plan names only what it changes (no layers tuple for a
width-only plan) and takes its heads as a total, checked against the KV groups; the search
grid holds exactly the shapes that load; the search ranks on the held-out set it is given."""
from dataclasses import replace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig

from tests.helpers.models import tiny_model
from workbench.compress.data import distill_data, lm_loss
from workbench.compress.depth import block_removal_scan, depth_scores
from workbench.compress.distill import DistillConfig, Distiller
from workbench.compress.importance import (calibration_batches, importance_from_batches,
                                           magnitude_scores, random_scores)
from workbench.compress.iterative import iterative_compress, pick_plan, seeded_pipelines
from workbench.compress.plan import PrunePlan, flops_per_token, head_dim, param_count
from workbench.compress.plan_table import plan_table
from workbench.compress.prune import pruned_config, prune
from workbench.compress.scores import UnitScores
from workbench.compress.search import enumerate_plans, feasible_plans, nearest_plan, snap_note
from workbench.compress.studies import architecture_search, ranking_ablation, width_against_depth

REFUSED = r"unsupported model family: model_type 'gpt2'.*llama, qwen2, qwen3, mistral"


@pytest.fixture(scope="module")
def gpt2(tokenizer):
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2,
                        n_positions=64, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).double().eval()


def entries(model, batches, scores):
    """Every public entry of compress that reads a model or a config, on ``model`` (2 layers),
    with a plan that fits a tiny model of any family here."""
    config, plan = model.config, PrunePlan((0,), 16, 16, 1)
    row = {"kind": "width", "params_ratio": 0.5, "num_layers": 2, "hidden_size": 16,
           "intermediate_size": 16, "heads_per_group": 1}
    return {
        "PrunePlan.full": lambda: PrunePlan.full(config),
        "PrunePlan.for_model": lambda: PrunePlan.for_model(model, hidden_size=16),
        "PrunePlan.check": lambda: plan.check(config),
        "PrunePlan.num_attention_heads": lambda: plan.num_attention_heads(config),
        "head_dim": lambda: head_dim(config),
        "param_count": lambda: param_count(config),
        "param_count(plan)": lambda: param_count(config, plan),
        "flops_per_token": lambda: flops_per_token(config, plan),
        "prune": lambda: prune(model, plan),
        "plan_table": lambda: plan_table(model, scores, [plan]),
        "feasible_plans": lambda: feasible_plans(config),
        "enumerate_plans": lambda: enumerate_plans(config, 0.5),
        "nearest_plan": lambda: nearest_plan(config, 0.5),
        "snap_note": lambda: snap_note(config, 0.5, row),
        "pick_plan": lambda: pick_plan(config, 0.5),
        "importance_from_batches": lambda: importance_from_batches(model, batches),
        "magnitude_scores": lambda: magnitude_scores(model),
        "random_scores": lambda: random_scores(model),
        "depth_scores": lambda: depth_scores(model, batches),
        "block_removal_scan": lambda: block_removal_scan(model, batches, 1),
        "ranking_ablation": lambda: ranking_ablation(model, plan, batches, batches),
        "architecture_search": lambda: architecture_search(model, 0.5, batches, batches,
                                                           batches),
        "width_against_depth": lambda: width_against_depth(model, 0.5, batches, batches,
                                                           batches),
        "iterative_compress": lambda: iterative_compress(model, (0.5,), batches, batches,
                                                         batches),
        "seeded_pipelines": lambda: seeded_pipelines(model, (0.5,), batches, batches, batches,
                                                     seeds=[0, 1]),
    }


def test_every_entry_refuses_another_family_by_name_before_touching_it(gpt2, tokenizer):
    batches = calibration_batches(tokenizer, num=4, batch_size=4, max_len=16)
    forwards = []
    handle = gpt2.register_forward_pre_hook(lambda *args: forwards.append(1))
    before = {k: v.clone() for k, v in gpt2.state_dict().items()}
    try:
        scores = UnitScores(torch.rand(2, 2), torch.rand(2, 128), torch.rand(32))
        for name, call in entries(gpt2, batches, scores).items():
            with pytest.raises(ValueError, match=REFUSED):
                call()
            assert forwards == [], name
    finally:
        handle.remove()
    assert all(torch.equal(v, before[k]) for k, v in gpt2.state_dict().items())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_the_llama_family_is_accepted_by_every_entry(arch, tokenizer):
    """The same entries run on each Llama-family model (the cheap ones: each returns), and a
    plan of it counts the parameters of the model it prunes to."""
    model = tiny_model(arch, tokenizer, dtype=torch.float32)
    batches = calibration_batches(tokenizer, num=4, batch_size=4, max_len=16)
    scores = magnitude_scores(model)
    light = ("PrunePlan.full", "PrunePlan.for_model", "PrunePlan.check", "head_dim",
             "param_count(plan)", "flops_per_token", "prune", "plan_table", "feasible_plans",
             "random_scores", "block_removal_scan")
    calls = entries(model, batches, scores)
    for name in light:
        calls[name]()
    plan = PrunePlan.for_model(model, hidden_size=32)
    assert param_count(model.config, plan) == sum(p.numel() for p in prune(model, plan)
                                                  .parameters())


def test_a_plan_takes_a_total_head_count_checked_against_the_kv_groups(tokenizer):
    config = tiny_model("llama", tokenizer).config  # 4 query heads in 2 KV groups, 2 layers
    assert PrunePlan.for_model(config, num_heads=2) == PrunePlan((0, 1), 64, 128, 1)
    assert PrunePlan.for_model(config, num_heads=4) == PrunePlan.full(config)
    assert (PrunePlan.for_model(config, num_heads=2)
            == PrunePlan.for_model(config, heads_per_group=1))
    for bad in (3, 1, 6, 0, 2.0, True):
        with pytest.raises(ValueError, match=rf"num_heads={bad!r} cannot be kept: each of the "
                                             r"2 KV groups keeps the same number of its 2 query "
                                             r"heads; accepted: 2, 4$"):
            PrunePlan.for_model(config, num_heads=bad)
    with pytest.raises(ValueError, match=r"num_heads=2 and heads_per_group=1; accepted: one"):
        PrunePlan.for_model(config, num_heads=2, heads_per_group=1)
    with pytest.raises(ValueError, match=r"hidden_size 80 is larger than the source's 64"):
        PrunePlan.for_model(config, hidden_size=80)  # checked against the model


def test_a_width_only_plan_names_no_layers(tokenizer):
    model = tiny_model("qwen3", tokenizer)  # MQA: 1 KV group of 4 query heads
    plan = PrunePlan.for_model(model, hidden_size=48, intermediate_size=96, num_heads=2)
    assert plan == PrunePlan((0, 1), 48, 96, 2)
    assert PrunePlan.for_model(model, layers=(1,)) == replace(PrunePlan.full(model.config),
                                                              layers=(1,))
    pruned = prune(model, plan)
    assert pruned.config.num_attention_heads == 2 and pruned.config.hidden_size == 48


def loads(config, plan) -> bool:
    """Whether transformers builds the pruned config (what ``prune`` and a reload need)."""
    try:
        pruned_config(config, plan)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("arch", ["llama", "llama_odd", "qwen3"])
def test_the_grid_holds_exactly_the_width_shapes_that_load(arch, tokenizer):
    """Every multiple of 8 of each width (and the source's own) and every head count per
    group: the grid's width plans are exactly those whose pruned config transformers builds
    (llama_odd's 4 heads in 1 KV group: 3 heads divide only 24 and 48 of the hidden sizes)."""
    config = tiny_model(arch, tokenizer).config
    group = config.num_attention_heads // config.num_key_value_heads
    full = PrunePlan.full(config)
    shapes = {(h, m, q) for h in range(8, 65, 8) for m in range(8, 129, 8)
              for q in range(1, group + 1)} - {(64, 128, group)}
    loadable = {s for s in shapes if loads(config, PrunePlan(full.layers, *s))}
    table = feasible_plans(config, kinds=("width",))
    grid = set(zip(table["hidden_size"], table["intermediate_size"], table["heads_per_group"]))
    assert grid == loadable
    if arch == "llama_odd":
        assert {h for h, _, q in grid if q == 3} == {24, 48} and len(loadable) < len(shapes)
    row = table.iloc[len(table) // 2]
    assert row["params"] == param_count(config, row["plan"])  # priced by param_count's formula
    assert row["flops_ratio"] == pytest.approx(
        flops_per_token(config, row["plan"]) / flops_per_token(config), rel=1e-12)


def test_a_grid_too_large_is_refused_with_its_size():
    big = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128)
    with pytest.raises(ValueError, match=r"holds 117,440,512 candidates .*at most 250,000: "
                                         r"pass steps"):
        feasible_plans(big)
    assert len(feasible_plans(big, steps=16, kinds=("width",))) > 0


def test_the_search_ranks_on_the_held_out_set_it_is_given(tokenizer):
    teacher = tiny_model("llama", tokenizer, layers=2)
    calibration = calibration_batches(tokenizer, num=8, batch_size=4, max_len=48)
    train, held_out = distill_data(tokenizer, num=128, eval_num=4, batch_size=4, max_len=48)
    config = DistillConfig.flat(horizon=2, batch_size=4, eval_every=0, progress=False)
    scores = importance_from_batches(teacher, calibration, progress=False).scores
    search = architecture_search(teacher, 0.5, calibration, train, held_out, top=1,
                                 config=config, scores=scores, candidates=3, kinds=("width",),
                                 progress=False)
    for row in search.itertuples():
        assert row.loss_pruned == lm_loss(prune(teacher, row.plan, scores), held_out)
    best = search.dropna(subset=["loss_retrained"]).iloc[0]
    student = prune(teacher, best["plan"], scores)
    Distiller(student, teacher, train, config).run()
    assert best["loss_retrained"] == lm_loss(student, held_out)
