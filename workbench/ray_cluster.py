"""Reaching Ray: a local instance on loopback only, or a running cluster by its address.

Every user of Ray in the package reaches it here, so that each one starts it the same way:
the rollout's ``RayBackend`` (workers as actors) and the pipeline's Ray tasks (a notebook run
each). One Ray per process: a Ray already initialised in this process is reused as it is, and
only the caller whose :func:`connect` started it undoes it (``ray.shutdown()``).

Glossary:

address   ``None`` reads ``$RAY_ADDRESS``; without it a local instance starts. Otherwise
          ``"host:port"`` (or ``"ray://host:port"``, a Ray client) of a running cluster, checked
          to answer within ``CONNECT_TIMEOUT_S`` before anything starts. A cluster with token
          authentication (Ray's default for one that ``ray.init`` started) also needs
          ``RAY_AUTH_MODE=token`` and its token (``~/.ray/auth_token`` or ``$RAY_AUTH_TOKEN``).
loopback  a Ray started here listens on 127.0.0.1 only. Ray on Linux rewrites a loopback node
          address to the machine's own address unless its cluster mode is off, so the start
          turns it off for the ``ray.init`` call and checks the node's address afterwards.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import ray
from ray._private import ray_constants

from .environ import environ

__all__ = ["connect", "resolve_address", "known_cpus", "LOOPBACK", "ADDRESS_FORMS"]

LOOPBACK = "127.0.0.1"
CONNECT_TIMEOUT_S = 3.0  # an address that does not answer within this is unreachable
ADDRESS_FORMS = "None (a local instance, or $RAY_ADDRESS), 'host:port' or 'ray://host:port'"


def resolve_address(address: str | None) -> str | None:
    """``address``, or ``$RAY_ADDRESS`` when it is None (None again when that is unset too),
    checked for its form (a ValueError names it and the accepted forms); nothing is reached."""
    address = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    if address is not None and (not isinstance(address, str) or _host_port(address) is None):
        raise ValueError(f"address must be {ADDRESS_FORMS}, got {address!r}")
    return address


def known_cpus(address: str | None, num_cpus: int | None = None) -> float | None:
    """The CPUs of the Ray that :func:`connect` with these arguments reaches, where they are
    known without starting or attaching anything, so that a caller refuses work that does
    not fit before it writes a file or starts Ray: this process's Ray when it is up (connect
    reuses it), or a local one yet to start (``num_cpus``, default the machine's count, as
    connect starts it). None for a cluster at ``address`` (a resolved one) not attached yet:
    its CPUs are known only once attached."""
    if ray.is_initialized():
        return ray.cluster_resources().get("CPU", 0)
    return num_cpus or os.cpu_count() if address is None else None


def connect(address: str | None, num_cpus: int | None = None,
            log_dir: str | os.PathLike | None = None) -> bool:
    """Attach to ``address`` (a resolved one: :func:`resolve_address`), reuse this process's
    Ray, or start one on loopback with ``num_cpus`` CPUs (default: the machine's), no dashboard
    and its session folder, logs included, under ``log_dir`` (default Ray's own, ``/tmp/ray``).
    True when this call ran ``ray.init``: undoing it (``ray.shutdown()``) is then the caller's.
    An address that does not answer raises ConnectionError naming it, before anything starts.
    """
    if address is not None:
        _check_reachable(address)
    if ray.is_initialized():
        return False
    if address is not None:
        with _loopback_only(_is_loopback(address)):
            ray.init(address=address)
        return True
    # the workers import what the driver can: its path (a notebook's folder, the project
    # root of a test run), so objects of a module beside the caller unpickle there too. It
    # goes in the environment the node's processes inherit, not in a runtime_env: workers of
    # a runtime_env cannot come from the pool Ray starts with the node, and a fresh one costs
    # seconds (its first task: 5 s against 0.4 s here; an actor's start: 30% longer)
    path = os.pathsep.join(p for p in (os.getcwd(), *sys.path) if p and os.path.isdir(p))
    root = None if log_dir is None else _ray_root(Path(log_dir).resolve())
    with _loopback_only(True), environ(PYTHONPATH=path):
        ray.init(num_cpus=num_cpus or os.cpu_count(), _node_ip_address=LOOPBACK,
                 include_dashboard=False, _temp_dir=root)
    addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
    if addresses != {LOOPBACK}:
        ray.shutdown()
        raise RuntimeError(f"the local Ray instance listened on {sorted(addresses)}, not "
                           f"on {LOOPBACK} only; it was shut down")
    return True


def _ray_root(log_dir: Path) -> str:
    """Ray's temp root for ``log_dir``: a short link to it in the system's temp folder. Ray
    keeps its sockets under that root too, and a socket's path holds at most 107 bytes, which
    a run folder's path alone may nearly fill. The link stays: Ray's ``session_latest`` in
    ``log_dir`` points through it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(str(log_dir).encode()).hexdigest()[:12]
    link = Path(tempfile.gettempdir()) / f"workbench-ray-{digest}"
    if not (link.is_symlink() and Path(os.readlink(link)) == log_dir):
        link.unlink(missing_ok=True)
        link.symlink_to(log_dir, target_is_directory=True)
    return str(link)


def _host_port(address: str) -> tuple[str, int] | None:
    match = re.fullmatch(r"(?:ray://)?([\w.\-]+|\[[0-9a-fA-F:]+\]):(\d{1,5})", address)
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        return None
    return match.group(1).strip("[]"), int(match.group(2))


def _is_loopback(address: str) -> bool:
    return _host_port(address)[0] in ("127.0.0.1", "localhost", "::1")


def _check_reachable(address: str) -> None:
    """Raise ConnectionError, naming ``address``, unless something answers there."""
    try:
        socket.create_connection(_host_port(address), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError(
            f"no Ray cluster answers at {address!r} ({exc}); start one there (`ray start "
            "--head`), or pass address=None with RAY_ADDRESS unset for a local instance"
        ) from exc


@contextmanager
def _loopback_only(active: bool):
    """Keep Ray from rewriting a loopback address to the machine's own while ``ray.init``
    runs (module docstring, "loopback"); the processes it starts inherit the setting."""
    if not active:
        yield
        return
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with environ(**{ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR: "0"}):
            yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
