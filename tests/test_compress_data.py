"""Compression data: a task's example is its prompt, response and stop token as a rollout feeds
them, and only the response and the stop token are scored; too little data is refused; a text
file is scored on every token."""
import json

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.models import tiny_model
from workbench.compress.data import (MIN_SCORED_TOKENS, accuracy_task, budget_tokens, distill_data,
                                     lm_loss, sequences_from, task_sequence, token_batches)
from workbench.rollout import RolloutEngine


def char_ids(tokenizer, text):
    """The char tokenizer's ids of ``text``, one per character, looked up by hand."""
    return tokenizer.convert_tokens_to_ids(list(text))


def hand_example(tokenizer, prompt, response):
    """``(ids, scored)`` written out: BOS, the prompt's characters, the response's, EOS; only
    the response and EOS are scored."""
    prompt_ids = [tokenizer.bos_token_id] + char_ids(tokenizer, prompt)
    response_ids = char_ids(tokenizer, response) + [tokenizer.eos_token_id]
    return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


WITH_REFERENCE = {"prompt": "a4 b5 c4?", "answer": "3", "reference": " a4=4 b5=9 c4=3 #3"}
ANSWER_ONLY = {"prompt": "Tom has 3 apples and eats one. How many are left?", "answer": "2"}


def test_a_task_example_is_prompt_response_stop_as_the_rollout_feeds_it(tokenizer):
    ids, start = task_sequence(WITH_REFERENCE["prompt"], WITH_REFERENCE["reference"], tokenizer)
    expected, scored = hand_example(tokenizer, WITH_REFERENCE["prompt"],
                                    WITH_REFERENCE["reference"])
    assert ids == expected and start == scored.index(1)
    engine = RolloutEngine(tiny_model("llama", tokenizer), tokenizer)
    assert engine.encode([WITH_REFERENCE["prompt"]])[0] == ids[:start]  # the engine's prompt
    assert ids[-1] == engine.eos_id                                    # the engine's stop


def test_the_mask_scores_exactly_the_response_and_the_stop_token(tokenizer, tmp_path):
    rows = [WITH_REFERENCE, ANSWER_ONLY, {"prompt": "x?", "answer": "7", "reference": ""}]
    path = write_jsonl(tmp_path / "task.jsonl", rows)
    seqs, starts = sequences_from(path, 3, tokenizer)
    hand = [hand_example(tokenizer, r["prompt"], r.get("reference") or r["answer"])
            for r in rows]
    assert seqs == [ids for ids, _ in hand]
    [(ids, mask, scored)] = token_batches(seqs, 3, tokenizer.pad_token_id, starts=starts)
    for row, i in enumerate(sorted(range(3), key=lambda i: len(hand[i][0]))):  # by length
        width = len(hand[i][1])
        assert scored[row].tolist() == hand[i][1] + [0] * (ids.shape[1] - width)
        assert mask[row].tolist() == [1] * width + [0] * (ids.shape[1] - width)
    assert budget_tokens([(ids, mask, scored)], 1) == sum(sum(s) for _, s in hand)

    model = tiny_model("llama", tokenizer)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    losses = [F.cross_entropy(logits[r, t - 1], ids[r, t]) for r in range(3)
              for t in range(1, ids.shape[1]) if scored[r, t]]
    assert lm_loss(model, [(ids, mask, scored)]) == pytest.approx(  # lm_loss works in float32
        float(torch.stack(losses).mean()), rel=1e-6)


def test_a_jsonl_task_scores_its_answer_without_a_reference_and_its_reference_with_one(
        tokenizer, tmp_path):
    answers = write_jsonl(tmp_path / "answers.jsonl", [ANSWER_ONLY])
    traces = write_jsonl(tmp_path / "traces.jsonl", [WITH_REFERENCE])
    for path, row, response in ((answers, ANSWER_ONLY, ANSWER_ONLY["answer"]),
                                (traces, WITH_REFERENCE, WITH_REFERENCE["reference"])):
        [ids], [start] = sequences_from(path, 1, tokenizer)
        assert ids[start:] == char_ids(tokenizer, response) + [tokenizer.eos_token_id]
        assert ids[:start] == [tokenizer.bos_token_id] + char_ids(tokenizer, row["prompt"])


def test_too_few_scored_tokens_are_refused_naming_both_numbers(tokenizer, tmp_path):
    rows = [{"prompt": f"Ann has {i} pens and buys 2. How many now?", "answer": str(i + 2)}
            for i in range(300)]
    path = write_jsonl(tmp_path / "words.jsonl", rows)
    have = sum(len(r["answer"]) + 1 for r in rows[:290])  # answer characters + EOS
    assert have < MIN_SCORED_TOKENS
    with pytest.raises(ValueError, match=rf"the 290 training texts hold {have:,} scored "
                                         r"response and stop tokens.*at least 2,000.*more "
                                         r"examples.*'reference'"):
        distill_data(tokenizer, path, num=290, eval_num=10)
    with_traces = write_jsonl(tmp_path / "traces.jsonl", [
        {**r, "reference": f" {r['prompt'].split()[2]}+2={r['answer']} #{r['answer']}"}
        for r in rows])
    train, held_out = distill_data(tokenizer, with_traces, num=290, eval_num=10)
    scored = sum(int(s[:, 1:].sum()) for _, _, s in train)
    assert scored >= MIN_SCORED_TOKENS and len(held_out) == 1
    assert scored == sum(len(f" {i}+2={i + 2} #{i + 2}") + 1 for i in range(290))


def test_a_text_file_scores_every_token(tokenizer, tmp_path):
    lines = [f"line {i}: the quick brown fox jumps over the lazy dog" for i in range(60)]
    path = tmp_path / "notes.txt"
    path.write_text("\n\n".join(lines) + "\n")
    train, held_out = distill_data(tokenizer, path, num=50, eval_num=10, batch_size=8)
    for ids, mask, scored in train + held_out:
        assert torch.equal(scored[:, 1:], mask[:, 1:])  # every token after the first
    assert sum(int(s[:, 1:].sum()) for _, _, s in train) == sum(len(x) for x in lines[:50])
    model = tiny_model("llama", tokenizer)
    assert lm_loss(model, held_out) == pytest.approx(
        lm_loss(model, [(ids, mask) for ids, mask, _ in held_out]), rel=1e-12)
    assert accuracy_task(path) == "running_sum" and accuracy_task("running_sum") == "running_sum"
    have = sum(len(x) for x in lines[:5])
    with pytest.raises(ValueError, match=rf"the 5 training texts hold {have} scored tokens; "
                                         r"distillation needs at least 2,000"):
        distill_data(tokenizer, path, num=5, eval_num=1)


def test_an_unknown_source_is_named(tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"unknown text source '.*missing.txt'.*\.jsonl task"):
        sequences_from(tmp_path / "missing.txt", 4, tokenizer)
