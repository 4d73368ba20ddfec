"""Recipe for the embedded default policy: a small GQA Llama trained on running-sum traces.

``workbench zoo train default`` runs it. The recipe is seeded end to end (problem stream, batch
order, initialisation), sized for 2 CPU cores (about 25 minutes), trains through the harness
(``workbench.train``), whose atomic checkpoint in ``<out_dir>.train_state`` lets an interrupted
run resume to the same weights, and ships the result in float16 with a provenance file.

Batches, the response-token LM loss and the harness config come from ``workbench.lm_train``,
which the small-LM drafter of any policy (``speculative.fit``) trains with too.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..atomic import write_json
from ..lm_train import final_loss, length_batches, lm_train_config, small_llama, train_lm
from ..tasks import HELDOUT_SEED, TRAIN_SEED, RunningSumTask
from ..train import Trainer, train_state_dir
from .tokenizer import build_char_tokenizer

__all__ = ["PolicyRecipe", "train_policy", "encode_examples"]


@dataclass
class PolicyRecipe:
    """Arguments of the default-policy recipe (defaults are what shipped in data/models/policy)."""

    seed: int = 0
    hidden_size: int = 256          # model width
    layers: int = 6                 # decoder layers
    heads: int = 8                  # query heads (head_dim = 32)
    kv_heads: int = 2               # GQA: 4 query heads share each KV head
    intermediate_size: int = 512    # SwiGLU width
    max_position: int = 512         # longest prompt + response the model is built for
    train_problems: int = 400_000   # size of the seeded problem pool (drawn with TRAIN_SEED)
    tokens_per_batch: int = 4096    # padded tokens per optimizer step
    steps: int = 1000               # optimizer steps (about 24 minutes on 2 cores)
    lr: float = 1.5e-3              # AdamW learning rate, constant after warm-up, so that a
                                    # run of N steps is exactly the first N steps of a longer one
    warmup: int = 100               # linear warm-up steps
    weight_decay: float = 0.05
    minutes: float = 45.0           # hard wall-clock cap; the run stops early if reached
    eval_problems: int = 500        # held-out problems (HELDOUT_SEED) for the final accuracy
    checkpoint_every_s: float = 300.0
    snapshot_every: int = 0         # >0: also save float16 snapshots to <out_dir>.snapshots/


def build_policy(recipe: PolicyRecipe, vocab_size: int, tokenizer):
    """A freshly initialised model of the recipe's architecture (seeded)."""
    return small_llama(vocab_size, tokenizer, recipe.hidden_size, recipe.layers, recipe.heads,
                       recipe.kv_heads, recipe.intermediate_size, recipe.max_position,
                       recipe.seed)


def encode_examples(problems, tokenizer) -> list[tuple[list[int], int]]:
    """``(ids, prompt_len)`` per problem: ``<s> prompt reference </s>``; loss is on the response."""
    out = []
    for p in problems:
        prompt = tokenizer(p.prompt)["input_ids"]
        response = tokenizer(p.reference, add_special_tokens=False)["input_ids"]
        out.append((prompt + response + [tokenizer.eos_token_id], len(prompt)))
    return out


def _resolve(out_dir, seed, minutes, recipe):
    from ..models import EMBEDDED
    recipe = recipe or PolicyRecipe(seed=seed)
    if minutes is not None:
        recipe.minutes = minutes
    out_dir = Path(out_dir) if out_dir is not None else EMBEDDED["default"]
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"out_dir {str(out_dir)!r} is an existing file; pass a folder")
    return recipe, out_dir


def _snapshots(recipe: PolicyRecipe, out_dir: Path, tokenizer):
    """``on_step`` hook saving float16 snapshots to ``<out_dir>.snapshots/step<N>``."""
    from ..models import save_model
    if not recipe.snapshot_every:
        return None
    folder = out_dir.with_name(out_dir.name + ".snapshots")

    def snap(trainer):
        if trainer.steps_done % recipe.snapshot_every == 0:
            save_model(trainer.model, tokenizer, folder / f"step{trainer.steps_done}",
                       dtype=torch.float16)
    return snap


def _provenance(recipe: PolicyRecipe, trainer: Trainer, model) -> dict:
    hist = trainer.history
    return {"command": f"workbench zoo train default --seed {recipe.seed}",
            "recipe": asdict(recipe), "steps": trainer.steps_done,
            "train_tokens": int(hist["tokens"].sum()) if len(hist) else 0,
            "wall_time_s": round(trainer.elapsed_s, 1), "final_loss": final_loss(trainer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def _evaluate_shipped(out_dir: Path, task, recipe: PolicyRecipe) -> dict:
    """Held-out accuracy of what ships: the float16 weights, loaded back as a user would."""
    from ..evaluate import evaluate_policy  # late: evaluate imports the rollout code
    from ..models import load_model
    shipped, tokenizer = load_model(out_dir, device="cpu")
    report = evaluate_policy(shipped, tokenizer,
                             task.generate(recipe.eval_problems, seed=HELDOUT_SEED))
    return {"heldout": report.summary(),
            "heldout_by_bucket": report.by_bucket().to_dict(orient="records")}


def train_policy(out_dir: str | os.PathLike | None = None, seed: int = 0,
                 minutes: float | None = None, recipe: PolicyRecipe | None = None) -> dict:
    """Train the default policy and save it (float16) with ``provenance.json`` into ``out_dir``.

    Resumes from ``<out_dir>.train_state`` when a previous run was interrupted (and removes it
    once the model is saved and scored). Returns the provenance record.
    """
    from ..models import save_model
    recipe, out_dir = _resolve(out_dir, seed, minutes, recipe)
    state = train_state_dir(out_dir)
    config = lm_train_config(recipe, recipe.weight_decay, state, desc="train policy",
                             checkpoint_every_s=recipe.checkpoint_every_s, log_every=20)
    tokenizer, task = build_char_tokenizer(), RunningSumTask()
    examples = encode_examples(task.generate(recipe.train_problems,
                                             seed=TRAIN_SEED + recipe.seed), tokenizer)
    batches = length_batches(examples, recipe.tokens_per_batch, seed=recipe.seed)
    model = build_policy(recipe, len(tokenizer), tokenizer)
    trainer = train_lm(model, examples, batches, tokenizer.pad_token_id, config,
                       on_step=_snapshots(recipe, out_dir, tokenizer))
    provenance = _provenance(recipe, trainer, model)
    save_model(model, tokenizer, out_dir, dtype=torch.float16,
               extra_files={"provenance.json": json.dumps(provenance, indent=2)})
    provenance.update(_evaluate_shipped(out_dir, task, recipe))
    write_json(out_dir / "provenance.json", provenance)
    trainer.discard_checkpoint()
    print(json.dumps(provenance["heldout"], indent=2))
    return provenance
