"""Error paths a new user meets first: each gives a clear message, raised before any work."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from workbench.cli import main
from workbench.evaluate import EvalReport, evaluate_policy, score_rollout
from workbench.tasks import Problem, get_problems

from .conftest import tiny_model

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- evaluate

@pytest.fixture(scope="module")
def policy(tokenizer):
    return tiny_model("llama", tokenizer)


def test_evaluate_policy_on_no_problems_is_a_clear_error(policy, tokenizer):
    with pytest.raises(ValueError, match=r"no problems to evaluate.*get_problems"):
        evaluate_policy(policy, tokenizer, [], progress=False)


@pytest.mark.parametrize("kwargs, match", [
    ({"problems": ["a1 b2?"]}, r"problems\[0\] is a str; expected a workbench.tasks.Problem"),
    ({"reward": "exact"}, r"reward must be a callable reward\(prompt, completion, answer\), got 'exact'"),
    ({"batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
    ({"max_new_tokens": 0}, r"max_new_tokens must be an integer >= 1, got 0"),
])
def test_evaluate_policy_checks_its_arguments_before_decoding(policy, tokenizer, kwargs, match):
    args = {"problems": get_problems("running_sum", 2), **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        evaluate_policy(policy, tokenizer, progress=False, **args)


def test_eval_report_of_an_empty_table_and_an_unknown_column():
    with pytest.raises(ValueError, match="no problems"):
        EvalReport(pd.DataFrame()).summary()
    table = pd.DataFrame({"reward": [1.0], "finished_eos": [True], "response_tokens": [3],
                          "reference_tokens": [4]})
    with pytest.raises(ValueError, match=r"column 'reponse_tokens' is not in the table; accepted:"):
        EvalReport(table).by_bucket("reponse_tokens")
    assert EvalReport(table).by_bucket("response_tokens")["problems"].tolist() == [1]


def test_score_rollout_on_no_problems_or_wrong_problems():
    result = SimpleNamespace(config=SimpleNamespace(samples_per_prompt=1), requests=[])
    with pytest.raises(ValueError, match="no problems to score"):
        score_rollout(result, [])
    result.requests = [SimpleNamespace(prompt_id=0, text="x")]
    with pytest.raises(ValueError, match=r"problems\[0\] is a str; expected a workbench.tasks.Problem"):
        score_rollout(result, ["a1?"])
    with pytest.raises(ValueError, match="1 requests do not come from 2 problems x 1 samples"):
        score_rollout(result, [Problem("a", "1"), Problem("b", "2")])
