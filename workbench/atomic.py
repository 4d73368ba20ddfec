"""Atomic writes of files and folders: a reader (or a resumed run) sees the old version or the
new one, never half of either.

A file is written to a temporary sibling and renamed over the target (``os.replace`` is atomic
on one file system). A folder is built in a temporary sibling; the old folder, if any, is first
renamed aside, the new one renamed into place, and only then is the old one deleted. An
interruption between those two renames leaves the old folder at ``.<name>.old``, which
:func:`recover_dir` (called by :func:`atomic_dir` itself) puts back before the next write.
Every writer of the workbench goes through these helpers.

Atomic writes cannot stop a file from being damaged afterwards (a full disk during a copy, a
partial download, a file written by something else). :func:`load_torch_file` is the reading
side: every ``torch.save`` file the workbench reads back (checkpoints, drafter heads) goes
through it, so a truncated or empty file gets one :class:`DamagedFileError` that names the
file and what to do, instead of torch's ``PytorchStreamReader failed reading zip archive`` or
``EOFError``, which name no file.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_file", "atomic_dir", "load_torch_file", "DamagedFileError"]

# what torch.load raises on a damaged file, depending on where the damage lies
_LOAD_ERRORS = (RuntimeError, EOFError, OSError, KeyError, pickle.UnpicklingError,
                zipfile.BadZipFile)


def _check_parent(path: Path, what: str) -> None:
    if path.exists() and path.is_dir() != (what == "folder"):
        kind = "folder" if path.is_dir() else "file"
        raise FileExistsError(f"cannot write a {what} to {str(path)!r}: it is an existing {kind}")
    path.parent.mkdir(parents=True, exist_ok=True)


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on a clean exit it replaces ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    _check_parent(path, "file")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are meant to be shared
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _old(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def recover_dir(path: str | os.PathLike) -> None:
    """Put back a folder that an interrupted :func:`atomic_dir` left renamed aside."""
    path = Path(path)
    old = _old(path)
    if old.is_dir():
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, path)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder next to ``path``; on a clean exit it replaces ``path``.

    On an exception the temporary folder is removed and ``path`` is left as it was.
    """
    path = Path(path)
    _check_parent(path, "folder")
    recover_dir(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tmp.chmod(0o755)
        yield tmp
        if path.exists():
            old = _old(path)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike, obj, indent: int = 2) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (serialised before anything is touched)."""
    return write_text(path, json.dumps(obj, indent=indent))


class DamagedFileError(ValueError):
    """A file the workbench wrote can no longer be read: truncated, empty, or overwritten by
    something that is not what was saved there. The message names the file and what to do."""


def _damage(path: Path) -> str | None:
    """Why ``path`` cannot be a ``torch.save`` file, or None when it looks whole. torch.save
    writes a zip archive whose directory sits at the end, so a truncated file has none."""
    size = path.stat().st_size
    if size == 0:
        return "it is empty (0 bytes)"
    if not zipfile.is_zipfile(path):
        return f"it is truncated or not a torch file ({size:,} bytes, no complete zip archive)"
    return None


def load_torch_file(path: str | os.PathLike, what: str, remedy: str | None = None, *,
                    weights_only: bool = True, map_location="cpu", pickle_module=None):
    """``torch.load(path)``, or a :class:`DamagedFileError` naming ``path``, ``what`` it holds
    (e.g. ``"the trainer checkpoint"``) and the ``remedy`` (default: delete it, or its folder
    to start over, or restore it from a copy) when the file is empty, truncated or not a torch
    file. ``weights_only=False`` only for files the workbench wrote itself (it unpickles
    Python objects, through ``pickle_module`` when given). A missing file is a ``FileNotFoundError`` naming it."""
    import torch

    path = Path(path)
    remedy = remedy or "delete it (or its folder, to start over) or restore it from a copy"
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    why = _damage(path)
    if why is not None:
        raise DamagedFileError(f"{what} {str(path)!r} is damaged: {why}; {remedy}")
    try:
        extra = {} if pickle_module is None else {"pickle_module": pickle_module}
        return torch.load(path, map_location=map_location, weights_only=weights_only, **extra)
    except _LOAD_ERRORS as exc:  # a whole archive whose contents do not read
        first = (str(exc).splitlines() or [""])[0][:200]
        raise DamagedFileError(f"{what} {str(path)!r} cannot be read ({type(exc).__name__}: "
                               f"{first}): it is damaged or not what the workbench saved "
                               f"there; {remedy}") from exc
