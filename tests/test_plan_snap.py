"""Targets snap to feasible plans: a small model has few plans, so pick_plan, the architecture
search and width_against_depth take the nearest one and print one line saying so; a target no
plan can meet is refused with the range the feasible plans span."""
from dataclasses import replace

import pytest
import torch

from tests.helpers.models import tiny_model
from workbench.compress.data import distill_data
from workbench.compress.distill import DistillConfig
from workbench.compress.importance import calibration_batches
from workbench.compress.iterative import pick_plan
from workbench.compress.plan import PrunePlan, param_count
from workbench.compress.search import depth_layers, enumerate_plans
from workbench.compress.studies import architecture_search, width_against_depth


def depth_ratios(config) -> dict[int, float]:
    """Share of the parameters each depth plan keeps, by layers kept, computed plan by plan."""
    full, n = PrunePlan.full(config), config.num_hidden_layers
    return {k: param_count(config, replace(full, layers=depth_layers(k, n))) / param_count(config)
            for k in range(1, n)}


@pytest.mark.parametrize("layers", [4, 6])
def test_a_depth_target_snaps_to_the_nearest_layer_count(layers, tokenizer, capsys):
    config = tiny_model("llama", tokenizer, layers=layers).config
    ratios = depth_ratios(config)
    keep = min(ratios, key=lambda k: abs(ratios[k] - 0.5))
    assert abs(ratios[keep] - 0.5) > 0.05 * 0.5  # no depth plan within the old 5%
    plan = pick_plan(config, 0.5, "depth")
    assert plan == PrunePlan(depth_layers(keep, layers), 64, 128, 2)
    assert capsys.readouterr().out == (
        f"depth plan: asked 0.5 of the parameters, got {ratios[keep]:.2f} ({keep} of {layers} "
        "layers, hidden 64, MLP 128, 2 of 2 query heads per KV group)\n")
    source = param_count(config)
    assert pick_plan(config, source // 2, "depth") == plan  # a count snaps the same way
    assert f"asked {source // 2:,} parameters (0.50), got" in capsys.readouterr().out


@pytest.mark.parametrize("layers", [4, 6])
def test_a_width_target_takes_the_nearest_width_plan(layers, tokenizer, capsys):
    config = tiny_model("llama", tokenizer, layers=layers).config
    table = enumerate_plans(config, 0.3, tolerance=0.99)
    nearest = table[table["kind"] == "width"].iloc[0]
    assert pick_plan(config, 0.3, "width") == nearest["plan"]
    out = capsys.readouterr().out
    assert out.startswith(f"width plan: asked 0.3 of the parameters, got "
                          f"{nearest['params_ratio']:.2f} ({layers} of {layers} layers")
    assert out.count("\n") == 1


def test_an_impossible_target_is_refused_with_the_feasible_range(tokenizer):
    config = tiny_model("llama", tokenizer, layers=4).config
    ratios = depth_ratios(config)
    span = f"{min(ratios.values()):.2f}-{max(ratios.values()):.2f}"
    for target in (0.0, 1.0, 1.2, -0.5, 10 ** 9, True, "half"):
        with pytest.raises(ValueError, match=rf"target {target!r} is not accepted: give a "
                                             rf"fraction .* in \(0, 1\).*feasible depth plans "
                                             rf"keep {span} of the parameters"):
            pick_plan(config, target, "depth")
    one_layer = tiny_model("llama", tokenizer, layers=1).config
    with pytest.raises(ValueError, match=r"this model \(1 layer, hidden 64\) has no depth plan; "
                                         r"plans it has keep \(share of parameters\): width "
                                         r"0\.\d\d-0\.\d\d"):
        pick_plan(one_layer, 0.5, "depth")


@pytest.fixture(scope="module")
def four_layers(tokenizer):
    teacher = tiny_model("llama", tokenizer, layers=4, dtype=torch.float32)
    calibration = calibration_batches(tokenizer, num=8, batch_size=4, max_len=48)
    train, held_out = distill_data(tokenizer, num=128, eval_num=4, batch_size=4, max_len=48)
    config = DistillConfig.flat(horizon=1, batch_size=4, eval_every=0, progress=False)
    return teacher, calibration, train, held_out, config


def test_the_search_centres_on_the_nearest_plan_when_none_is_near_the_target(four_layers,
                                                                            capsys):
    teacher, calibration, train, held_out, config = four_layers
    ratios = depth_ratios(teacher.config)
    search = architecture_search(teacher, 0.5, calibration, train, held_out, top=1,
                                 config=config, kinds=("depth",), progress=False)
    assert capsys.readouterr().out == (
        "architecture search: no plan within 5% of the target; searching around the nearest: "
        f"depth plan: asked 0.5 of the parameters, got {ratios[2]:.2f} (2 of 4 layers, hidden "
        "64, MLP 128, 2 of 2 query heads per KV group)\n")
    assert search["num_layers"].tolist() == [2] and search["kind"].tolist() == ["depth"]
    with pytest.raises(ValueError, match=r"has no width plan within FLOPs ratio 0\.01; plans "
                                         r"it has keep"):
        architecture_search(teacher, 0.5, calibration, train, held_out, kinds=("width",),
                            max_flops_ratio=0.01, progress=False)


def test_width_against_depth_runs_on_a_4_layer_model_at_the_default_target(four_layers, capsys):
    teacher, calibration, train, held_out, config = four_layers
    table, stages = width_against_depth(teacher, 0.5, calibration, train, held_out, config,
                                        progress=False)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["width plan", "depth plan"]
    assert "(2 of 4 layers," in out[1]
    assert len(stages["depth"].plan.layers) == 2 and len(stages["width"].plan.layers) == 4
    assert len(table) == 4 and table["lm_loss"].notna().all()
