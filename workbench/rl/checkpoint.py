"""One atomic state file per RL loop: written whole or not at all, found again on resume.

The file is replaced by a rename (``atomic.atomic_file``), not its folder, so that what else
a run keeps in its folder (its TensorBoard log, ``workbench.scalar_log``) stays there;
a folder swapped whole by an older version and interrupted is still put back on resume."""
from __future__ import annotations

import os
import pickle
import re
import types
from pathlib import Path

import torch

from ..atomic import atomic_file, load_torch_file, recover_dir

__all__ = ["save_state", "has_state", "load_state", "saved_config", "load_pickled"]

# modules that moved (issue 37), for objects pickled under their old path: a staleness spool's
# observations (``rl.staleness.spool.Observation``) written by an older version, not yet read
MOVED_MODULES = {"workbench.rl.staleness_spool": "workbench.rl.staleness.spool"}

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
    return load_pickled(Path(path) / name, "the RL checkpoint",
                        f"delete the folder {str(path)!r} to start the run over, or restore the "
                        "file from a copy")


def saved_config(text: str) -> str:
    """A config's ``repr`` saved with a run (to refuse resuming it under another config), as
    this version writes it: ``RolloutConfig`` no longer has ``rl_step`` and ``harvest``
    (arguments of ``RolloutEngine.rollout`` now, which GRPO set per step whatever the config
    held), so a run saved before resumes."""
    return _ROLLOUT_REPR.sub(lambda m: _PER_CALL_FIELDS.sub("", m.group(0)), text)


class _MovedUnpickler(pickle.Unpickler):
    """Finds a class pickled in a module that has since moved (``MOVED_MODULES``)."""

    def find_class(self, module: str, name: str):
        return super().find_class(MOVED_MODULES.get(module, module), name)


_MOVED_PICKLE = types.ModuleType("workbench_moved_pickle")
_MOVED_PICKLE.__dict__.update({k: getattr(pickle, k) for k in pickle.__all__})
_MOVED_PICKLE.Unpickler = _MovedUnpickler


def load_pickled(path: str | os.PathLike, what: str, remedy: str):
    """A ``torch.save`` file of Python objects the workbench wrote itself (trusted), whose
    classes may have been pickled under a module's old path (``MOVED_MODULES``); a damaged
    file is a ``DamagedFileError`` naming ``what`` it holds and the ``remedy``."""
    return load_torch_file(path, what, remedy, weights_only=False, pickle_module=_MOVED_PICKLE)
