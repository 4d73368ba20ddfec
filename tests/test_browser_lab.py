"""JupyterLab in a real browser: notebook 01 at its smoke parameters, run from the Run menu.

A JupyterLab of this environment is started on loopback (a free port, a token, temporary
settings, workspaces, runtime and config folders, no news, no update check, no extension
manager: nothing reaches the network or the user's home) and driven by Playwright in the
system's headless Chromium (tests/browser.py). The test runs every cell, checks that no cell
errored, that a widget and a figure rendered, moves the first slider and waits for the figure
that follows it to change (the explorer redraws in place through its display id). Screenshots
go to test-artifacts/test_notebook_01_runs_in_jupyterlab/.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import papermill
import pytest

from .browser import artifacts_dir, launch, require_chromium, screenshot
from .helpers.notebooks import SMOKE

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "01_long_tail_rollout"
RUN_TIMEOUT_S = 240  # the smoke run takes about 30 s on 2 shared cores

# user settings: no news or update toasts, no extension manager, every cell attached to the DOM
SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/extensionmanager-extension/plugin.jupyterlab-settings": {"enabled": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server process on 127.0.0.1 serving ``root``."""

    def __init__(self, root: Path, home: Path):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        dirs = {name: home / name for name in ("settings", "workspaces", "runtime", "config",
                                               "data", "ipython")}
        for folder in dirs.values():
            folder.mkdir(parents=True)
        for name, values in SETTINGS.items():
            (dirs["settings"] / name).parent.mkdir(parents=True, exist_ok=True)
            (dirs["settings"] / name).write_text(json.dumps(values))
        env = {**os.environ,
               "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
               "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
               "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
               "JUPYTER_CONFIG_DIR": str(dirs["config"]),
               "JUPYTER_DATA_DIR": str(dirs["data"]),
               "IPYTHONDIR": str(dirs["ipython"]),
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get(
                   "PYTHONPATH", "")) if p)}  # the kernel imports this checkout's workbench
        self.log = home / "lab.log"
        self._log_file = self.log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={root}",
             "--LabApp.news_url=None",
             "--LabApp.check_for_updates_class="
             "jupyterlab.handlers.announcements.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly",
             "--LabApp.expose_app_in_browser=True",
             f"--LabApp.user_settings_dir={dirs['settings']}",
             f"--LabApp.workspaces_dir={dirs['workspaces']}",
             "--ServerApp.terminals_enabled=False"]
            + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
            cwd=root, env=env, stdout=self._log_file, stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.process.returncode}:\n"
                                   f"{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}",
                                            timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer in {timeout} s:\n"
                           f"{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # jupyter shuts its kernels down on SIGTERM
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)  # its own session: the server and its kernels
                self.process.wait()
        self._log_file.close()


@pytest.fixture
def lab(tmp_path, notebook_runs_ended):
    require_chromium()  # skip or fail before starting anything
    root = tmp_path / "root"
    root.mkdir()
    server = Lab(root, tmp_path / "jupyter")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


# ---- what the page shows (evaluated in the browser) ---------------------------------------

PROGRESS = """() => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
    .map(p => p.textContent.trim());
  const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
  let errors = [];
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') continue;
    for (const out of cell.outputs.toJSON())
      if (out.output_type === 'error') errors.push(`cell ${i}: ${out.ename}: ${out.evalue}`);
  }
  return {prompts, errors,
          running: prompts.filter(p => p.includes('*')).length,
          done: prompts.filter(p => /^\\[\\d+\\]:?$/.test(p)).length};
}"""

KERNEL_IDLE = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = panel && panel.sessionContext && panel.sessionContext.session
                 && panel.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle' && !!panel.content;
}"""

OUTPUT = ".jp-Notebook .jp-OutputArea-output"
# the first ipywidgets slider, and the first output image that follows it in the notebook
SLIDER = f"{OUTPUT} .jupyter-widgets.widget-slider"
FOLLOWING_IMAGE = """(slider) => {
  const images = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output img')];
  const next = images.find(img => slider.compareDocumentPosition(img)
                                  & Node.DOCUMENT_POSITION_FOLLOWING);
  return next ? next.src : null;
}"""


def parameterized_notebook(root: Path) -> str:
    """Notebook 01 with its smoke parameters injected (papermill, not run) into ``root``."""
    params = {**SMOKE[NOTEBOOK][0], "out_dir": str(root / "out")}
    name = f"{NOTEBOOK}.ipynb"
    papermill.execute_notebook(ROOT / "notebooks" / name, root / name, parameters=params,
                               prepare_only=True, kernel_name="python3", language="python",
                               progress_bar=False)
    return name


def slider_value(slider) -> list:
    """The values of the slider's handles (noUiSlider's ``aria-valuenow``)."""
    return [h.get_attribute("aria-valuenow") for h in slider.locator(".noUi-handle").all()]


def move_slider(page, slider) -> list:
    """Drag the first handle of ``slider`` (an ipywidgets noUiSlider) a quarter of its track
    toward the roomier side, falling back to arrow keys on the focused handle; returns the
    slider's value before the move."""
    before = slider_value(slider)
    handle = slider.locator(".noUi-handle").first
    track, box = slider.locator(".noUi-target").first.bounding_box(), handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    step = track["width"] / 4 * (1 if x < track["x"] + track["width"] / 2 else -1)
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + step, y, steps=5)
    page.mouse.up()
    how = "dragged"
    if slider_value(slider) == before:
        how = "arrow keys"
        handle.focus()
        for _ in range(5):
            page.keyboard.press("ArrowRight" if step > 0 else "ArrowLeft")
    print(f"slider {before} -> {slider_value(slider)} ({how})")
    return before


def wait_for(page, locator, what: str, timeout_s: float = 30) -> None:
    """Wait until ``locator`` is attached; fail saying ``what`` was missing."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    try:
        locator.first.wait_for(state="attached", timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        pytest.fail(f"{what} (waited {timeout_s:.0f} s)")


def test_notebook_01_runs_in_jupyterlab(lab, request):
    """Run All Cells in a real JupyterLab; no cell errors, a widget and a figure render, and
    moving the explorer's slider changes its figure."""
    started = time.monotonic()
    name = parameterized_notebook(lab.root)
    folder = artifacts_dir(request.node.name)
    with launch() as page:
        try:
            page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}")
            page.wait_for_function(KERNEL_IDLE, timeout=90_000, polling=250)
            screenshot(page, folder, "1_opened")

            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
            page.wait_for_function(
                f"() => {{ const s = ({PROGRESS})(); return s.running === 0 && "
                f"(s.done === s.prompts.length || s.errors.length > 0); }}",
                timeout=RUN_TIMEOUT_S * 1000, polling=500)
            state = page.evaluate(PROGRESS)
            print(f"ran {len(state['prompts'])} code cells in "
                  f"{time.monotonic() - started:.1f} s since the test started")
            screenshot(page, folder, "2_ran_all")
            assert state["errors"] == [], state["errors"]
            assert state["done"] == len(state["prompts"]) > 0, state["prompts"]

            wait_for(page, page.locator(f"{OUTPUT} img"), "no figure in any output")
            explorer = ("notebook 01 ends with an explorer (workbench.viz.explorer): "
                        "ipywidgets controls, a slider among them, over a figure")
            wait_for(page, page.locator(f"{OUTPUT} .jupyter-widgets"),
                     f"no ipywidgets view in any output; {explorer}")
            wait_for(page, page.locator(SLIDER), f"no ipywidgets slider in any output; {explorer}")
            assert page.evaluate(f"() => [...document.querySelectorAll('{OUTPUT} img')]"
                                 ".every(i => i.complete && i.naturalWidth > 0)")
            text = " ".join(page.locator(OUTPUT).all_inner_texts())
            assert "Traceback" not in text
            assert "Error displaying widget" not in text and "Loading widget" not in text

            slider = page.locator(SLIDER).first
            slider.scroll_into_view_if_needed()
            image_before = slider.evaluate(FOLLOWING_IMAGE)
            assert image_before, "no figure after the first slider"
            cell = slider.locator("xpath=ancestor::div[contains(@class, 'jp-CodeCell')]")
            screenshot(page, folder, "3_explorer_before")
            screenshot(cell, folder, "3_explorer_cell_before")

            value = move_slider(page, slider)
            assert slider_value(slider) != value, "the slider did not move"
            page.wait_for_function(f"([s, before]) => ({FOLLOWING_IMAGE})(s) !== before",
                                   arg=[slider.element_handle(), image_before], timeout=60_000)
            screenshot(page, folder, "4_explorer_after")
            screenshot(cell, folder, "4_explorer_cell_after")
            assert page.evaluate(PROGRESS)["errors"] == []
        except BaseException:
            screenshot(page, folder, "failure")
            raise
    print(f"JupyterLab test: {time.monotonic() - started:.1f} s")
