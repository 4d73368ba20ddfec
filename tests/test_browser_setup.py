"""The browser tests' setup: the README's command installs Chromium where it can, and without
one the tests fail where it should have been installed and skip (saying why) elsewhere."""
import re
import subprocess
from pathlib import Path

import pytest

from . import browser

ROOT = Path(__file__).resolve().parent.parent


def test_readme_test_command_installs_chromium_before_pytest():
    readme = (ROOT / "README.md").read_text()
    command = next(c.strip() for c in re.findall(r"```(?:bash|sh)?\n(.*?)\n```", readme, re.S)
                   if "pytest" in c)
    steps = [s.strip() for s in command.split("&&")]
    assert f"sh {browser.INSTALLER}" in steps
    assert steps.index(f"sh {browser.INSTALLER}") < next(
        i for i, s in enumerate(steps) if "pytest" in s)
    script = ROOT / browser.INSTALLER
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "set -eu" in text and "--no-install-recommends chromium" in text
    assert "DEBIAN_FRONTEND=noninteractive" in text and "apt-get update" in text


def test_without_chromium_the_browser_tests_skip_or_fail(monkeypatch, capsys):
    monkeypatch.setattr(browser, "chromium_path", lambda: None)
    monkeypatch.setattr(browser, "can_install", lambda: False)
    with pytest.raises(pytest.skip.Exception, match="no Chromium on this machine"):
        browser.require_chromium()
    assert "SKIP: no Chromium" in capsys.readouterr().out
    monkeypatch.setattr(browser, "can_install", lambda: True)
    with pytest.raises(pytest.fail.Exception, match="install_chromium.sh"):
        browser.require_chromium()


def test_chromium_is_found_on_path(monkeypatch, tmp_path):
    fake = tmp_path / "chromium-browser"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setattr(browser, "CANDIDATES", ("/nonexistent/chromium", "chromium-browser"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert browser.chromium_path() == str(fake)
