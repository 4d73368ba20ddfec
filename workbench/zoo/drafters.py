"""Recipes for the default policy's drafters: a small LM and an EAGLE head.

Both learn from the policy's own outputs on training problems (never held-out ones): greedy
responses, which greedy SD must predict, and temperature-1 samples, which sampled SD must.
``workbench zoo train drafter-lm`` and ``workbench zoo train eagle`` run them.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..atomic import write_json
from ..models import DEFAULT_EAGLE, EMBEDDED, load_model, save_model
from ..rollout import RolloutConfig, RolloutEngine
from ..tasks import HELDOUT_SEED, TRAIN_SEED, get_problems

__all__ = ["DrafterLMRecipe", "EagleRecipe", "policy_outputs", "train_drafter_lm",
           "train_eagle_head", "acceptance_on_heldout"]


def policy_outputs(policy, tokenizer, num_prompts: int, seed: int, harvest: bool = False):
    """Greedy and temperature-1 rollouts of the policy on ``num_prompts`` training problems."""
    problems = get_problems("running_sum", num_prompts, seed=TRAIN_SEED + 7919 + seed)
    engine = RolloutEngine(policy, tokenizer)
    prompts = [p.prompt for p in problems]
    half = len(prompts) // 2
    common = dict(max_new_tokens=384, max_batch_size=64, harvest=harvest, seed=seed)
    return [engine.rollout(prompts[:half], RolloutConfig(temperature=0.0, **common)),
            engine.rollout(prompts[half:], RolloutConfig(temperature=1.0, **common))]


def acceptance_on_heldout(policy, tokenizer, drafter, num_prompts: int = 64, k: int = 4,
                          temperature: float = 0.0) -> float:
    """Acceptance length tau (tokens emitted per verify step) on held-out problems."""
    from ..speculative.measure import acceptance_length
    problems = get_problems("running_sum", num_prompts, seed=HELDOUT_SEED)
    res = RolloutEngine(policy, tokenizer).rollout(
        [p.prompt for p in problems], RolloutConfig(max_new_tokens=384, spec_k=k,
                                                    temperature=temperature),
        drafter=drafter, progress=False)
    return acceptance_length(res)


def _write_provenance(path: Path, record: dict) -> None:
    write_json(path / "provenance.json", record)
    print(json.dumps(record, indent=2))


def _remaining_minutes(budget: float, start: float) -> float:
    """What is left of a wall-clock budget that data preparation has already used."""
    return max(1e-3, budget - (time.perf_counter() - start) / 60)


@dataclass
class DrafterLMRecipe:
    """A 2-layer GQA Llama (d=128) trained on the policy's outputs, loss on response tokens."""

    seed: int = 0
    num_prompts: int = 4000
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 256
    tokens_per_batch: int = 4096
    steps: int = 900
    lr: float = 2e-3
    warmup: int = 50
    minutes: float = 15.0


def _drafter_examples(policy, tok, recipe: DrafterLMRecipe):
    runs = policy_outputs(policy, tok, recipe.num_prompts, recipe.seed)
    return [(r.prompt_ids + r.tokens, len(r.prompt_ids)) for run in runs for r in run.requests]


def _build_drafter(policy, tok, recipe: DrafterLMRecipe):
    from .policy import PolicyRecipe, build_policy
    arch = PolicyRecipe(seed=recipe.seed, hidden_size=recipe.hidden_size, layers=recipe.layers,
                        heads=recipe.heads, kv_heads=recipe.kv_heads,
                        intermediate_size=recipe.intermediate_size,
                        max_position=policy.config.max_position_embeddings)
    return build_policy(arch, policy.config.vocab_size, tok)


def train_drafter_lm(out_dir=None, seed: int = 0, minutes: float | None = None,
                     recipe: DrafterLMRecipe | None = None) -> dict:
    """Train the small-LM drafter of the default policy into ``out_dir``.

    Trains through the harness with the policy recipe's loss and optimiser (weight decay 0);
    an interrupted run resumes from ``<out_dir>.train_state``.
    """
    from ..speculative.drafters import LMDrafter
    from ..train import train_state_dir
    from .policy import final_loss, length_batches, lm_train_config, train_lm

    recipe = recipe or DrafterLMRecipe(seed=seed)
    if minutes is not None:
        recipe.minutes = minutes
    out_dir = Path(out_dir) if out_dir is not None else EMBEDDED["default-drafter"]
    lm_train_config(recipe, 0.0)  # bad recipe values fail here, before any work
    start = time.perf_counter()
    policy, tok = load_model("default", device="cpu")
    examples = _drafter_examples(policy, tok, recipe)
    model = _build_drafter(policy, tok, recipe)
    config = lm_train_config(recipe, 0.0, train_state_dir(out_dir), desc="train drafter LM",
                             max_minutes=_remaining_minutes(recipe.minutes, start))
    trainer = train_lm(model, examples, length_batches(examples, recipe.tokens_per_batch,
                                                       seed=recipe.seed),
                       tok.pad_token_id, config)
    record = {"command": f"workbench zoo train drafter-lm --seed {recipe.seed}",
              "recipe": asdict(recipe), "steps": trainer.step,
              "train_sequences": len(examples),
              "parameters": sum(p.numel() for p in model.parameters()),
              "final_loss": final_loss(trainer)}
    save_model(model, tok, out_dir, dtype=torch.float16)
    drafter_model, _ = load_model(out_dir, device="cpu")
    record["accept_len_greedy_k4"] = acceptance_on_heldout(policy, tok,
                                                           LMDrafter(drafter_model, tok))
    record["wall_time_s"] = round(time.perf_counter() - start, 1)
    _write_provenance(out_dir, record)
    trainer.discard_checkpoint()
    return record


@dataclass
class EagleRecipe:
    """EAGLE head of the default policy: harvest policy rollouts, then train_eagle."""

    seed: int = 0
    num_prompts: int = 4000
    steps: int = 5000
    batch_size: int = 32
    lr: float = 2e-3
    unroll: int = 2
    noise: float = 0.05
    state_units: str = "rms"
    minutes: float = 50.0           # training stops early when this wall-clock cap is hit


def train_eagle_head(out_dir=None, seed: int = 0, minutes: float | None = None,
                     recipe: EagleRecipe | None = None) -> dict:
    """Train the EAGLE head of the default policy into ``out_dir``."""
    from ..speculative import EagleDrafter, EagleHead
    from ..speculative.train import EagleTrainConfig, harvest_pairs, train_eagle

    recipe = recipe or EagleRecipe(seed=seed)
    if minutes is not None:
        recipe.minutes = minutes
    out_dir = Path(out_dir) if out_dir is not None else DEFAULT_EAGLE
    start = time.perf_counter()
    policy, tok = load_model("default", device="cpu")
    pairs = [p for run in policy_outputs(policy, tok, recipe.num_prompts, recipe.seed,
                                         harvest=True) for p in harvest_pairs(run)]
    cfg = EagleTrainConfig(steps=recipe.steps, batch_size=recipe.batch_size, lr=recipe.lr,
                           unroll=recipe.unroll, noise=recipe.noise, seed=recipe.seed,
                           state_units=recipe.state_units,
                           max_minutes=_remaining_minutes(recipe.minutes, start))
    head, history = train_eagle(policy, pairs, cfg, out_dir=out_dir)
    last = history.iloc[-20:].mean(numeric_only=True).to_dict()
    record = {"command": f"workbench zoo train eagle --seed {recipe.seed}",
              "recipe": asdict(recipe), "train_sequences": len(pairs),
              "parameters": sum(p.numel() for p in head.parameters()),
              "final": {k: round(v, 4) for k, v in last.items() if k != "step"},
              "accept_len_greedy_k4": acceptance_on_heldout(
                  policy, tok, EagleDrafter(EagleHead.from_pretrained(out_dir, policy))),
              "wall_time_s": round(time.perf_counter() - start, 1)}
    _write_provenance(out_dir, record)
    return record
