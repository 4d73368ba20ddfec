"""One atomic state file per RL loop: written whole or not at all, found again on resume."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..atomic import atomic_dir, load_torch_file, recover_dir

__all__ = ["save_state", "has_state", "load_state"]


def save_state(path: str | os.PathLike, name: str, state: dict) -> Path:
    """Write ``state`` to ``path/name`` by a folder swap: an interruption leaves the previous."""
    path = Path(path)
    with atomic_dir(path) as tmp:
        torch.save(state, tmp / name)
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
