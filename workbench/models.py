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
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from .atomic import atomic_dir

__all__ = ["DEFAULT_EAGLE", "load_model", "save_model", "tokenizer_mismatch", "resolve_model_path"]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
EMBEDDED = {
    "default": DATA_DIR / "models" / "policy",              # the default policy
    "default-drafter": DATA_DIR / "models" / "drafter_lm",  # small-LM drafter of that policy
}
DEFAULT_EAGLE = DATA_DIR / "models" / "eagle_head"          # EAGLE head of that policy
"""The folder of the default policy's EAGLE head."""
RECIPE_OF = {"default": "default", "default-drafter": "drafter-lm"}  # `workbench zoo train NAME`

# What save_pretrained writes: weights (one of these, or shards), and a tokenizer file.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")

# What pre-tokenizers disagree on: digits in runs (" 19", "1024"), single and repeated spaces,
# tabs, newlines (also \r\n), punctuation, mixed case, accented and non-Latin letters.
TOKENIZER_PROBE = ("Q: a3 b19 c7? Sum 19+7=26; 1024 - 9.5% = 1014.5!\n\n"
                   "  Indented\ttab, MiXeD Case, 'quotes' \"and\" (brackets) [x] {y}\r\n"
                   "naïve café, Straße, ÆØÅ, 東京, ¿qué? #42")
# What a plain AutoTokenizer.from_pretrained is told, in turn, when it would not load a folder's
# own tokenizer.json faithfully (see _pin_tokenizer_class).
FAITHFUL_TOKENIZER_CONFIG = ({"tokenizer_class": "PreTrainedTokenizerFast"},
                             {"auto_map": {"AutoTokenizer": [None, "PreTrainedTokenizerFast"]}})


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


def tokenizer_mismatch(tokenizer, folder: str | os.PathLike) -> str | None:
    """How ``tokenizer`` encodes :data:`TOKENIZER_PROBE` unlike ``folder``'s own tokenizer.json
    (special tokens aside), or None when the encodings are identical.

    Why: transformers 5 loads the folder of some families (``model_type`` qwen2 among them) as
    that family's tokenizer class, which keeps the vocabulary of tokenizer.json but rebuilds the
    pre-tokenizer by its own rules, so a user's byte-level BPE splits " 19" into "Ġ", "1", "9"
    where its tokenizer.json has "Ġ19", and the model reads text it was never trained on. A
    folder without tokenizer.json (sentencepiece or vocab files only) has nothing to compare: None.
    """
    file = Path(folder) / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        reference = Tokenizer.from_file(str(file)).encode(TOKENIZER_PROBE, add_special_tokens=False)
    except Exception as exc:  # tokenizers raises bare Exceptions for unreadable files
        raise ValueError(f"tokenizer file {str(file)!r} is truncated or corrupt ({exc}); "
                         f"{_fix_hint(Path(folder))}") from exc
    ids = tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    if ids == reference.ids:
        return None
    at = next((i for i, (a, b) in enumerate(zip(ids, reference.ids)) if a != b),
              min(len(ids), len(reference.ids)))
    return (f"{type(tokenizer).__name__} encodes the probe text in {len(ids)} tokens, "
            f"tokenizer.json in {len(reference.ids)}; from token {at}: "
            f"{tokenizer.convert_ids_to_tokens(ids[at:at + 4])} where tokenizer.json has "
            f"{reference.tokens[at:at + 4]}")


def _load_tokenizer(path: Path):
    """The folder's tokenizer, checked for its files first; padding on the left.

    When transformers substitutes a family class that encodes unlike the folder's tokenizer.json
    (:func:`tokenizer_mismatch`), the folder's own tokenizer.json is loaded instead, with the
    special tokens of its tokenizer_config.json / special_tokens_map.json, and one line says so.
    """
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
    mismatch = tokenizer_mismatch(tokenizer, path)
    if mismatch is not None:
        own = PreTrainedTokenizerFast.from_pretrained(path)
        still = tokenizer_mismatch(own, path)
        if still is not None:
            raise ValueError(
                f"the tokenizer of {str(path)!r} does not reproduce its own tokenizer.json: "
                f"{mismatch}; loaded as PreTrainedTokenizerFast it still differs ({still}). "
                "Its tokenizer_config.json or special_tokens_map.json disagree with "
                f"tokenizer.json (added tokens?); {_fix_hint(path)}")
        print(f"load_model: transformers picked {type(tokenizer).__name__} for {str(path)!r}, "
              "which encodes unlike the folder's tokenizer.json; the folder's own tokenizer.json "
              "is used instead (PreTrainedTokenizerFast)")
        tokenizer = own
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


def _pin_tokenizer_class(folder: Path, target: Path) -> None:
    """Make a plain ``AutoTokenizer.from_pretrained(folder)`` encode like the folder's
    tokenizer.json, so the checkpoint reloads right outside the workbench too.

    Declaring ``tokenizer_class`` is enough where the family's class is only a default; for the
    families transformers 5 forces its own class on (qwen2 among them) only an ``auto_map`` entry
    makes it read tokenizer_config.json's class (a reader passing ``trust_remote_code=True``
    then gets an error from transformers, never a silent misencoding). Each is added only if the
    reload, checked, still differs; the folder is temporary, so nothing reaches ``target`` when
    none suffices.
    """
    if not (folder / "tokenizer.json").is_file():
        return  # a slow tokenizer's files: nothing to check against
    mismatch = tokenizer_mismatch(AutoTokenizer.from_pretrained(folder), folder)
    config_file = folder / "tokenizer_config.json"
    for declaration in FAITHFUL_TOKENIZER_CONFIG:
        if mismatch is None:
            break
        config = (json.loads(config_file.read_text(encoding="utf-8"))
                  if config_file.is_file() else {})
        config_file.write_text(json.dumps({**config, **declaration}, indent=2, ensure_ascii=False)
                               + "\n", encoding="utf-8")
        mismatch = tokenizer_mismatch(AutoTokenizer.from_pretrained(folder), folder)
    if mismatch is not None:
        raise ValueError(
            f"not saving {str(target)!r}: AutoTokenizer.from_pretrained would not reload its "
            f"tokenizer faithfully ({mismatch}), even with tokenizer_config.json declaring "
            "PreTrainedTokenizerFast as its tokenizer_class and in auto_map; pass a "
            "PreTrainedTokenizerFast whose tokenizer.json holds the whole pipeline")


def save_model(model, tokenizer, path: str | os.PathLike, dtype: torch.dtype | None = None,
               extra_files: dict[str, str] | None = None) -> Path:
    """``save_pretrained`` model and tokenizer into ``path`` atomically.

    Everything is written into a temporary sibling folder that then replaces ``path``
    (:func:`workbench.atomic.atomic_dir`), so a crash never leaves a half-written checkpoint.
    ``dtype`` (e.g. float16) shrinks the files without touching the caller's model;
    ``extra_files`` maps file names to text to write alongside (provenance, metrics). The
    tokenizer_config.json is completed, where needed, so that a plain
    ``AutoTokenizer.from_pretrained`` encodes like the saved tokenizer.json (checked before the
    folder replaces ``path``).
    """
    path = Path(path)
    with atomic_dir(path) as tmp:
        to_save = model
        if dtype is not None and next(model.parameters()).dtype != dtype:
            to_save = copy.deepcopy(model).to(dtype)
        with _quiet_hf_bars():
            to_save.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _pin_tokenizer_class(tmp, path)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return path
