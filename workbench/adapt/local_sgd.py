"""Local SGD: the sync point where the idle workers' copies of the drafter become one.

When several workers sit idle in one RL step, each trains its own copy of the drafter: the
same start (the published weights, optimizer moments and step count), its own batches, as many
whole steps as fit its idle window. The step's end is the fixed sync point: the copies are
averaged into the next published state (local SGD with one sync per RL step; Lin et al.,
"Don't use large mini-batches, use local SGD", 2020). Nothing is exchanged while the windows
run, so a worker that is preempted or lost takes only its own unfinished step with it, and the
published drafter is always a whole one.

Glossary:

copy     one worker's trainer state after its window (``Trainer.state_dict()``): weights,
         AdamW state, the harness's step count, generator and history.
weight   a copy's whole steps over the whole steps of every copy: a worker that idled for
         forty steps moves the average forty times as much as one that fitted a single step,
         and a copy that took none (a window too short for one step) does not count at all.
merge    every floating-point tensor of the weights and of AdamW's moments
         (``exp_avg``, ``exp_avg_sq``) is the weighted mean of the copies'; AdamW's per-tensor
         step count is the largest copy's (its bias correction is then the most advanced
         one's); the harness's step count is the start's plus every copy's steps, so the next
         RL step's batches follow on; the history is the start's then each copy's new rows in
         the windows' order; the generator is the copy with the most steps'.

With one copy the merge is that copy unchanged, so the first-finisher rule (one window) trains
exactly as a single worker would.
"""
from __future__ import annotations

import torch

__all__ = ["merge_copies"]


def merge_copies(start: dict, copies: list[dict], steps: list[int]) -> dict | None:
    """The state at the sync point of ``copies`` (trainer states that each started from
    ``start`` and took ``steps[i]`` whole steps); ``None`` when no copy took a step."""
    if len(copies) != len(steps):
        raise ValueError(f"{len(copies)} copies for {len(steps)} step counts")
    kept = [(state, n) for state, n in zip(copies, steps) if n > 0]
    if not kept:
        return None
    if len(kept) == 1:
        return kept[0][0]
    total = sum(n for _, n in kept)
    weights = [n / total for _, n in kept]
    states = [state for state, _ in kept]
    leader = max(kept, key=lambda pair: pair[1])[0]  # the most steps: generator, AdamW step
    history = list(start["history"])
    for state in states:
        history += state["history"][len(start["history"]):]
    return {**leader,
            "model": _mean([s["model"] for s in states], weights),
            "optimizer": _merge_adamw([s["optimizer"] for s in states], weights),
            "step": start["step"] + total,
            "elapsed_s": max(s["elapsed_s"] for s in states),
            "history": history}


def _mean(tensors: list[dict], weights: list[float]) -> dict:
    """Weighted mean of every floating-point tensor; others (counters) from the first."""
    return {key: (sum(w * t[key] for w, t in zip(weights, tensors))
                  if torch.is_floating_point(tensors[0][key]) else tensors[0][key])
            for key in tensors[0]}


def _merge_adamw(optimizers: list[dict], weights: list[float]) -> dict:
    """AdamW's state dicts merged (module docstring, "merge"): moments averaged, the largest
    per-tensor step count kept."""
    merged = {"param_groups": optimizers[0]["param_groups"], "state": {}}
    for index in optimizers[0]["state"]:
        per_copy = [opt["state"][index] for opt in optimizers]
        moments = _mean([{k: v for k, v in s.items() if k != "step"} for s in per_copy], weights)
        step = max((s["step"] for s in per_copy), key=float)
        merged["state"][index] = {**moments, "step": step.clone()}
    return merged
