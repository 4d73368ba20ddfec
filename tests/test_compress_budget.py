"""The token-budget study (Minitron's headline): budgets as fractions of the teacher's
pretraining tokens, counted as the teacher's recipe counted them; runs that stop at their
budget; a table resumable per row; the summary's intervals and the budget that reaches the
teacher."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers.models import tiny_model
from workbench.compress.distill import Distiller
from workbench.compress.budget import (COLUMNS, batch_tokens, budget_batches, budget_study,
                                       check_budgets, steps_for, teacher_tokens)
from workbench.compress.budget_summary import budget_summary
from workbench.compress.data import sequences_from
from workbench.compress.iterative import pick_plan
from workbench.compress.prune import prune
from workbench.compress.stats import summarize
from workbench.tasks import HELDOUT_SEED, get_problems


def _batch(tokens: int, width: int = 10) -> tuple:
    """An ``(ids, mask, scored)`` batch of one row holding ``tokens`` real tokens."""
    mask = torch.zeros(1, width, dtype=torch.long)
    mask[0, :tokens] = 1
    return torch.zeros(1, width, dtype=torch.long), mask, mask.clone()


def test_steps_stop_at_the_first_batch_that_reaches_the_budget():
    batches = [_batch(5), _batch(7), _batch(3)]
    assert [batch_tokens(b) for b in batches] == [5, 7, 3]  # padding not counted
    assert steps_for(batches, 12) == (2, 12)
    assert steps_for(batches, 13) == (3, 15)
    assert steps_for(batches, 1) == (1, 5)
    assert steps_for(batches, 20) == (4, 20)   # cycled past the end


def test_batches_are_the_teachers_padded_batches_of_similar_length(tokenizer):
    seqs, starts = sequences_from("running_sum", 64, tokenizer)
    batches = budget_batches(seqs, starts, 256, seed=0, pad=tokenizer.pad_token_id)
    assert sum(batch_tokens(b) for b in batches) == sum(len(s) for s in seqs)  # each text once
    for ids, mask, scored in batches:
        assert ids.numel() <= 256 or len(ids) == 1
        assert (scored <= mask).all() and int(scored.sum()) < int(mask.sum())  # prompts unscored
    other = budget_batches(seqs, starts, 256, seed=1, pad=tokenizer.pad_token_id)
    assert [batch_tokens(b) for b in batches] != [batch_tokens(b) for b in other]


def test_teacher_tokens_come_from_provenance_else_the_parameter(tmp_path):
    (tmp_path / "provenance.json").write_text(json.dumps({"train_tokens": 1234}))
    assert teacher_tokens(tmp_path) == 1234 == teacher_tokens(tmp_path, 1234)
    assert teacher_tokens(tmp_path / "elsewhere", 99) == 99
    with pytest.raises(ValueError, match="teacher_tokens is None and .*provenance.json does "
                                         "not exist"):
        teacher_tokens(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="teacher_tokens=5 disagrees"):
        teacher_tokens(tmp_path, 5)


@pytest.mark.parametrize("budgets, bad", [([0.01, 0.0], "budget 0.0"), ([1.5], "budget 1.5"),
                                          ([-0.1], "budget -0.1"), (["0.1"], "budget '0.1'"),
                                          ([True], "budget True"), ([], r"budgets \[\]"),
                                          ([0.1, 0.1], r"budgets \[0.1, 0.1\]"),
                                          (0.1, "budgets 0.1")])
def test_bad_budgets_are_refused_by_name(budgets, bad):
    with pytest.raises(ValueError, match=bad):
        check_budgets(budgets)
    assert check_budgets([0.1, 0.01, 1]) == [0.01, 0.1, 1.0]


@pytest.fixture(scope="module")
def study(tokenizer, tmp_path_factory):
    teacher = tiny_model("llama", tokenizer, layers=2, dtype=torch.float32)
    student = prune(teacher, pick_plan(teacher.config, 0.5, "width"))
    problems = get_problems("running_sum", 3, seed=HELDOUT_SEED)
    out = tmp_path_factory.mktemp("budget") / "budget.csv"
    kw = dict(tokens=3000, tokens_per_batch=256, eval_size=4, max_len=48, max_new_tokens=4,
              progress=False)
    table = budget_study(teacher, student, tokenizer, problems, out, [0.5, 0.1], [0], **kw)
    return teacher, student, problems, out, kw, table


def test_every_method_runs_once_per_budget_and_stops_at_it(study):
    *_, table = study
    runs = table[table["method"] != "teacher"]
    assert list(table.columns) == COLUMNS
    assert sorted(zip(runs["method"], runs["budget_fraction"])) == [
        ("kd", 0.1), ("kd", 0.5), ("scratch", 0.1), ("scratch", 0.5)]
    teacher = table[table["method"] == "teacher"].iloc[0]
    assert teacher["tokens"] == 3000 and teacher["budget_fraction"] == 1.0
    for _, r in runs.iterrows():
        assert r["tokens"] >= r["budget_fraction"] * 3000  # reached ...
        assert r["steps"] >= 1 and 0 <= r["kept_step"] <= r["steps"]
        assert len(r["rewards"]) == 3 and r["accuracy"] == r["rewards"].count("1") / 3
    small, large = (runs[(runs["method"] == "kd") & (runs["budget_fraction"] == f)].iloc[0]
                    for f in (0.1, 0.5))
    assert small["steps"] < large["steps"] and small["tokens"] < large["tokens"]
    one_batch = 256  # ... by the step that crossed it: one batch holds at most this many
    assert large["tokens"] - 0.5 * 3000 < one_batch


def test_a_second_call_reruns_nothing_and_a_new_seed_only_its_rows(study, tokenizer,
                                                                   monkeypatch):
    teacher, student, problems, out, kw, table = study
    calls = []  # the method of each run trained ("kd", or "ce" for scratch)
    real = Distiller.run
    monkeypatch.setattr(Distiller, "run",
                        lambda self, *a, **k: calls.append(self.config.mode) or real(self, *a, **k))
    again = budget_study(teacher, student, tokenizer, problems, out, [0.1, 0.5], [0], **kw)
    assert calls == [] and not out.with_name("budget.state").exists()  # checkpoints gone
    pd.testing.assert_frame_equal(again, pd.read_csv(out, dtype={"rewards": str}))
    pd.testing.assert_frame_equal(again.drop(columns="rewards"), table.drop(columns="rewards"),
                                  check_dtype=False)
    more = budget_study(teacher, student, tokenizer, problems, out, [0.1], [0, 1],
                        methods=("kd",), **kw)
    assert calls == ["kd"] and len(more) == len(table) + 1


def _hand_table() -> pd.DataFrame:
    """The teacher at 0.5 on 10 problems; KD at 0.15 by 1%, 0.35 by 3% and the teacher's
    own answers by 10%; scratch far below."""
    rows = [{"method": "teacher", "budget_fraction": 1.0, "tokens": 1000, "steps": np.nan,
             "seed": 0, "lm_loss": 0.25, "rewards": "1111100000"}]
    runs = {("kd", 0.01): ["1100000000", "1000000000"], ("kd", 0.03): ["1111000000", "1110000000"],
            ("scratch", 0.01): ["0000000000", "0000000000"],
            ("scratch", 0.03): ["1000000000", "0000000000"],
            ("kd", 0.1): ["1111100000", "1111100000"]}
    for (method, fraction), rewards in runs.items():
        for seed, r in enumerate(rewards):
            rows.append({"method": method, "budget_fraction": fraction,
                         "tokens": fraction * 1000 + seed, "steps": 3 * (1 + seed), "seed": seed,
                         "lm_loss": 0.3 + 0.1 * seed, "rewards": r})
    table = pd.DataFrame(rows)
    table["accuracy"] = table["rewards"].map(lambda r: r.count("1") / len(r))
    return table


def test_summary_intervals_and_the_smallest_budget_that_reaches_the_teacher():
    table = _hand_table()
    summary, head = budget_summary(table, tolerance=0.03)
    s = summary.set_index(["method", "budget_fraction"])
    assert list(summary["budget_fraction"]) == [0.01, 0.01, 0.03, 0.03, 0.1]
    kd = s.loc[("kd", 0.03)]
    expect = summarize(np.array([[c == "1" for c in r] for r in ["1111000000", "1110000000"]],
                                dtype=float))
    assert kd["accuracy"] == pytest.approx(0.35) == expect["mean"]
    assert (kd["accuracy_lo"], kd["accuracy_hi"]) == (expect["lo"], expect["hi"])
    assert kd["accuracy_sd"] == pytest.approx(np.std([0.4, 0.3], ddof=1))
    assert kd["lm_loss"] == pytest.approx(0.35) and kd["gap"] == pytest.approx(-0.15)
    assert kd["tokens"] == 30.5 and kd["steps"] == 4.5 and kd["seeds"] == 2
    assert kd["reached"] == (kd["accuracy_hi"] >= 0.47)
    assert bool(kd["reached"]) and not s.loc[("scratch", 0.01), "reached"]
    # paired with the teacher's answers: seed 0 misses one of its hits, seed 1 two
    assert kd["gap_lo"] <= kd["gap"] <= kd["gap_hi"] <= 0  # never above the teacher
    assert kd["gap_lo"] < -0.03 and not kd["surely_within"]
    same = s.loc[("kd", 0.1)]                              # the teacher's own answers
    assert same["gap_lo"] == same["gap_hi"] == 0 and bool(same["surely_within"])
    assert head["teacher_accuracy"] == 0.5 and head["teacher_tokens"] == 1000
    first = 0.01 if s.loc[("kd", 0.01), "reached"] else 0.03
    assert head["kd_budget_reached"] == first and head["kd_target_met"]
    assert head["kd_budget_surely_within"] == 0.1
    # scratch's 0.03 interval (one hit in 20) stays below 0.47: never reached
    assert head["scratch_budget_reached"] is None and head["scratch_target_met"] is False
    assert head["scratch_budget_surely_within"] is None
    strict = budget_summary(table, tolerance=0.0, within=0.02)[1]
    assert strict["kd_target_met"] == (strict["kd_budget_reached"] is not None
                                       and strict["kd_budget_reached"] <= 0.02)


def test_summary_needs_the_teacher_row_and_one_problem_set():
    table = _hand_table()
    with pytest.raises(ValueError, match="no 'teacher' row"):
        budget_summary(table[table["method"] != "teacher"])
    table.loc[1, "rewards"] = "11"
    with pytest.raises(ValueError, match="kd at budget 0.01 cover different numbers"):
        budget_summary(table)
