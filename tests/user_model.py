"""A user's own checkpoint, as a researcher brings one: a tiny random Llama-family model saved
with ``save_pretrained`` beside its own byte-level BPE tokenizer (not the workbench's).

Why: the workbench must run on folders it did not write. transformers 5 loads the tokenizer of
some families (``model_type`` qwen2 among them) as the family's class, which rebuilds the
pre-tokenizer by its own rules; a BPE trained here merges numbers (``" 19"`` is one token), so
any such substitution changes the encoding and shows. Everything is generated and seeded: the
training text, the merges, the weights; a folder is built in a few tens of milliseconds.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM)

from workbench.tasks import TRAIN_SEED, get_problems

__all__ = ["ARCHS", "TINY_CONFIG", "EOS", "PAD", "word_problems", "user_texts", "bpe_tokenizer",
           "save_user_model"]

EOS, PAD = "<|endoftext|>", "<|pad|>"
ARCHS = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
         "mistral": (MistralConfig, MistralForCausalLM)}
# hidden 64, 2 layers, 4 query heads sharing 2 key/value heads (GQA), context 512
TINY_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)

_NAMES = ("Ada", "Ben", "Chloé", "Dmitri", "Emma", "Farid", "Grace", "Hiro", "Inès", "Jonas")
_ITEMS = ("apple", "book", "marble", "coin", "stamp", "pencil", "card", "shell", "egg", "ticket")
_WORDS = ("the a of and to in is was for on that with as by at from it be this are or have not "
          "one all but they which you were can what so up out if about who make like time just "
          "know take people into year good some could them see other than then now look only "
          "come over think also back after use two how work first well way even new want give "
          "day most total sum each more less left many answer step number").split()


def _word_problem(rng: random.Random) -> dict:
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    a, b = rng.randint(2, 99), rng.randint(2, 60)
    kind = rng.randrange(4)
    if kind == 0:
        return {"prompt": f"{name} has {a} {item}s and buys {b} more. How many {item}s does "
                          f"{name} have now?", "answer": str(a + b)}
    if kind == 1:
        a, b = max(a, b), min(a, b)
        return {"prompt": f"{name} had {a} {item}s and gave {b} to {other}. How many {item}s "
                          f"are left?", "answer": str(a - b)}
    if kind == 2:
        b = b % 12 + 2
        return {"prompt": f"A box holds {a} {item}s. How many {item}s are in {b} boxes?",
                "answer": str(a * b)}
    return {"prompt": f"{name} reads {a} pages a day for {b % 9 + 2} days. How many pages is "
                      f"that in total?", "answer": str(a * (b % 9 + 2))}


def word_problems(n: int, seed: int = 0) -> list[dict]:
    """``n`` word problems as a user's JSONL task holds them: ``{"prompt", "answer"}`` dicts."""
    rng = random.Random(seed)
    return [_word_problem(rng) for _ in range(n)]


def user_texts(n: int = 200, seed: int = 0) -> list[str]:
    """Training text for a user's tokenizer: running-sum prompts with their worked references,
    word problems with their answers, sums of numbers up to 1999 (so that frequent ones such as
    " 19" merge into single tokens) and plain words in mixed case."""
    rng = random.Random(seed)
    texts = [p.prompt + p.reference for p in get_problems("running_sum", n, seed=TRAIN_SEED + seed)]
    texts += [f"{q['prompt']} #{q['answer']}" for q in word_problems(n, seed)]
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.choice((rng.randint(0, 99), rng.randint(100, 999)))
        texts.append(f"{a} + {b} = {a + b}, {b} - {a} = {b - a}; {rng.randint(1000, 1999)}.")
        words = rng.choices(_WORDS, k=12)
        texts.append(" ".join(w.capitalize() if rng.random() < 0.2 else w for w in words) + ".\n")
    return texts


def bpe_tokenizer(texts: list[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``texts``: 256 byte symbols, EOS and PAD, and merges up to
    ``vocab_size`` (fewer if the text runs out of pairs); deterministic for the same text."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, pad_token=PAD)


def save_user_model(folder: str | Path, arch: str = "qwen2",
                    tokenizer: PreTrainedTokenizerFast | None = None, *, seed: int = 0,
                    **config_overrides) -> Path:
    """Write a tiny random ``arch`` model (:data:`TINY_CONFIG`, float32) and ``tokenizer`` (by
    default a BPE trained on :func:`user_texts`) into ``folder`` with ``save_pretrained``, as a
    user would, not through the workbench. ``config_overrides`` go to the config
    (e.g. ``tie_word_embeddings=True``); ``seed`` fixes the weights without touching the
    caller's random state."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; accepted: {sorted(ARCHS)}")
    tokenizer = tokenizer if tokenizer is not None else bpe_tokenizer(user_texts())
    config_class, model_class = ARCHS[arch]
    config = config_class(**{**TINY_CONFIG, "vocab_size": len(tokenizer),
                             "eos_token_id": tokenizer.eos_token_id,
                             "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None,
                             **config_overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).eval()
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
