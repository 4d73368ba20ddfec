"""Task accuracy and response-length statistics of a policy, as pandas tables.

One place defines how a policy is scored, so the zoo recipe, notebooks and benchmarks agree:
greedy decoding, the task's reward, and length percentiles of the generated responses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from .rollout.timeline import length_percentiles
from .tasks import Problem, exact_match_reward

__all__ = ["EvalReport", "evaluate_policy", "score_rollout", "length_percentiles",
           "LENGTH_BUCKETS"]

# Bucket edges (response tokens) used by every accuracy-per-length table.
LENGTH_BUCKETS = (0, 32, 64, 128, 256, 10_000)


@dataclass
class EvalReport:
    """Per-problem results (``table``) and the summaries every notebook reports."""

    table: pd.DataFrame

    def summary(self) -> dict[str, float]:
        t = self.table
        lengths = t["response_tokens"]
        p99 = float(np.percentile(lengths, 99))
        tail = t[lengths >= p99]
        return {"num_problems": int(len(t)), "accuracy": float(t["reward"].mean()),
                **length_percentiles(lengths),
                "length_ratio_p99_p50": p99 / float(np.percentile(lengths, 50)),
                "eos_rate": float(t["finished_eos"].mean()),
                "eos_rate_tail": float(tail["finished_eos"].mean())}

    def by_bucket(self, column: str = "reference_tokens") -> pd.DataFrame:
        """Accuracy, count and EOS rate per length bucket of ``column``."""
        t = self.table
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
    order = sorted(range(len(problems)), key=lambda i: len(problems[i].prompt))
    result = RolloutEngine(model, tokenizer).rollout(
        [problems[i].prompt for i in order],
        RolloutConfig(max_new_tokens=max_new_tokens, max_batch_size=batch_size),
        progress=progress)
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


def score_rollout(result, problems: list[Problem], reward=exact_match_reward) -> list[float]:
    """Reward of every request of a rollout of ``problems`` (prompt i = problems[i]).

    The rewards are also stored in the timeline's requests table (column ``reward``).
    """
    if len(problems) * result.config.samples_per_prompt != len(result.requests):
        raise ValueError(f"{len(result.requests)} requests do not come from {len(problems)} "
                         f"problems x {result.config.samples_per_prompt} samples")
    rewards = [float(reward(problems[r.prompt_id].prompt, r.text, problems[r.prompt_id].answer))
               for r in result.requests]
    result.set_rewards(rewards)
    return rewards
