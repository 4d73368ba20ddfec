"""Load and save causal LMs with their tokenizers; ``"default"`` is the embedded policy.

Every model that crosses a boundary in the workbench is a Hugging Face model: it loads with
``AutoModelForCausalLM.from_pretrained`` and saves with ``save_pretrained``. The embedded models
live under ``data/models/`` (see data/README.md for how each was trained). There is no model
hub here, so a name is either one of :data:`EMBEDDED` or a local folder holding ``config.json``.
"""
from __future__ import annotations

import copy
import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from .atomic import atomic_dir

__all__ = ["DATA_DIR", "EMBEDDED", "DEFAULT_EAGLE", "resolve_model_path", "load_model", "save_model",
           "default_device"]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
EMBEDDED = {
    "default": DATA_DIR / "models" / "policy",              # the default policy
    "default-drafter": DATA_DIR / "models" / "drafter_lm",  # small-LM drafter of that policy
}
DEFAULT_EAGLE = DATA_DIR / "models" / "eagle_head"          # EAGLE head of that policy
RECIPE_OF = {"default": "default", "default-drafter": "drafter-lm"}  # `workbench zoo train NAME`

# What save_pretrained writes: weights (one of these, or shards), and a tokenizer file.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_model_path(name_or_path: str | os.PathLike) -> Path:
    """The folder of an embedded model name or a local HF model folder; a clear error if neither."""
    key = str(name_or_path)
    if key in EMBEDDED:
        path = EMBEDDED[key]
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"embedded model {key!r} is missing at {path}; rebuild it with "
                f"`workbench zoo train {RECIPE_OF[key]}`")
        return path
    path = Path(key).expanduser()
    accepted = (f"Accepted: {sorted(EMBEDDED)} or a local model folder saved with save_pretrained "
                "(config.json, weights, tokenizer files)")
    if path.is_file():
        folder = path.parent
        hint = (f"; did you mean load_model({str(folder)!r})?"
                if (folder / "config.json").is_file() else "")
        raise NotADirectoryError(f"model path {key!r} is a file, but a model folder is expected. "
                                 f"{accepted}{hint}")
    if path.is_dir() and (path / "config.json").is_file():
        return path
    why = "is a folder without config.json" if path.is_dir() else "does not exist"
    raise FileNotFoundError(
        f"unknown model {key!r}: it is not an embedded name and the path {why}. {accepted}")


def _fix_hint(path: Path) -> str:
    """How to rebuild a broken model folder: its zoo recipe if embedded, else a re-save."""
    for name, folder in EMBEDDED.items():
        if folder.resolve() == path.resolve():
            return f"rebuild it with `workbench zoo train {RECIPE_OF[name]}`"
    return "re-save the model with save_model(model, tokenizer, folder) or save_pretrained"


def _check_config(path: Path) -> None:
    config = path / "config.json"
    try:
        ok = isinstance(json.loads(config.read_text(encoding="utf-8")), dict)
    except (UnicodeDecodeError, json.JSONDecodeError):
        ok = False
    if not ok:
        raise ValueError(f"model config {str(config)!r} is truncated or corrupt (not a JSON "
                         f"object); {_fix_hint(path)}")


def _check_weights(path: Path) -> None:
    """A weights file is present and every safetensors header is whole (before any loading)."""
    shards = sorted(path.glob("*.safetensors"))
    if not shards and not any((path / name).is_file() for name in WEIGHT_FILES):
        raise FileNotFoundError(
            f"no weights in model folder {str(path)!r}: expected model.safetensors (what "
            f"save_pretrained writes), sharded *.safetensors with model.safetensors.index.json, "
            f"or pytorch_model.bin; {_fix_hint(path)}")
    for shard in shards:
        try:
            with safe_open(shard, framework="pt"):
                pass
        except Exception as exc:  # SafetensorError, OSError: the file cannot be read as safetensors
            raise ValueError(f"weights file {str(shard)!r} is truncated or corrupt ({exc}); "
                             f"{_fix_hint(path)}") from exc


def _load_tokenizer(path: Path):
    """The folder's tokenizer, checked for its files first; padding on the left."""
    present = [name for name in TOKENIZER_FILES if (path / name).is_file()]
    if not present:
        raise FileNotFoundError(
            f"no tokenizer in model folder {str(path)!r}: expected tokenizer.json (what "
            f"tokenizer.save_pretrained writes for a fast tokenizer) or a vocabulary file "
            f"({', '.join(TOKENIZER_FILES[1:])}); save the tokenizer with "
            f"tokenizer.save_pretrained(folder) or save_model(model, tokenizer, folder)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # tokenizers raises bare Exceptions for unreadable files
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(
            f"cannot load the tokenizer of {str(path)!r} ({type(exc).__name__}: {first_line}); "
            f"its tokenizer file(s) {present} may be truncated or corrupt; "
            f"{_fix_hint(path)}") from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _check_device(device) -> torch.device:
    accepted = "accepted: 'cpu', 'cuda', 'cuda:N', or None for the default"
    try:
        device = torch.device(device) if device is not None else default_device()
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a torch device; {accepted}") from exc
    if device.type == "cuda" and (not torch.cuda.is_available()
                                  or (device.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"device {str(device)!r} is not available on this machine "
                         f"({torch.cuda.device_count()} CUDA device(s)); use 'cpu' or None")
    return device


def load_model(name_or_path: str | os.PathLike = "default", device: str | torch.device | None = None,
               dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` in eval mode on ``device`` (CUDA when present, else CPU).

    Weights are cast to ``dtype`` (float32 by default, float64 for exactness tests, bfloat16
    on GPUs). The tokenizer pads on the left, as batched generation needs. The folder, its
    weights' headers and its tokenizer are checked before any weights load.
    """
    path = resolve_model_path(name_or_path)
    device = _check_device(device)
    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
        raise ValueError(f"dtype {dtype} is not a floating-point dtype; accepted: torch.float32, "
                         "torch.float64, torch.bfloat16, torch.float16")
    _check_config(path)
    _check_weights(path)
    tokenizer = _load_tokenizer(path)
    with _quiet_hf_bars():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, tokenizer


@contextmanager
def _quiet_hf_bars():
    """No "Loading weights" or "Writing model shards" bar per load or save: a small model
    loads and saves in milliseconds, and notebooks that load or save a dozen models would
    otherwise keep a wall of bars (transformers' own tqdm, frozen at 0% in a saved notebook).
    The caller's setting of transformers' progress bars comes back afterwards."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def save_model(model, tokenizer, path: str | os.PathLike, dtype: torch.dtype | None = None,
               extra_files: dict[str, str] | None = None) -> Path:
    """``save_pretrained`` model and tokenizer into ``path`` atomically.

    Everything is written into a temporary sibling folder that then replaces ``path``
    (:func:`workbench.atomic.atomic_dir`), so a crash never leaves a half-written checkpoint.
    ``dtype`` (e.g. float16) shrinks the files without touching the caller's model;
    ``extra_files`` maps file names to text to write alongside (provenance, metrics).
    """
    path = Path(path)
    with atomic_dir(path) as tmp:
        to_save = model
        if dtype is not None and next(model.parameters()).dtype != dtype:
            to_save = copy.deepcopy(model).to(dtype)
        with _quiet_hf_bars():
            to_save.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return path
