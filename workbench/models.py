"""Load and save causal LMs with their tokenizers; ``"default"`` is the embedded policy.

Every model that crosses a boundary in the workbench is a Hugging Face model: it loads with
``AutoModelForCausalLM.from_pretrained`` and saves with ``save_pretrained``. The embedded models
live under ``data/models/`` (see data/README.md for how each was trained). There is no model
hub here, so a name is either one of :data:`EMBEDDED` or a local folder holding ``config.json``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

__all__ = ["DATA_DIR", "EMBEDDED", "DEFAULT_EAGLE", "resolve_model_path", "load_model", "save_model",
           "default_device"]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
EMBEDDED = {
    "default": DATA_DIR / "models" / "policy",              # the default policy
    "default-drafter": DATA_DIR / "models" / "drafter_lm",  # small-LM drafter of that policy
}
DEFAULT_EAGLE = DATA_DIR / "models" / "eagle_head"          # EAGLE head of that policy


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
                f"`workbench zoo train {key}`")
        return path
    path = Path(key).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    why = "is a folder without config.json" if path.is_dir() else "does not exist"
    raise FileNotFoundError(
        f"unknown model {key!r}: it is not an embedded name and the path {why}. Accepted: "
        f"{sorted(EMBEDDED)} or a local folder saved with save_pretrained (config.json, weights, "
        "tokenizer files)")


def load_model(name_or_path: str | os.PathLike = "default", device: str | torch.device | None = None,
               dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` in eval mode on ``device`` (CUDA when present, else CPU).

    Weights are cast to ``dtype`` (float32 by default, float64 for exactness tests, bfloat16
    on GPUs). The tokenizer pads on the left, as batched generation needs.
    """
    path = resolve_model_path(name_or_path)
    device = torch.device(device) if device is not None else default_device()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def save_model(model, tokenizer, path: str | os.PathLike, dtype: torch.dtype | None = None,
               extra_files: dict[str, str] | None = None) -> Path:
    """``save_pretrained`` model and tokenizer into ``path`` atomically.

    Everything is written into a temporary sibling folder that then replaces ``path``, so a
    crash never leaves a half-written checkpoint. ``dtype`` (e.g. float16) shrinks the files
    without touching the caller's model; ``extra_files`` maps file names to text to write
    alongside (provenance, metrics).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"cannot save a model to {str(path)!r}: it is an existing file")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a shared checkpoint should be readable
    try:
        to_save = model
        if dtype is not None and next(model.parameters()).dtype != dtype:
            import copy
            to_save = copy.deepcopy(model).to(dtype)
        to_save.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
