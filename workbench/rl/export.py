"""What RL leaves behind, as models: the drafter (a by-product: export it, and measure it
against the pre-RL drafter) and the policy of any RL checkpoint (a deployable model, or the
start of another run).

After RL the adaptive drafter is aligned with the final policy; the drafter trained only
before RL is aligned with the starting one. :func:`probe_acceptance` measures both (or any
drafters) on the same held-out prompts with the same policy, engine and sampling, so the rows
differ in the drafter only.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from ..rollout import RolloutConfig, RolloutEngine, StaticSchedule
from ..speculative.measure import acceptance_length

__all__ = ["export_drafter", "export_policy", "probe_acceptance"]


def export_drafter(trainer, path: str | os.PathLike) -> Path:
    """Save the serving drafter of a :class:`~workbench.rl.tlt.TLTTrainer` (atomically);
    ``EagleHead.from_pretrained(path, policy)`` loads it onto the final policy."""
    if trainer.drafter is None:
        raise ValueError("this run has no drafter (the baseline variant); export a "
                         "speculative variant's")
    return trainer.drafter.head.save_pretrained(path)


def export_policy(checkpoint: str | os.PathLike, path: str | os.PathLike,
                  model: str | os.PathLike = "default") -> Path:
    """Save the policy of an RL checkpoint as an HF model folder (atomically), with a
    ``provenance.json`` naming the checkpoint and its RL step.

    ``checkpoint`` is the state file of a GRPO, TLT, remedy or staleness run, or the folder
    holding it; ``model`` is the policy the run started from (its architecture and
    tokenizer: the weights come from the checkpoint). ``load_model(path)`` loads the result,
    and every notebook's ``model`` parameter takes it: a run that starts where another one
    stood (notebook 11's long run starts mid-RL, from a 200-step RL policy)."""
    from ..models import load_model, save_model
    from .checkpoint import load_state
    source = Path(checkpoint)
    files = sorted(source.glob("*.pt")) if source.is_dir() else [source]
    if len(files) != 1 or not files[0].is_file():
        raise ValueError(f"checkpoint {str(checkpoint)!r}: accepted an RL run's state file "
                         f"(*.pt) or the folder holding exactly one; found "
                         f"{[f.name for f in files]}")
    state = load_state(files[0].parent, files[0].name)
    grpo = state.get("grpo", state)
    if not isinstance(grpo, dict) or "model" not in grpo.get("trainer", {}):
        raise ValueError(f"{str(files[0])!r} holds no RL policy (keys {sorted(state)}); accepted "
                         "the state file of a GRPO, TLT, remedy or staleness run")
    policy, tokenizer = load_model(model, device="cpu")
    _check_same_architecture(grpo["trainer"]["model"], policy, files[0], model)
    policy.load_state_dict(grpo["trainer"]["model"])
    provenance = {"checkpoint": str(files[0]), "rl_step": int(grpo["rl_step"]),
                  "base_model": str(model)}
    return save_model(policy, tokenizer, path,
                      extra_files={"provenance.json": json.dumps(provenance, indent=2) + "\n"})


def _check_same_architecture(weights: dict, policy, checkpoint: Path, model) -> None:
    """Refuse a checkpoint whose policy is not of ``model``'s architecture, naming both and
    the weights that differ (missing, unexpected, of another shape), before anything is
    written: torch's own error names neither the checkpoint nor the model."""
    own = policy.state_dict()
    shapes = [f"{k} {tuple(weights[k].shape)} in the checkpoint, {tuple(own[k].shape)} in "
              "the model" for k in sorted(own.keys() & weights.keys())
              if tuple(weights[k].shape) != tuple(own[k].shape)]
    differ = [f"{what}: {_some(keys)}" for what, keys in (
        ("missing from the checkpoint", sorted(own.keys() - weights.keys())),
        ("not in the model", sorted(weights.keys() - own.keys())),
        ("of another shape", shapes)) if keys]
    if differ:
        raise ValueError(f"checkpoint {str(checkpoint)!r} holds a policy of another "
                         f"architecture than model {str(model)!r}:\n  " + "\n  ".join(differ)
                         + "\naccepted: as model, the policy the run started from")


def _some(items: list, shown: int = 5) -> str:
    """The first ``shown`` of ``items``, and how many more (a model has hundreds of weights)."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


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
