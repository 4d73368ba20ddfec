"""One atomic state file per RL loop: written whole or not at all, found again on resume.

The file is replaced by a rename (``atomic.atomic_file``), not its folder, so that what else
a run keeps in its folder (its TensorBoard log, ``workbench.scalar_log``) stays there;
a folder swapped whole by an older version and interrupted is still put back on resume."""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ..atomic import atomic_file, load_torch_file, recover_dir

__all__ = ["save_state", "has_state", "load_state", "saved_config"]

_ROLLOUT_REPR = re.compile(r"RolloutConfig\([^()]*\)")
_PER_CALL_FIELDS = re.compile(r"\b(?:rl_step=\d+|harvest=(?:True|False)), ")


def save_state(path: str | os.PathLike, name: str, state: dict) -> Path:
    """Write ``state`` to ``path/name`` by a rename: an interruption leaves the previous."""
    path = Path(path)
    recover_dir(path)
    path.mkdir(parents=True, exist_ok=True)
    with atomic_file(path / name) as tmp:
        torch.save(state, tmp)
    return path


def has_state(path: str | os.PathLike, name: str) -> bool:
    recover_dir(path)  # a swap interrupted between its two renames left the last state aside
    return (Path(path) / name).is_file()


def load_state(path: str | os.PathLike, name: str) -> dict:
    """The state in ``path/name`` (it holds Python objects such as a schedule: trusted files);
    a damaged file is a ``DamagedFileError`` naming it and saying what to do."""
    return load_torch_file(Path(path) / name, "the RL checkpoint",
                           f"delete the folder {str(path)!r} to start the run over, or restore "
                           "the file from a copy", weights_only=False)


def saved_config(text: str) -> str:
    """A config's ``repr`` saved with a run (to refuse resuming it under another config), as
    this version writes it: ``RolloutConfig`` no longer has ``rl_step`` and ``harvest``
    (arguments of ``RolloutEngine.rollout`` now, which GRPO set per step whatever the config
    held), so a run saved before resumes."""
    return _ROLLOUT_REPR.sub(lambda m: _PER_CALL_FIELDS.sub("", m.group(0)), text)
