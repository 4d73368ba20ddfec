"""Recipe for the embedded default policy: a small GQA Llama trained on running-sum traces.

``workbench zoo train default`` runs it. The recipe is seeded end to end (problem stream, batch
order, initialisation), sized for 2 CPU cores (about 25 minutes), checkpoints atomically so an
interrupted run resumes, and ships the result in float16 with a provenance file.
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

from ..tasks import HELDOUT_SEED, TRAIN_SEED, RunningSumTask
from .tokenizer import build_char_tokenizer

__all__ = ["PolicyRecipe", "build_policy", "train_policy", "encode_examples", "length_batches",
           "response_lm_step"]


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
    torch.manual_seed(recipe.seed)
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


def _collate(examples, idx, pad_id: int):
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


def response_lm_step(model, opt, ids, labels, mask, lr: float) -> float:
    """One optimizer step of next-token cross-entropy on the labelled (response) tokens."""
    for g in opt.param_groups:
        g["lr"] = lr
    logits = model(input_ids=ids, attention_mask=mask).logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def _lr_at(step: int, recipe: PolicyRecipe) -> float:
    return recipe.lr * min(1.0, (step + 1) / recipe.warmup)


def _atomic_torch_save(obj, path: Path):
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train_policy(out_dir: str | os.PathLike | None = None, seed: int = 0,
                 minutes: float | None = None, recipe: PolicyRecipe | None = None) -> dict:
    """Train the default policy and save it (float16) with ``provenance.json`` into ``out_dir``.

    Resumes from ``<out_dir>.train_state.pt`` when a previous run was interrupted.
    Returns the provenance record.
    """
    from ..evaluate import evaluate_policy  # late: evaluate imports the rollout code
    from ..models import EMBEDDED, load_model, save_model

    recipe = recipe or PolicyRecipe(seed=seed)
    if minutes is not None:
        recipe.minutes = minutes
    out_dir = Path(out_dir) if out_dir is not None else EMBEDDED["default"]
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"out_dir {str(out_dir)!r} is an existing file; pass a folder")
    state_path = out_dir.with_name(out_dir.name + ".train_state.pt")
    torch.manual_seed(recipe.seed)

    tokenizer = build_char_tokenizer()
    task = RunningSumTask()
    problems = task.generate(recipe.train_problems, seed=TRAIN_SEED + recipe.seed)
    examples = encode_examples(problems, tokenizer)
    batches = length_batches(examples, recipe.tokens_per_batch, seed=recipe.seed)
    model = build_policy(recipe, len(tokenizer), tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95),
                            weight_decay=recipe.weight_decay)
    step, tokens_seen, elapsed = 0, 0, 0.0
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, tokens_seen, elapsed = state["step"], state["tokens"], state["elapsed_s"]
        print(f"resuming from {state_path} at step {step}")

    model.train()
    start = time.perf_counter() - elapsed
    last_ckpt = time.perf_counter()
    losses = []
    bar = tqdm(total=recipe.steps, initial=step, desc="train policy")
    while step < recipe.steps:
        if time.perf_counter() - start > recipe.minutes * 60:
            print(f"wall-clock cap of {recipe.minutes} min reached at step {step}")
            break
        ids, labels, mask = _collate(examples, batches[step % len(batches)],
                                     tokenizer.pad_token_id)
        losses.append(response_lm_step(model, opt, ids, labels, mask, _lr_at(step, recipe)))
        step += 1
        tokens_seen += int(mask.sum())
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{sum(losses[-20:]) / 20:.4f}")
            print(f"step {step} loss {sum(losses[-20:]) / 20:.4f} "
                  f"elapsed {time.perf_counter() - start:.0f}s", flush=True)
        if recipe.snapshot_every and step % recipe.snapshot_every == 0:
            save_model(model, tokenizer, out_dir.with_name(out_dir.name + ".snapshots") /
                       f"step{step}", dtype=torch.float16)
        if time.perf_counter() - last_ckpt > recipe.checkpoint_every_s:
            _atomic_torch_save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                "step": step, "tokens": tokens_seen,
                                "elapsed_s": time.perf_counter() - start}, state_path)
            last_ckpt = time.perf_counter()
    bar.close()
    wall_s = time.perf_counter() - start
    model.eval()

    provenance = {
        "command": f"workbench zoo train default --seed {recipe.seed}",
        "recipe": asdict(recipe), "steps": step, "train_tokens": tokens_seen,
        "wall_time_s": round(wall_s, 1), "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    save_model(model, tokenizer, out_dir, dtype=torch.float16,
               extra_files={"provenance.json": json.dumps(provenance, indent=2)})
    # Measure what ships: the float16-rounded weights, loaded back as a user would.
    shipped, shipped_tok = load_model(out_dir, device="cpu")
    report = evaluate_policy(shipped, shipped_tok,
                             task.generate(recipe.eval_problems, seed=HELDOUT_SEED))
    provenance["heldout"] = report.summary()
    provenance["heldout_by_bucket"] = report.by_bucket().to_dict(orient="records")
    tmp = out_dir / "provenance.json.tmp"
    tmp.write_text(json.dumps(provenance, indent=2))
    os.replace(tmp, out_dir / "provenance.json")
    if state_path.is_file():
        state_path.unlink()
    print(json.dumps(provenance["heldout"], indent=2))
    return provenance
