"""Task accuracy and response-length statistics of a policy, as pandas tables.

One place defines how a policy is scored, so the zoo recipe, notebooks and benchmarks agree:
greedy decoding, the task's reward, and length percentiles of the generated responses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .tasks import Problem, exact_match_reward

__all__ = ["EvalReport", "evaluate_policy", "generate_greedy", "length_percentiles",
           "LENGTH_BUCKETS"]

# Bucket edges (response tokens) used by every accuracy-per-length table.
LENGTH_BUCKETS = (0, 32, 64, 128, 256, 10_000)


def length_percentiles(lengths, qs=(50, 90, 99)) -> dict[str, float]:
    """``{"length_p50": ..., ...}`` of a sequence of token counts."""
    arr = np.asarray(list(lengths), dtype=float)
    if arr.size == 0:
        return {f"length_p{q}": float("nan") for q in qs}
    return {f"length_p{q}": float(np.percentile(arr, q)) for q in qs}


@torch.no_grad()
def generate_greedy(model, tokenizer, prompts: list[str], max_new_tokens: int = 384,
                    batch_size: int = 64) -> list[dict]:
    """Greedy responses with HF ``generate`` (length-sorted batches, left padding).

    Returns one dict per prompt, in input order: ``completion`` text, ``response_tokens`` (EOS
    included when emitted) and ``finished_eos``.
    """
    eos = tokenizer.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[dict | None] = [None] * len(prompts)
    device = next(model.parameters()).device
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True).to(device)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        new = gen[:, enc["input_ids"].shape[1]:].tolist()
        for i, toks in zip(idx, new):
            n = toks.index(eos) + 1 if eos in toks else len(toks)
            toks = toks[:n]
            out[i] = {"completion": tokenizer.decode(toks, skip_special_tokens=True),
                      "response_tokens": len(toks), "finished_eos": bool(toks) and toks[-1] == eos}
    return out  # type: ignore[return-value]


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
                    max_new_tokens: int = 384, batch_size: int = 64) -> EvalReport:
    """Greedy-decode every problem and score it with ``reward(prompt, completion, answer)``."""
    gens = generate_greedy(model, tokenizer, [p.prompt for p in problems],
                           max_new_tokens=max_new_tokens, batch_size=batch_size)
    rows = []
    for p, g in zip(problems, gens):
        ref_tokens = len(tokenizer(p.reference, add_special_tokens=False)["input_ids"]) + 1
        rows.append({"uid": p.uid, "prompt": p.prompt, "answer": p.answer,
                     "items": p.meta.get("items"), "reference_tokens": ref_tokens, **g,
                     "reward": float(reward(p.prompt, g["completion"], p.answer))})
    return EvalReport(pd.DataFrame(rows))
