"""Backends by name: what ``backend="ray"`` means wherever a user picks where workers run.

GRPO, the TLT trainer, the ablation and the notebooks take ``backend``: a name of
:data:`BACKENDS` or a backend object (``rollout.backend.Backend``); :func:`make_backend`
turns it into the object the rollout engine holds. A name is checked, and a Ray backend
built, before anything starts: building a :class:`~workbench.rollout.ray_backend.RayBackend`
reaches no cluster and starts no actor (its ``start`` does).
"""
from __future__ import annotations

import os
from pathlib import Path

from .backend import Backend, LocalBackend

__all__ = ["make_backend", "BACKENDS"]

BACKENDS = ("local", "ray")
"""The rollout backends `make_backend` builds, by name."""


def make_backend(backend: str | Backend = "local", address: str | None = None,
                 run_dir: str | os.PathLike | None = None, **ray_options) -> Backend:
    """The backend ``backend`` names, or ``backend`` itself when it is a backend object.

    ``"local"``: a :class:`~workbench.rollout.backend.LocalBackend` (workers one after another
    in this process, the sim clock). ``"ray"``: a ``RayBackend(address, **ray_options)``
    (actors really in parallel, the wall clock); ``address`` None means ``$RAY_ADDRESS``, and
    without it a local Ray on 127.0.0.1; ``ray_options`` are RayBackend's ``num_cpus``,
    ``threads_per_worker`` and ``log_dir``. ``run_dir``, the folder of the run the backend
    serves, whatever the choice: a local Ray keeps its logs in ``run_dir/ray`` (unless
    ``log_dir`` says otherwise), so that a notebook's run folder holds them. ``address`` and
    ``ray_options`` are refused with any other choice (a ValueError names them), as is a name
    not in :data:`BACKENDS`.
    """
    if not isinstance(backend, str):
        if not isinstance(backend, Backend):
            raise ValueError(f"backend must be one of {list(BACKENDS)} or a backend object "
                             f"(a workbench.rollout.backend.Backend), got {backend!r}")
        _refuse_ray_arguments(f"a backend object ({type(backend).__name__})", address,
                              ray_options)
        return backend
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)} or a backend object, got "
                         f"{backend!r}")
    if backend == "local":
        _refuse_ray_arguments("backend='local'", address, ray_options)
        return LocalBackend()
    from .ray_backend import RayBackend  # importing Ray takes seconds: only when asked for
    if run_dir is not None:
        ray_options.setdefault("log_dir", Path(run_dir) / "ray")
    return RayBackend(address, **ray_options)


def _refuse_ray_arguments(chosen: str, address: str | None, ray_options: dict) -> None:
    given = ([f"the Ray address {address!r}"] if address is not None else []) + [
        f"{key}={value!r}" for key, value in ray_options.items()]
    if given:
        raise ValueError(f"{', '.join(given)} given with {chosen}; accepted: a Ray address "
                         "and Ray's settings with backend='ray' only")
