"""Task accuracy and response-length statistics of a policy, as pandas tables.

One place defines how a policy is scored, so the zoo recipe, notebooks, benchmarks and GRPO
agree: greedy decoding, the task's reward, length percentiles of the generated responses, and
one definition of task accuracy (:func:`accuracy`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from .checks import check_int, check_real
from .rollout.timeline_stats import length_percentiles
from .tasks import Problem, exact_match_reward

__all__ = ["EvalReport", "evaluate_policy", "score_rollout"]

# Bucket edges (response tokens) used by every accuracy-per-length table.
LENGTH_BUCKETS = (0, 32, 64, 128, 256, 10_000)


@dataclass
class EvalReport:
    """Per-problem results (``table``) and the summaries every notebook reports."""

    table: pd.DataFrame

    def summary(self) -> dict[str, float]:
        t = self.table
        if t.empty:
            raise ValueError("no problems in this report: summary() needs at least one row; "
                             "evaluate_policy at least one problem")
        lengths = t["response_tokens"]
        p99 = float(np.percentile(lengths, 99))
        tail = t[lengths >= p99]
        # the mean reward: :func:`accuracy` when scored by evaluate_policy's default reward
        return {"num_problems": int(len(t)), "accuracy": float(t["reward"].mean()),
                **length_percentiles(lengths),
                "length_ratio_p99_p50": p99 / float(np.percentile(lengths, 50)),
                "eos_rate": float(t["finished_eos"].mean()),
                "eos_rate_tail": float(tail["finished_eos"].mean())}

    @property
    def reference_count(self) -> int:
        """How many problems have a reference trace (user JSONL tasks often have none)."""
        if "reference_tokens" not in self.table.columns:
            return 0
        return int(self.table["reference_tokens"].notna().sum())

    def length_column(self) -> str:
        """The length accuracy is bucketed by: the reference trace's when any problem has
        one (the task's own difficulty), else the policy's response length."""
        return "reference_tokens" if self.reference_count else "response_tokens"

    def reference_note(self) -> str:
        """One sentence on what the reference figures can show: a task without reference
        traces (a JSONL task of ``{"prompt", "answer"}``) skips them, and says so."""
        have, total = self.reference_count, len(self.table)
        if have == 0:
            return (f"no reference traces: none of the {total} problems has a 'reference' (a "
                    "JSONL task without that key), so the reference length histogram is "
                    "skipped (generated lengths only) and accuracy is bucketed by the "
                    "policy's own response length instead of the reference length")
        if have < total:
            return (f"reference traces for {have} of {total} problems: the reference length "
                    f"histogram and the accuracy by reference length cover those {have} only")
        return (f"reference traces for all {total} problems: lengths compare reference and "
                "generated, accuracy is bucketed by reference length")

    def by_bucket(self, column: str | None = None) -> pd.DataFrame:
        """Accuracy, count and EOS rate per length bucket of ``column`` (default:
        :meth:`length_column`); rows without a length (no reference) are left out."""
        t = self.table
        column = self.length_column() if column is None else column
        if column not in t.columns:
            raise ValueError(f"column {column!r} is not in the table; accepted: a column of "
                             f"token counts, e.g. 'reference_tokens' or 'response_tokens' "
                             f"(columns: {list(t.columns)})")
        buckets = pd.cut(t[column], bins=list(LENGTH_BUCKETS), right=False)
        g = t.groupby(buckets, observed=True)
        res = pd.DataFrame({"problems": g.size(), "accuracy": g["reward"].mean(),
                            "eos_rate": g["finished_eos"].mean()})
        res.index = res.index.astype(str)
        return res.rename_axis(f"{column} bucket").reset_index()


def evaluate_policy(model, tokenizer, problems: list[Problem], reward=exact_match_reward,
                    max_new_tokens: int = 384, batch_size: int = 64,
                    progress: bool = True) -> EvalReport:
    """Greedy-decode every problem with the rollout engine and score it with
    ``reward(prompt, completion, answer)``.

    Problems are decoded in batches of ``batch_size`` sorted by prompt length (little padding).
    ``reference_tokens`` counts the worked solution plus EOS (NaN when the task has none).
    """
    from .rollout import RolloutConfig, RolloutEngine
    _check_problems(problems, "evaluate")
    if not callable(reward):
        raise TypeError(f"reward must be a callable reward(prompt, completion, answer), got "
                        f"{reward!r}")
    batch_size = check_int("batch_size", batch_size, 1)
    config = RolloutConfig(max_new_tokens=max_new_tokens, max_batch_size=batch_size)
    order = sorted(range(len(problems)), key=lambda i: len(problems[i].prompt))
    result = RolloutEngine(model, tokenizer).rollout(
        [problems[i].prompt for i in order], config, progress=progress)
    rows = [None] * len(problems)
    for i, r in zip(order, result.requests):
        p = problems[i]
        ref_tokens = (len(tokenizer(p.reference, add_special_tokens=False)["input_ids"]) + 1
                      if p.reference else float("nan"))
        rows[i] = {"uid": p.uid, "prompt": p.prompt, "answer": p.answer,
                   "items": p.meta.get("items"), "reference": p.reference,
                   "reference_tokens": ref_tokens, "completion": r.text,
                   "response_tokens": len(r.tokens), "finished_eos": r.finish == "eos",
                   "reward": float(reward(p.prompt, r.text, p.answer))}
    return EvalReport(pd.DataFrame(rows))


def _check_problems(problems, verb: str) -> None:
    """A non-empty list of Problems, else a clear error (before any decoding)."""
    if isinstance(problems, (str, Problem)) or not hasattr(problems, "__len__"):
        raise TypeError(f"problems must be a list of workbench.tasks.Problem, got "
                        f"{type(problems).__name__}")
    if len(problems) == 0:
        raise ValueError(f"no problems to {verb}: pass a non-empty list of Problems, e.g. "
                         "get_problems('running_sum', 100) or load_jsonl('tasks.jsonl')")
    for i, p in enumerate(problems):
        if not isinstance(p, Problem):
            raise ValueError(f"problems[{i}] is a {type(p).__name__}; expected a "
                             "workbench.tasks.Problem (from get_problems or load_jsonl)")


def accuracy(problems: list[Problem], completions: list[str]) -> float:
    """Task accuracy, the one definition (docs/design.md, "Measures"): the mean over responses
    of the exact-match reward, 1 when a completion's final answer is its problem's answer
    (:func:`~workbench.tasks.exact_match_reward`), whatever reward a run trains on.

    :meth:`EvalReport.summary` reports it on greedy completions of held-out problems
    (:func:`evaluate_policy` scores with this reward unless told otherwise); GRPO's history
    on each step's sampled responses (``problems[i]`` answered by ``completions[i]``).
    """
    _check_problems(problems, "score")
    if len(problems) != len(completions):
        raise ValueError(f"{len(completions)} completions for {len(problems)} problems; "
                         "accuracy pairs problems[i] with completions[i]")
    scores = [_checked_reward(exact_match_reward, p, c) for p, c in zip(problems, completions)]
    return sum(scores) / len(scores)


def score_rollout(result, problems: list[Problem], reward=exact_match_reward) -> list[float]:
    """Reward of every request of a rollout of ``problems`` (prompt i = problems[i]).

    The rewards are also stored in the timeline's requests table (column ``reward``).
    """
    _check_problems(problems, "score")
    if len(problems) * result.config.samples_per_prompt != len(result.requests):
        raise ValueError(f"{len(result.requests)} requests do not come from {len(problems)} "
                         f"problems x {result.config.samples_per_prompt} samples")
    rewards = [_checked_reward(reward, problems[r.prompt_id], r.text) for r in result.requests]
    result.set_rewards(rewards)
    return rewards


def _checked_reward(reward, problem: Problem, completion: str) -> float:
    """``reward(prompt, completion, answer)`` as a float; anything but a finite real number
    is an error that names the prompt whose completion got it."""
    value = reward(problem.prompt, completion, problem.answer)
    try:  # the numbers policy of every argument check; a bad return value is a TypeError
        return check_real("reward", value)
    except ValueError:
        raise TypeError(f"the reward function returned {value!r} ({type(value).__name__}) for "
                        f"prompt {problem.prompt!r}; it must return a finite real number "
                        "(float or int)") from None
