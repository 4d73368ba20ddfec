"""Recipe for the embedded default policy: a small GQA Llama trained on running-sum traces.

``workbench zoo train default`` runs it. The recipe is seeded end to end (problem stream, batch
order, initialisation), sized for 2 CPU cores (about 25 minutes), trains through the harness
(``workbench.train``), whose atomic checkpoint in ``<out_dir>.train_state`` lets an interrupted
run resume to the same weights, and ships the result in float16 with a provenance file.

The pieces (examples, length batches, the response-token LM loss, the harness config) are also
what the small-LM drafter recipe trains with.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from ..atomic import write_json
from ..tasks import HELDOUT_SEED, TRAIN_SEED, RunningSumTask
from ..train import TrainConfig, Trainer, isolated_rng, train_state_dir
from .tokenizer import build_char_tokenizer

__all__ = ["PolicyRecipe", "build_policy", "train_policy", "encode_examples", "length_batches",
           "collate", "response_lm_loss", "lm_batches", "lm_train_config", "train_lm",
           "final_loss"]


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


def build_policy(recipe: PolicyRecipe, vocab_size: int, tokenizer) -> LlamaForCausalLM:
    """A freshly initialised model of the recipe's architecture (seeded)."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
        max_position_embeddings=recipe.max_position, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0)
    with isolated_rng(recipe.seed):  # seeded, without reseeding the caller's global RNG
        return LlamaForCausalLM(config)


def encode_examples(problems, tokenizer) -> list[tuple[list[int], int]]:
    """``(ids, prompt_len)`` per problem: ``<s> prompt reference </s>``; loss is on the response."""
    out = []
    for p in problems:
        prompt = tokenizer(p.prompt)["input_ids"]
        response = tokenizer(p.reference, add_special_tokens=False)["input_ids"]
        out.append((prompt + response + [tokenizer.eos_token_id], len(prompt)))
    return out


def length_batches(examples, tokens_per_batch: int, seed: int) -> list[list[int]]:
    """Index batches of similar length (little padding), each under ``tokens_per_batch``, shuffled."""
    rng = random.Random(seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches = []
    chunk = 4096  # sort inside chunks: similar lengths per batch, still a random mix over time
    for c in range(0, len(order), chunk):
        part = sorted(order[c:c + chunk], key=lambda i: len(examples[i][0]))
        batch, longest = [], 0
        for i in part:
            n = len(examples[i][0])
            if batch and max(longest, n) * (len(batch) + 1) > tokens_per_batch:
                batches.append(batch)
                batch, longest = [], 0
            batch.append(i)
            longest = max(longest, n)
        if batch:
            batches.append(batch)
    rng.shuffle(batches)
    return batches


def collate(examples, idx, pad_id: int):
    """``(ids, labels, mask)`` of the examples ``idx``, right-padded; labels only on responses."""
    longest = max(len(examples[i][0]) for i in idx)
    ids = torch.full((len(idx), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(idx), longest), -100, dtype=torch.long)
    mask = torch.zeros((len(idx), longest), dtype=torch.long)
    for r, i in enumerate(idx):
        seq, plen = examples[i]
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, plen:len(seq)] = torch.tensor(seq[plen:])
        mask[r, :len(seq)] = 1
    return ids, labels, mask


def lm_batches(examples, batches: list[list[int]], pad_id: int):
    """The harness's batch source: step ``s`` trains on ``batches[s % len(batches)]``."""
    if not batches:
        raise ValueError("no batches: the example list is empty")
    return lambda step: collate(examples, batches[step % len(batches)], pad_id)


def response_lm_loss(model):
    """The harness's loss: next-token cross-entropy on the labelled (response) tokens; the
    padded tokens of the batch are reported as ``tokens``."""
    def loss_fn(batch, generator):
        ids, labels, mask = batch
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return loss, {"tokens": int(mask.sum())}
    return loss_fn


def lm_train_config(recipe, weight_decay: float, checkpoint_dir=None, desc: str = "train",
                    **kw) -> TrainConfig:
    """The LM recipes' optimisation: AdamW betas (0.9, 0.95), linear warm-up then a constant LR
    (so a run of N steps is exactly the first N steps of a longer one), clipping at 1.0.
    ``kw`` sets or overrides other :class:`TrainConfig` fields."""
    fields = dict(steps=recipe.steps, lr=recipe.lr, schedule="constant", warmup=recipe.warmup,
                  betas=(0.9, 0.95), weight_decay=weight_decay, clip_norm=1.0, seed=recipe.seed,
                  max_minutes=recipe.minutes, checkpoint_dir=checkpoint_dir, desc=desc)
    return TrainConfig(**{**fields, **kw})


def train_lm(model, examples, batches, pad_id: int, config: TrainConfig, on_step=None) -> Trainer:
    """Train ``model`` on ``examples`` (resuming from ``config.checkpoint_dir`` if it holds a
    checkpoint); returns the trainer, whose history holds the losses and token counts."""
    trainer = Trainer(model, response_lm_loss(model), lm_batches(examples, batches, pad_id),
                      config, on_step=on_step)
    trainer.run()
    return trainer


def final_loss(trainer: Trainer, last: int = 20) -> float:
    """Mean loss of the last ``last`` steps (NaN before any step)."""
    losses = trainer.history["loss"].tail(last)
    return float(losses.mean()) if len(losses) else float("nan")


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
        if trainer.step % recipe.snapshot_every == 0:
            save_model(trainer.model, tokenizer, folder / f"step{trainer.step}",
                       dtype=torch.float16)
    return snap


def _provenance(recipe: PolicyRecipe, trainer: Trainer, model) -> dict:
    hist = trainer.history
    return {"command": f"workbench zoo train default --seed {recipe.seed}",
            "recipe": asdict(recipe), "steps": trainer.step,
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
