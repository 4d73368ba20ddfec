"""The drafter as a by-product of RL: export it, and measure it against the pre-RL drafter.

After RL the adaptive drafter is aligned with the final policy; the drafter trained only
before RL is aligned with the starting one. :func:`probe_acceptance` measures both (or any
drafters) on the same held-out prompts with the same policy, engine and sampling, so the rows
differ in the drafter only.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ..rollout import RolloutConfig, RolloutEngine, StaticSchedule
from ..speculative.measure import acceptance_length

__all__ = ["export_drafter", "probe_acceptance"]


def export_drafter(trainer, path: str | os.PathLike) -> Path:
    """Save the serving drafter of a :class:`~workbench.rl.tlt.TLTTrainer` (atomically);
    ``EagleHead.from_pretrained(path, policy)`` loads it onto the final policy."""
    if trainer.drafter is None:
        raise ValueError("this run has no drafter (the baseline variant); export a "
                         "speculative variant's")
    return trainer.drafter.head.save_pretrained(path)


def probe_acceptance(policy, tokenizer, drafters: dict, prompts, k: int = 4,
                     temperatures=(0.0, 1.0), max_new_tokens: int = 256,
                     max_batch_size: int = 16, seed: int = 0) -> pd.DataFrame:
    """Acceptance length of each drafter (``{name: drafter}``) with ``policy`` on ``prompts``,
    a chain of ``k`` drafts at every step; one row per drafter and temperature."""
    engine = RolloutEngine(policy, tokenizer)
    rows = []
    for t in temperatures:
        cfg = RolloutConfig(max_new_tokens=max_new_tokens, temperature=t, seed=seed,
                            max_batch_size=max_batch_size)
        for name, drafter in drafters.items():
            result = engine.rollout(prompts, cfg, progress=False, drafter=drafter,
                                    schedule=StaticSchedule(k))
            rows.append({"drafter": name, "k": k, "temperature": t,
                         "acceptance_length": acceptance_length(result),
                         "response_tokens": int(result.timeline.requests["response_tokens"].sum())})
    return pd.DataFrame(rows)
