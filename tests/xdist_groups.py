"""The suite on pytest-xdist's workers (the README's ``-n 2``), with groups of tests that each
go to one worker whole: the tests that compile with inductor (one worker warms inductor up,
not two) and the ones that want a quiet machine (one local Ray, one browser at a time).

pytest-xdist's own ``--dist loadgroup`` marks a group in a test's node id, which pytest 9.2's
node ids no longer take, so its groups are silently ignored. Here the controller opens a
folder every process of the session shares (:func:`open_shared`), the workers write each
grouped test's group there as they collect (:func:`publish_groups`), and the controller's
scheduler (:class:`GroupScheduling`) reads it: a scope is a test alone or its whole group,
dealt out in the order collected. The session's notebook runs publish their outcome in the
same folder (tests/notebook_runs.py)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

SHARED = "WORKBENCH_TESTS_SHARED"  # the folder, as the controller passes it to its workers


def open_shared() -> None:
    """In the controller, before its workers start (they inherit its environment)."""
    os.environ[SHARED] = tempfile.mkdtemp(prefix="workbench-tests-")


def close_shared() -> None:
    folder = os.environ.pop(SHARED, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def shared_folder() -> Path | None:
    """The session's shared folder in a worker; None outside pytest-xdist."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None or SHARED not in os.environ:
        return None
    return Path(os.environ[SHARED])


def publish_groups(groups: dict[str, str]) -> None:
    """Write ``{node id: group}`` for the controller (every worker collects the same tests
    and writes the same map; each write is atomic)."""
    folder = shared_folder()
    if folder is None:
        return
    tmp = folder / f".groups.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, folder / "groups.json")


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling where a scope is a test alone or its group (read from the
    workers' map once they have all collected), in the order collected: the suite's order
    (conftest.py's places) is its schedule."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        config.option.loadscopereorder = False  # xdist's default deals the largest first
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            path = Path(os.environ[SHARED]) / "groups.json"
            self._groups = json.loads(path.read_text()) if path.exists() else {}
        return self._groups.get(nodeid, nodeid)
