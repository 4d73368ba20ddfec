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

from .helpers.models import tiny_model



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


# ----------------------------------------------------------------------------- the CLI

TOY_NOTEBOOK = {"cells": [{"id": "params", "cell_type": "code", "metadata": {"tags": ["parameters"]},
                           "source": "out_dir = '.'\nx = 1", "outputs": [], "execution_count": None}],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                            "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def toy(tmp_path):
    import json
    (tmp_path / "toy.ipynb").write_text(json.dumps(TOY_NOTEBOOK))
    return tmp_path


@pytest.mark.parametrize("text, expected", [
    ("notebooks:\n  - notebook: toy.ipynb\n    parameters: {y: 1}\n", "parameter(s) ['y'] not declared"),
    ("notebooks: [\n", "not valid YAML"),
    ("notebooks:\n  - notebook: nope.ipynb\n", "notebook not found: nope.ipynb"),
    ("notebook:\n  - notebook: toy.ipynb\n", "unknown key(s) ['notebook']"),
    ("notebooks:\n  - notebook: toy.ipynb\n    grid: {x: 3}\n", "must be a non-empty list, got 3"),
])
def test_pipeline_user_errors_print_one_message_and_exit_2(toy, capsys, monkeypatch, text, expected):
    monkeypatch.chdir(toy)
    (toy / "p.yaml").write_text(text)
    assert main(["pipeline", "run", "p.yaml", "--runs-root", str(toy / "runs")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("workbench pipeline run: error: ") and expected in err
    assert len(err.strip().splitlines()) <= 3 and "Traceback" not in err
    assert not (toy / "runs").exists()


def test_pipeline_user_error_from_the_command_line_has_no_traceback(toy):
    (toy / "p.yaml").write_text("notebooks:\n  - notebook: toy.ipynb\n    parameters: {y: 1}\n")
    done = subprocess.run([sys.executable, "-m", "workbench", "pipeline", "run", "p.yaml"],
                          cwd=toy, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "['y'] not declared" in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 3
    assert not (toy / "runs").exists()


def test_missing_pipeline_file_exits_2(tmp_path, capsys):
    assert main(["pipeline", "run", str(tmp_path / "nope.yaml")]) == 2
    assert "pipeline file not found" in capsys.readouterr().err


@pytest.mark.parametrize("minutes", ["0", "-1", "nan", "soon"])
def test_zoo_minutes_must_be_positive(minutes, capsys, monkeypatch):
    import workbench.zoo
    calls = []  # never train for real here: the recipe would overwrite data/models
    monkeypatch.setitem(workbench.zoo.RECIPES, "default", lambda **kw: calls.append(kw))
    with pytest.raises(SystemExit) as raised:
        main(["zoo", "train", "default", "--minutes", minutes])
    assert raised.value.code == 2 and calls == []
    assert "minutes must be a finite number > 0, got " in capsys.readouterr().err


# ----------------------------------------------------------------------------- results

def test_write_table_and_metrics_check_their_input_before_writing(tmp_path):
    from workbench.results import write_metrics, write_table
    table = pd.DataFrame({"a": [1, 2]})
    with pytest.raises(ValueError, match=r"cannot tell the format of .*t\.json.*'\.parquet', '\.pq', '\.csv'"):
        write_table(table, tmp_path / "t.json")
    with pytest.raises(TypeError, match="DataFrame, got dict"):
        write_table({"a": [1]}, tmp_path / "t.csv")
    with pytest.raises(TypeError, match="metrics must be a dict of scalars, got list"):
        write_metrics(tmp_path, [("a", 1)])
    assert list(tmp_path.iterdir()) == []
    assert pd.read_csv(write_table(table, tmp_path / "T.CSV"))["a"].tolist() == [1, 2]


def test_interrupted_table_write_keeps_the_previous_table(tmp_path, monkeypatch):
    from workbench.results import write_metrics, write_table
    path = write_table(pd.DataFrame({"a": [1]}), tmp_path / "t.parquet")
    write_metrics(tmp_path, {"x": 1})

    def half_write(self, target, *args, **kwargs):
        Path(target).write_bytes(b"PAR1 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", half_write)
    with pytest.raises(KeyboardInterrupt):
        write_table(pd.DataFrame({"a": [2]}), path)
    monkeypatch.undo()
    assert pd.read_parquet(path)["a"].tolist() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "provenance.json",
                                                          "t.parquet"]
