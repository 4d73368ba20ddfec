"""The prune plan table (compress.plan_table): counts, predicted throughput and importance kept,
by hand on a tiny config and against the model that pruning really builds."""
import math

import pytest
import torch

from workbench.compress.evaluate import count_params
from workbench.compress.plan import PrunePlan, flops_per_token, param_count
from workbench.compress.plan_table import importance_kept, plan_label, plan_table
from workbench.compress.prune import prune
from workbench.compress.scores import UnitScores

from .helpers.models import tiny_model
from .helpers.tables import PLAN, hand_scores, tiny_config


def test_importance_kept_by_hand():
    kept = importance_kept(tiny_config(), PLAN, hand_scores(), layer_scores=[1.0, -1.0, 3.0])
    # heads: best one per group of layers 0 and 2 = (2 + 4) + (4 + 2) of 10 + 4 + 6
    # neurons: top 3 of layers 0 and 2 = 15 + 9 of 21 + 6 + 9; channels: top 4 = 26 of 36
    # layers: 0 and 2 of scores [1, -1 -> 0, 3] = 4 of 4
    assert kept == pytest.approx({"heads": 12 / 20, "neurons": 24 / 36, "channels": 26 / 36,
                                  "layers": 1.0})
    equal = importance_kept(tiny_config(), PLAN, hand_scores())
    assert equal["layers"] == pytest.approx(2 / 3)


def test_plan_table_rows():
    config = tiny_config()
    full = PrunePlan.full(config)
    table = plan_table(config, hand_scores(), {"teacher": full, "small": PLAN},
                       layer_scores=[1.0, -1.0, 3.0], teacher_tok_s=300.0)
    assert table["label"].tolist() == ["teacher", "small"]
    teacher, small = table.iloc[0], table.iloc[1]
    assert teacher["kind"] == "full" and small["kind"] == "both"
    assert teacher["params_ratio"] == 1.0 and teacher["importance_kept"] == pytest.approx(1.0)
    assert small["params"] == param_count(config, PLAN)
    assert small["params_ratio"] == pytest.approx(param_count(config, PLAN) / param_count(config))
    ratio = flops_per_token(config) / flops_per_token(config, PLAN)
    assert small["flops_ratio"] == pytest.approx(1 / ratio)
    assert small["predicted_speedup"] == pytest.approx(ratio)
    assert small["predicted_tok_s"] == pytest.approx(300.0 * ratio)
    assert small["layers"] == "0,2" and small["num_layers"] == 2
    assert small["source_layers"] == teacher["source_layers"] == 3  # "2 of 3 layers"
    assert small["importance_kept"] == pytest.approx((12 / 20 + 24 / 36 + 26 / 36 + 1.0) / 4)


def test_without_a_measured_teacher_only_relative_predictions():
    table = plan_table(tiny_config(), hand_scores(), [PLAN])
    assert math.isnan(table["predicted_tok_s"].iloc[0])
    assert table["predicted_speedup"].iloc[0] > 1
    assert table["label"].iloc[0] == plan_label(PLAN, 3) == "2L[0,2] h4 m3 q1"


def test_params_match_the_model_that_prune_builds(tokenizer):
    model = tiny_model("llama", tokenizer, layers=3)
    g = torch.Generator().manual_seed(0)
    c = model.config
    scores = UnitScores(torch.rand(3, c.num_attention_heads, generator=g),
                        torch.rand(3, c.intermediate_size, generator=g),
                        torch.rand(c.hidden_size, generator=g))
    plans = [PrunePlan((0, 1, 2), 32, 64, 1), PrunePlan((0, 2), 64, 128, 2)]
    table = plan_table(model, scores, plans)
    assert table["params"].tolist() == [count_params(prune(model, p, scores)) for p in plans]
    assert table["kind"].tolist() == ["width", "depth"]
    assert table["label"].tolist() == ["3L h32 m64 q1", "2L[0,2] h64 m128 q2"]
    depth = table.iloc[1]  # keeps every unit of its layers: two thirds of each axis
    assert depth[["kept_heads", "kept_neurons", "kept_layers"]].tolist() == pytest.approx(
        [float(scores.heads[[0, 2]].sum() / scores.heads.sum()),
         float(scores.neurons[[0, 2]].sum() / scores.neurons.sum()), 2 / 3])
    assert depth["kept_channels"] == pytest.approx(1.0)


def test_bad_input_is_named():
    config = tiny_config()
    with pytest.raises(ValueError, match="no plans given"):
        plan_table(config, hand_scores(), [])
    with pytest.raises(TypeError, match="PrunePlan objects; got str"):
        plan_table(config, hand_scores(), ["3L h8"])
    with pytest.raises(ValueError, match=r"labels \['2L\[0,2\] h4 m3 q1'\] occur more than once"):
        plan_table(config, hand_scores(), [PLAN, PLAN])
    with pytest.raises(ValueError, match=r"teacher_tok_s .*must be None \(relative predictions only\) or a finite number > 0, got -1"):
        plan_table(config, hand_scores(), [PLAN], teacher_tok_s=-1)
    with pytest.raises(TypeError, match="UnitScores"):
        plan_table(config, {"heads": None}, [PLAN])
    with pytest.raises(ValueError, match="layer_scores has 2 entries; the model has 3"):
        plan_table(config, hand_scores(), [PLAN], layer_scores=[1.0, 2.0])
    with pytest.raises(ValueError, match="heads_per_group is 3"):
        plan_table(config, hand_scores(), [PrunePlan((0,), 4, 3, 3)])
