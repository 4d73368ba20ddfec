"""Notebook 07's tables, built by the package from hand-made stages: the lineage of every seed's
stages, the models accuracy is measured on, and the speed table with the accuracy over seeds
in place of its first seed's (``compress.iterative``, ``compress.retraining_summary``)."""
import types

import pandas as pd

from workbench.compress.iterative import lineage_table, seeded_models
from workbench.compress.retraining_summary import with_accuracy_over_seeds


def _stage(name, params, seed):
    return types.SimpleNamespace(name=name, model=f"{name}@{seed}", plan=f"plan {name}",
                                 params=params, loss_after_prune=1.0 + seed,
                                 loss_after_distill=0.5 + seed)


RUNS = {seed: [_stage("w50", 50, seed), _stage("w25", 25, seed)] for seed in (0, 1)}


def test_the_lineage_has_a_row_per_stage_and_seed():
    t = lineage_table(RUNS, params_teacher=100)
    assert list(t.columns) == ["model", "seed", "plan", "params", "params_ratio",
                               "loss_after_prune", "loss_after_distill"]
    assert t[["model", "seed"]].values.tolist() == [["w50", 0], ["w25", 0], ["w50", 1],
                                                    ["w25", 1]]
    assert t["params_ratio"].tolist() == [0.5, 0.25, 0.5, 0.25]
    assert t["plan"].tolist()[:2] == ["plan w50", "plan w25"]
    assert t["loss_after_distill"].tolist() == [0.5, 0.5, 1.5, 1.5]


def test_the_models_of_every_seed_follow_the_teacher():
    models = seeded_models("teacher model", RUNS)
    assert list(models) == [("teacher", 0), ("w50", 0), ("w25", 0), ("w50", 1), ("w25", 1)]
    assert models["teacher", 0] == "teacher model" and models["w25", 1] == "w25@1"


def test_the_accuracy_over_seeds_replaces_the_first_seeds():
    table = pd.DataFrame({"model": ["teacher", "w50", "w25"], "params": [100, 50, 25],
                          "accuracy": [0.9, 0.1, 0.0], "tok_s_b1": [10.0, 15.0, 20.0]})
    accuracy = pd.DataFrame({"name": ["teacher", "w50", "w25"], "accuracy": [0.8, 0.6, 0.4],
                             "accuracy_sd": [0.0, 0.05, 0.1], "accuracy_lo": [0.7, 0.5, 0.3],
                             "accuracy_hi": [0.9, 0.7, 0.5], "seeds": [1, 2, 2]})
    t = with_accuracy_over_seeds(table, accuracy)
    assert list(t.columns) == ["model", "params", "tok_s_b1", "accuracy", "accuracy_sd",
                               "accuracy_lo", "accuracy_hi", "seeds"]
    assert t["model"].tolist() == ["teacher", "w50", "w25"]
    assert t["accuracy"].tolist() == [0.8, 0.6, 0.4] and t["seeds"].tolist() == [1, 2, 2]
    assert t["tok_s_b1"].tolist() == [10.0, 15.0, 20.0]
