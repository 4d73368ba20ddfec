"""Recipes for the default policy's drafters: a small LM and an EAGLE head.

Each is :mod:`workbench.speculative.fit` (which fits a drafter to any policy on the spot) run
on the default policy and the running-sum task with the shipped settings: 4,000 training
prompts answered whatever the time (so every run sees the same data and an interrupted run
resumes exactly), tau on 64 held-out problems with responses up to 384 tokens.
``workbench zoo train drafter-lm`` and ``workbench zoo train eagle`` run them.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..models import DEFAULT_EAGLE, EMBEDDED, load_model
from ..speculative.fit import DrafterLMConfig, FitConfig, fit_drafter_lm, fit_eagle
from ..speculative.train import EagleTrainConfig

__all__ = ["DrafterLMRecipe", "EagleRecipe", "train_drafter_lm", "train_eagle_head"]

TASK = "running_sum"


def _fit_config(recipe) -> FitConfig:
    """The shipped drafters' data: every prompt answered (no time cap on harvesting)."""
    return FitConfig(minutes=recipe.minutes, train_prompts=recipe.num_prompts,
                     heldout_prompts=recipe.heldout_prompts, max_new_tokens=384,
                     max_batch_size=64, k=4, harvest_share=None, seed=recipe.seed)


def _printed(fitted) -> dict:
    """The saved provenance record (the recipe's command and settings in it), printed."""
    print(json.dumps(fitted.provenance, indent=2))
    return fitted.provenance


@dataclass
class DrafterLMRecipe(DrafterLMConfig):
    """A 2-layer GQA Llama (d=128) trained on the policy's outputs, loss on response tokens."""

    seed: int = 0
    num_prompts: int = 4000
    heldout_prompts: int = 64
    minutes: float = 15.0


def train_drafter_lm(out_dir=None, seed: int = 0, minutes: float | None = None,
                     recipe: DrafterLMRecipe | None = None) -> dict:
    """Train the small-LM drafter of the default policy into ``out_dir`` (float16)."""
    recipe = recipe or DrafterLMRecipe(seed=seed)
    if minutes is not None:
        recipe.minutes = minutes
    policy, tok = load_model("default", device="cpu")
    command = f"workbench zoo train drafter-lm --seed {recipe.seed}"
    fitted = fit_drafter_lm(policy, tok, TASK, Path(out_dir or EMBEDDED["default-drafter"]),
                            _fit_config(recipe), recipe, save_dtype=torch.float16,
                            provenance={"command": command, "recipe": asdict(recipe)})
    return _printed(fitted)


def _shipped_eagle() -> EagleTrainConfig:
    """The shipped head's training: EAGLE's defaults over 5,000 steps of cosine decay."""
    return EagleTrainConfig.flat(horizon=5000)


@dataclass
class EagleRecipe:
    """EAGLE head of the default policy: harvest policy rollouts, then train the head
    (``train``; its ``seed`` is the recipe's, its ``max_minutes`` what harvesting left of
    ``minutes``)."""

    seed: int = 0
    num_prompts: int = 4000
    heldout_prompts: int = 64
    train: EagleTrainConfig = field(default_factory=_shipped_eagle)
    minutes: float = 50.0           # training stops early when this wall-clock cap is hit


def train_eagle_head(out_dir=None, seed: int = 0, minutes: float | None = None,
                     recipe: EagleRecipe | None = None) -> dict:
    """Train the EAGLE head of the default policy into ``out_dir``."""
    recipe = recipe or EagleRecipe(seed=seed)
    if minutes is not None:
        recipe.minutes = minutes
    policy, tok = load_model("default", device="cpu")
    command = f"workbench zoo train eagle --seed {recipe.seed}"
    fitted = fit_eagle(policy, tok, TASK, Path(out_dir or DEFAULT_EAGLE), _fit_config(recipe),
                       recipe.train, provenance={"command": command, "recipe": asdict(recipe)})
    return _printed(fitted)
