import json

import numpy as np
import pytest

from workbench.tasks import RunningSumTask, exact_match_reward, get_problems, load_jsonl
from workbench.tasks.base import extract_final_answer


def test_generator_is_seeded():
    t = RunningSumTask()
    assert t.generate(50, seed=3) == t.generate(50, seed=3)
    assert t.generate(50, seed=3) != t.generate(50, seed=4)


@pytest.mark.parametrize("task,mod", [(RunningSumTask(), 10),
                                      (RunningSumTask(max_value=99, modulus=None), None)])
def test_reference_trace_is_a_correct_running_total(task, mod):
    for p in task.generate(200, seed=1):
        items = [int(w[1:]) for w in p.prompt.rstrip("?").split()]
        assert max(items) <= task.max_value
        steps = p.reference.split()
        assert len(steps) == len(items) + 1 == p.meta["items"] + 1
        totals = np.cumsum(items) if mod is None else np.cumsum(items) % mod
        for step, total, word in zip(steps, totals, p.prompt.rstrip("?").split()):
            assert step == f"{word}={total}"
        assert steps[-1] == f"#{totals[-1]}" and p.answer == str(totals[-1])
        assert exact_match_reward(p.prompt, p.reference, p.answer) == 1.0


def test_reference_lengths_are_long_tailed(tokenizer):
    problems = RunningSumTask().generate(4000, seed=0)
    lengths = [len(tokenizer(p.reference, add_special_tokens=False)["input_ids"]) + 1
               for p in problems]
    p50, p99 = np.percentile(lengths, [50, 99])
    assert p99 / p50 >= 5, (p50, p99)
    items = [p.meta["items"] for p in problems]
    assert min(items) >= 2 and max(items) <= 26


def test_reward_reads_the_final_answer():
    assert extract_final_answer(" a1=1 b2=3 #3") == "3"
    assert extract_final_answer("the answer is 42") == "42"
    assert extract_final_answer("") == ""
    assert exact_match_reward("p", " a1=1 #3", "3") == 1.0
    assert exact_match_reward("p", " a1=1 #4", "3") == 0.0


def test_task_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_items"):
        RunningSumTask(max_items=30)
    with pytest.raises(ValueError, match=r"modulus must be None \(the plain sum\) or an integer >= 2, got 1"):
        RunningSumTask(modulus=1)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        get_problems("nope", 3)
    with pytest.raises(ValueError, match="num"):
        get_problems("running_sum")


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_loads_records(tmp_path):
    f = _write(tmp_path / "t.jsonl", [json.dumps({"prompt": "1+1?", "answer": 2, "level": 1}),
                                      "", json.dumps({"prompt": "2+2?", "answer": "4"})])
    problems = load_jsonl(f)
    assert [p.prompt for p in problems] == ["1+1?", "2+2?"]
    assert [p.answer for p in problems] == ["2", "4"]
    assert problems[0].meta == {"level": 1}
    assert get_problems(str(f), 1)[0].prompt == "1+1?"


def test_jsonl_reports_bad_lines_by_number(tmp_path):
    f = _write(tmp_path / "t.jsonl", [json.dumps({"prompt": "a", "answer": 1}), "{not json",
                                      json.dumps({"prompt": "b"}), json.dumps([1, 2])])
    with pytest.raises(ValueError) as e:
        load_jsonl(f)
    msg = str(e.value)
    assert "line 2: not JSON" in msg and "line 3: missing key(s) ['answer']" in msg
    assert "line 4" in msg and "line 1" not in msg


def test_jsonl_empty_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="holds no problems"):
        load_jsonl(_write(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(FileNotFoundError, match="not found"):
        load_jsonl(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("answer, shown", [(None, "null"), (True, "true"), ([1], "list"),
                                           ({"a": 1}, "object"), ("  ", "blank")])
def test_jsonl_answer_must_be_a_string_or_number(tmp_path, answer, shown):
    f = _write(tmp_path / "t.jsonl", [json.dumps({"prompt": "a", "answer": 1}),
                                      json.dumps({"prompt": "b", "answer": answer})])
    with pytest.raises(ValueError) as e:
        load_jsonl(f)
    msg = str(e.value)
    assert "line 2: 'answer' must be a non-empty string or a number" in msg and shown in msg
    assert "line 1" not in msg


def test_jsonl_reference_null_is_no_reference_and_other_types_are_refused(tmp_path):
    f = _write(tmp_path / "t.jsonl", [json.dumps({"prompt": "a", "answer": 1, "reference": None})])
    assert load_jsonl(f)[0].reference == ""
    f = _write(tmp_path / "t.jsonl", [json.dumps({"prompt": "a", "answer": 1, "reference": 3})])
    with pytest.raises(ValueError, match="line 1: 'reference' must be a string"):
        load_jsonl(f)


def test_jsonl_suffix_is_case_insensitive(tmp_path):
    f = _write(tmp_path / "T.JSONL", [json.dumps({"prompt": "1+1?", "answer": 2})])
    assert get_problems(str(f))[0].answer == "2"
    assert get_problems(f, 1)[0].prompt == "1+1?"  # a Path works too


def test_jsonl_with_a_byte_order_mark_or_bad_encoding(tmp_path):
    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": "a", "answer": 1}).encode() + b"\n")
    assert load_jsonl(f)[0].prompt == "a"
    f.write_bytes(b'{"prompt": "\xff", "answer": 1}\n')
    with pytest.raises(ValueError, match=r"not UTF-8 text"):
        load_jsonl(f)


@pytest.mark.parametrize("num, match", [(2.5, r"num must be None \(every problem of a JSONL file\) or an integer >= 0, got 2\.5"),
                                        ("10", "or an integer >= 0, got '10'"),
                                        (True, "got True"), (-1, "got -1")])
def test_get_problems_rejects_a_bad_count(tmp_path, num, match):
    f = _write(tmp_path / "t.jsonl", [json.dumps({"prompt": "a", "answer": 1})] * 3)
    for task in ("running_sum", str(f)):
        with pytest.raises(ValueError, match=match):
            get_problems(task, num)


def test_get_problems_names_the_task_when_unknown_or_not_a_string(tmp_path):
    with pytest.raises(ValueError, match=r"unknown task 'data/x.json'; accepted: \['default', 'running_sum'\]"):
        get_problems("data/x.json", 3)
    with pytest.raises(ValueError, match="unknown task 3"):
        get_problems(3, 3)
    with pytest.raises(FileNotFoundError, match="not found"):
        get_problems(str(tmp_path / "missing.jsonl"))


def test_step_reward_credits_correct_steps_before_the_first_mistake():
    from workbench.tasks import RunningSumTask
    task = RunningSumTask()
    p = task.make([7, 5, 8])                       # a7=7 b5=2 c8=0 #0
    assert task.step_reward(p.prompt, p.reference, p.answer) == 1.0
    assert task.step_reward(p.prompt, " a7=7 b5=2 c8=1 #1", p.answer) == pytest.approx(1 / 3)
    assert task.step_reward(p.prompt, " a7=7 b5=3 c8=0 #1", p.answer) == pytest.approx(1 / 6)
    assert task.step_reward(p.prompt, " nonsense", p.answer) == 0.0
    plain = RunningSumTask(modulus=None, max_value=99).make([47, 5])
    assert RunningSumTask(modulus=None).step_reward(plain.prompt, plain.reference,
                                                   plain.answer) == 1.0
