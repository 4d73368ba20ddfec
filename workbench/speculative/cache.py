"""Where drafters fitted on the spot are kept, and how a model is recognised.

A drafter learns one policy's outputs on one task, so it is cached under the policy's
*fingerprint* (a hash of its config and weights: a fine-tuned or RL-updated policy is another
model) and the task's key (a named task, or a JSONL file's name and content hash):
``$WORKBENCH_CACHE/drafters/<fingerprint>/<kind>-<task key>/`` (``WORKBENCH_CACHE`` defaults
to ``~/.cache/workbench``). The next run on the same model and task finds it there.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from functools import lru_cache
from pathlib import Path

import torch

__all__ = ["cache_root", "model_fingerprint", "fitted_dir"]

CACHE_ENV = "WORKBENCH_CACHE"
# config entries that say how a model runs, not what it computes
_RUNTIME_KEYS = {"transformers_version", "dtype", "torch_dtype", "use_cache",
                 "output_attentions", "output_hidden_states", "return_dict"}


def cache_root() -> Path:
    """The folder of cached drafters: ``$WORKBENCH_CACHE/drafters``, by default
    ``~/.cache/workbench/drafters``."""
    base = os.environ.get(CACHE_ENV) or "~/.cache/workbench"
    return Path(base).expanduser() / "drafters"


def _config_text(model) -> str:
    config = {k: v for k, v in model.config.to_dict().items()
              if not k.startswith("_") and k not in _RUNTIME_KEYS}
    return json.dumps(config, sort_keys=True, default=str)


def model_fingerprint(model) -> str:
    """A 16-hex-digit hash of ``model``'s config and weights.

    Weights are hashed as float32 on the CPU, so one checkpoint loaded in float32 or float64
    (the exactness checks) has one fingerprint; where it was loaded from does not count.
    """
    digest = hashlib.sha256(_config_text(model).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        values = tensor.detach().to("cpu", torch.float32).contiguous()
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def _default_fingerprint() -> str | None:
    from ..models import load_model
    try:
        policy, _ = load_model("default", device="cpu")
    except FileNotFoundError:  # the embedded policy is not built: nothing is the default
        return None
    return model_fingerprint(policy)


def is_default_policy(fingerprint: str) -> bool:
    """Whether a model of ``fingerprint`` is the embedded default policy (whose drafters ship
    in ``data/models/``)."""
    return fingerprint == _default_fingerprint()


def task_key(task) -> str:
    """A folder-safe name of a task: the embedded task's name, or a JSONL file's stem and the
    hash of its content (an edited file is another task)."""
    from ..tasks import TASKS, get_problems
    get_problems(task, 0)  # an unknown task or a bad file fails here, with its own message
    if isinstance(task, str) and task in TASKS:
        return TASKS[task]().name
    path = Path(task)
    content = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', path.stem)}-{content}"


def fitted_dir(fingerprint: str, kind: str, task, root: str | os.PathLike | None = None) -> Path:
    """The cache folder of a ``kind`` drafter fitted to the model ``fingerprint`` on ``task``."""
    root = Path(root) if root is not None else cache_root()
    return root / fingerprint / f"{kind}-{task_key(task)}"
