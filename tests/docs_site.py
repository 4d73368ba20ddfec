"""The documentation site (``mkdocs.yml``: the docs and the API reference generated from the
docstrings) built once per session with ``mkdocs build --strict``, for the tests that read it
(tests/test_docs_site.py, tests/test_public_api.py); and the public modules, as the reference's
pages name them (``::: workbench.x`` in ``docs/api/*.md``)."""
from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API_PAGES = ROOT / "docs" / "api"


@dataclass(frozen=True)
class Site:
    """One ``mkdocs build --strict``: the site's folder, the exit status, what it printed and
    how long it took."""
    folder: Path
    returncode: int
    output: str
    seconds: float

    def warnings(self) -> list[str]:
        return [line for line in self.output.splitlines() if "WARNING" in line or "ERROR" in line]

    def anchors(self) -> set[str]:
        """Every ``id`` of every page: mkdocstrings gives each documented object its dotted
        path as its ``id`` (``workbench.rollout.RolloutEngine``)."""
        ids = set()
        for page in self.folder.rglob("*.html"):
            ids |= set(re.findall(r'\bid="(workbench[\w.]*)"', page.read_text()))
        return ids


TOOLS = ("mkdocs", "material", "mkdocstrings_handlers.python", "griffe")


def require_docs_tools() -> None:
    """Fail, saying what to install, where the test extra is missing."""
    missing = [name for name in TOOLS if not _is_module(name)]
    if missing:
        import pytest
        pytest.fail(f"{', '.join(missing)} not installed: the docs tests need the test extra, "
                    "as the README's test command installs it (pip install -e \".[test]\")")


@functools.cache
def _build() -> Site:
    out = Path(tempfile.mkdtemp(prefix="workbench-site-"))
    atexit.register(shutil.rmtree, out, True)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(out / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - started
    print(f"mkdocs build --strict: {seconds:.1f} s")
    return Site(out / "site", done.returncode, done.stdout + done.stderr, seconds)


def built_site() -> Site:
    """The site, built into a temporary folder (removed at exit) the first time it is asked
    for in the session."""
    require_docs_tools()
    return _build()


def documented_modules() -> dict[str, str]:
    """``{module: page}`` for every ``::: module`` directive of the API reference's pages, in
    page order."""
    modules = {}
    for page in sorted(API_PAGES.glob("*.md")):
        for target in re.findall(r"^::: (workbench[\w.]*)\s*$", page.read_text(), re.M):
            if _is_module(target):  # not a single object documented by its path
                modules.setdefault(target, page.name)
    return modules


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False
