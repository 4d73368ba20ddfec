"""The compression comparisons over several seeds: a seed orders the distillation batches and
draws every initialisation; the summaries put error bars on each method and test KD against CE
on the same seeds and problems."""
import numpy as np
import pytest
import torch

from tests.helpers.models import tiny_model
from workbench.compress.data import check_seeds, distill_data, seeded_order
from workbench.compress.distill import DistillConfig
from workbench.compress.importance import calibration_batches
from workbench.compress.iterative import iterative_compress, pick_plan, seeded_pipelines
from workbench.compress.prune import prune
from workbench.compress.retraining_summary import (accuracy_over_seeds, kd_against_ce,
                                                   retraining_summary)
from workbench.compress.studies import (RETRAININGS, mean_curves, retraining_study, token_savings,
                                        width_against_depth)
from workbench.tasks import HELDOUT_SEED, get_problems


@pytest.fixture(scope="module")
def setup(tokenizer):
    teacher = tiny_model("llama", tokenizer, layers=4, dtype=torch.float32)
    calibration = calibration_batches(tokenizer, num=8, batch_size=4, max_len=48)
    train, held_out = distill_data(tokenizer, num=128, eval_num=4, batch_size=4, max_len=48)
    config = DistillConfig.flat(horizon=2, batch_size=4, eval_every=1, progress=False)
    return teacher, calibration, train, held_out, config


def test_seeded_order_is_a_permutation_drawn_from_the_seed():
    batches = list(range(10))
    a, b = seeded_order(batches, 0), seeded_order(batches, 1)
    assert sorted(a) == sorted(b) == batches and a != b and seeded_order(batches, 0) == a


def test_every_seed_runs_every_retraining_on_its_own_batch_order(setup, tokenizer):
    teacher, _, train, held_out, config = setup
    student = prune(teacher, pick_plan(teacher.config, 0.5, "width"))
    curves, models = retraining_study(teacher, student, train, held_out, config,
                                      layer_pairs=((2, 2),), seeds=[0, 1], progress=False)
    assert set(models) == {(r, s) for r in RETRAININGS for s in (0, 1)}
    first = curves[curves["step"] == 1].groupby("seed")["tokens"]
    assert (first.nunique() == 1).all()            # one seed: every run on the same batches
    assert first.first()[0] != first.first()[1]    # two seeds: two batch orders
    s0, s1 = (models[RETRAININGS[3], s] for s in (0, 1))
    assert not torch.equal(next(s0.parameters()), next(s1.parameters()))  # scratch per seed
    assert len(mean_curves(curves)) == len(curves) // 2
    assert token_savings(curves)["tokens_budget"] > 0

    problems = get_problems("running_sum", 6, seed=HELDOUT_SEED)
    table, rewards = retraining_summary(curves, models, teacher, tokenizer, held_out, problems,
                                        max_new_tokens=8)
    assert list(table["run"]) == [*RETRAININGS, "teacher"]
    assert {rewards[r].shape for r in RETRAININGS} == {(2, 6)}
    assert rewards["teacher"].shape == (1, 6)
    t = table.set_index("run")
    for r in RETRAININGS:
        assert t.loc[r, "accuracy"] == pytest.approx(rewards[r].mean())
        assert t.loc[r, "accuracy_lo"] <= t.loc[r, "accuracy"] <= t.loc[r, "accuracy_hi"]
        assert t.loc[r, "lm_loss_lo"] <= t.loc[r, "lm_loss"] <= t.loc[r, "lm_loss_hi"]
        assert t.loc[r, "seeds"] == 2
    assert t.loc["teacher", "accuracy_sd"] == 0.0
    tests = kd_against_ce(rewards)
    assert set(tests) == {f"{k}_{m}" for k in ("kd", "kd_hidden")
                          for m in ("minus_ce_accuracy", "minus_ce_accuracy_lo",
                                    "minus_ce_accuracy_hi", "beats_ce_significant")}
    assert tests["kd_minus_ce_accuracy"] == pytest.approx(
        rewards[RETRAININGS[0]].mean() - rewards[RETRAININGS[2]].mean())
    assert tests["kd_beats_ce_significant"] == (tests["kd_minus_ce_accuracy_lo"] > 0)


def test_kd_beats_ce_only_beyond_the_noise():
    ce = np.zeros((3, 400))
    ce[:, :200] = 1.0                                         # 50%
    better, level = ce.copy(), ce.copy()
    better[:, 200:280] = 1.0                                  # 70% on every seed
    level[0, 200:210], level[1, 190:200] = 1.0, 0.0           # 50% +- a few problems
    rewards = {RETRAININGS[0]: better, RETRAININGS[2]: ce}
    assert kd_against_ce(rewards)["kd_beats_ce_significant"] is True
    noise = kd_against_ce({RETRAININGS[0]: level, RETRAININGS[2]: ce})
    assert noise["kd_minus_ce_accuracy"] == 0.0 and noise["kd_beats_ce_significant"] is False
    assert -0.03 < noise["kd_minus_ce_accuracy_lo"] < 0 < noise["kd_minus_ce_accuracy_hi"] < 0.03


def test_width_against_depth_keeps_each_plan_across_seeds(setup, capsys):
    teacher, calibration, train, held_out, config = setup
    table, stages = width_against_depth(teacher, 0.5, calibration, train, held_out,
                                        config.updated(horizon=1, eval_every=0), seeds=[0, 1],
                                        progress=False)
    assert len(table) == 8 and table["lm_loss"].notna().all()
    after = table[table["stage"] == "after pruning"].groupby("kind")["lm_loss"]
    assert (after.nunique() == 1).all()            # the same pruned model on every seed
    assert len(capsys.readouterr().out.splitlines()) == 2  # each plan picked (and said) once
    assert set(stages) == {"width", "depth"}


@pytest.mark.parametrize("seeds, match", [([], "non-empty"), ([0, 0], "distinct"),
                                          ([-1], r"seeds\[0\]"), (3, "a list"),
                                          ("01", "a list")])
def test_bad_seeds_are_refused_by_name(seeds, match):
    with pytest.raises(ValueError, match=match):
        check_seeds(seeds)


def test_seeded_pipelines_cut_the_same_plans_and_distill_each_seed_apart(setup, tokenizer,
                                                                           capsys):
    teacher, calibration, train, held_out, config = setup
    runs = seeded_pipelines(teacher, (0.5, 0.25), train, held_out, calibration,
                            config=config.updated(horizon=2, eval_every=0, keep_best=False),
                            seeds=[0, 1],
                            progress=False)
    assert list(runs) == [0, 1]
    assert [s.plan for s in runs[0]] == [s.plan for s in runs[1]]
    assert len(capsys.readouterr().out.splitlines()) == 2   # each stage's plan picked once
    a, b = (runs[s][0].model for s in (0, 1))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    problems = get_problems("running_sum", 4, seed=HELDOUT_SEED)
    table, rewards = accuracy_over_seeds({(s.name, seed): s.model for seed, st in runs.items()
                                          for s in st}, tokenizer, problems, 8)
    assert list(table["name"]) == ["width_50pct", "width_25pct"]
    assert (table["seeds"] == 2).all() and rewards["width_25pct"].shape == (2, 4)
    with pytest.raises(ValueError, match="plans has 1 entries for 2 targets"):
        iterative_compress(teacher, (0.5, 0.25), train, held_out, calibration, config=config,
                           plans=[runs[0][0].plan], progress=False)


def test_the_random_ranking_is_drawn_once_per_seed(setup):
    from workbench.compress.studies import ranking_ablation
    teacher, calibration, _, held_out, _ = setup
    plan = pick_plan(teacher.config, 0.5, "width")
    one = ranking_ablation(teacher, plan, calibration, held_out,
                           progress=False).set_index("ranking")
    two = ranking_ablation(teacher, plan, calibration, held_out, progress=False,
                           seeds=[0, 1]).set_index("ranking")
    assert (one["lm_loss_sd"] == 0).all()
    assert two.loc["random", "lm_loss_sd"] > 0
    assert (two.drop(index="random")["lm_loss_sd"] == 0).all()
    assert two.drop(index="random")["lm_loss"].equals(one.drop(index="random")["lm_loss"])
