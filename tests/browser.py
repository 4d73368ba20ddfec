"""Headless Chromium for the browser tests: the machine's own Chromium, driven by Playwright.

Nothing is downloaded at run time: Playwright's pip wheel brings its driver, and the browser is
the system's (Debian's ``chromium``), passed as ``executable_path``. The README's test command
installs that package first where it can (``tests/install_chromium.sh``: apt-get exists and the
user is root), so on such a machine a missing Chromium fails the test; elsewhere the test is
skipped with the reason.

Screenshots go to ``$WORKBENCH_ARTIFACTS`` or ``test-artifacts/`` at the repository root (git
ignores it), one folder per test; the end of the pytest output lists every file written.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALLER = "tests/install_chromium.sh"
CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")

SAVED: list[Path] = []  # every screenshot written in this session (listed by conftest.py)


def chromium_path() -> str | None:
    """The system Chromium: ``/usr/bin/chromium``, else ``chromium`` or ``chromium-browser`` on
    PATH; None when there is none."""
    for name in CANDIDATES:
        found = name if os.access(name, os.X_OK) and os.path.isabs(name) else shutil.which(name)
        if found:
            return found
    return None


def can_install() -> bool:
    """Whether ``tests/install_chromium.sh`` installs Chromium here (apt-get and root)."""
    return shutil.which("apt-get") is not None and hasattr(os, "geteuid") and os.geteuid() == 0


def require_chromium() -> str:
    """The Chromium to launch; fails where the README's command should have installed it,
    skips (with the reason printed) elsewhere."""
    path = chromium_path()
    if path:
        return path
    looked = ", ".join(CANDIDATES)
    if can_install():
        pytest.fail(f"no Chromium found ({looked}), yet apt-get exists and the user is root: "
                    f"the README's test command installs Debian's chromium with {INSTALLER} "
                    "first; run that command (or the script) and look at its output")
    reason = (f"no Chromium on this machine (looked for {looked}); the browser tests need the "
              "system's Chromium (Debian: apt-get install chromium), nothing is downloaded")
    print(f"SKIP: {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def launch(viewport=(1400, 1000)):
    """A new page in a fresh headless Chromium (``--no-sandbox`` when root); closed on exit.

    Yields the Playwright page. Start it after any asyncio-based work of the test (papermill,
    nbclient): Playwright's sync API runs its own event loop while it is open.
    """
    executable = require_chromium()
    from playwright.sync_api import sync_playwright
    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    args += ["--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--disable-background-networking", "--disable-component-update"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=args)
        try:
            context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            yield context.new_page()
        finally:
            browser.close()


def artifacts_dir(test_name: str) -> Path:
    """The folder for ``test_name``'s artifacts: ``$WORKBENCH_ARTIFACTS/<test>`` or
    ``test-artifacts/<test>`` at the repository root, emptied of a previous run's files."""
    base = Path(os.environ.get("WORKBENCH_ARTIFACTS") or ROOT / "test-artifacts")
    folder = base / re.sub(r"[^\w.-]+", "_", test_name)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def screenshot(target, folder: Path, name: str, **kwargs) -> Path:
    """Save a PNG of ``target`` (a page or a locator) as ``folder/name.png``; listed at the end
    of the pytest output."""
    path = folder / f"{name}.png"
    target.screenshot(path=str(path), **kwargs)
    SAVED.append(path)
    print(f"screenshot: {path}")
    return path
