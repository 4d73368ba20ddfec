"""The pipeline report in a real browser: ``report.html`` opened from disk in headless Chromium.

The quickstart pipeline (``pipelines/quickstart.yaml``: notebook 00 once, notebook 01 over two
seeds) runs once per session through ``workbench pipeline run --jobs 2`` with each notebook's
smoke parameters (the ``quickstart_runs`` fixture, tests/conftest.py); ``workbench pipeline
report`` writes the page; the test opens it via ``file://``, saves a full-page screenshot to
test-artifacts/test_report_shows_every_run_in_chromium/ and checks that every run is on the
page and every embedded figure loaded.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .browser import artifacts_dir, launch, require_chromium, screenshot
from .notebook_runs import workbench_cli


@pytest.fixture
def report(quickstart_runs, tmp_path) -> tuple[Path, list[str]]:
    """(report.html, every run's name) of the quickstart pipeline at smoke sizes."""
    require_chromium()  # skip or fail before writing anything
    runs = sorted(p.name for p in quickstart_runs.iterdir() if (p / "run.json").is_file())
    assert len(runs) == 3, runs  # 00 once, 01 over seeds 0 and 1
    assert all(json.loads((quickstart_runs / r / "run.json").read_text())["status"] == "ok"
               for r in runs)
    wrote = workbench_cli("pipeline", "report", str(quickstart_runs), cwd=tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    return quickstart_runs / "report.html", runs


def test_report_shows_every_run_in_chromium(report, request):
    """Every run's name and status are on the rendered page, and every figure loaded."""
    path, runs = report
    started = time.monotonic()
    folder = artifacts_dir(request.node.name)
    with launch(viewport=(1200, 900)) as page:
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        shot = screenshot(page, folder, "report", full_page=True)
        text = page.inner_text("body")
        sections = page.eval_on_selector_all(
            "section.run", "els => els.map(e => [e.querySelector('h2').innerText, "
            "e.querySelectorAll('img').length, !!e.querySelector('.failed')])")
        page_width = page.evaluate("document.documentElement.scrollWidth")
        images = page.eval_on_selector_all(
            "img", "els => els.map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
    assert shot.stat().st_size > 0
    assert page_width <= 1200, f"the page is {page_width} px wide: a table widens it"
    assert "Pipeline quickstart" in text and "3 of 3 runs ok" in text
    for run in runs:
        assert run in text, f"run {run} is not shown"
    assert sorted(name for name, _, _ in sections) == runs
    for name, figures, is_failed in sections:
        assert not is_failed and figures >= 2, (name, figures)  # every run draws figures
    assert all(done and width > 0 and height > 0 for _, done, width, height in images), images
    print(f"report browser check: {time.monotonic() - started:.1f} s")
