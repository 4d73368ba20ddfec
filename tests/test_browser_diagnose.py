"""The diagnosis report in a real browser: ``diagnosis.html`` of the fastrl #6-shaped veRL
logs (``tests/fixtures/diagnose/verl_issue6``), written by ``workbench diagnose`` and opened
from disk in headless Chromium. A full-page screenshot goes to
test-artifacts/test_diagnosis_report_in_chromium/; the test checks the bottleneck is named
first, every remedy is a row, every figure loaded and no table widens the page."""
from __future__ import annotations

from pathlib import Path

from workbench.cli import main

from .browser import artifacts_dir, launch, require_chromium, screenshot

ISSUE6 = Path(__file__).resolve().parent / "fixtures" / "diagnose" / "verl_issue6"


def test_diagnosis_report_in_chromium(tmp_path, request):
    require_chromium()  # skip or fail before writing anything
    out = tmp_path / "report"
    assert main(["diagnose", str(ISSUE6), "--sd-curve", str(ISSUE6 / "sd_curve.csv"),
                 "--out", str(out)]) == 0
    folder = artifacts_dir(request.node.name)
    with launch(viewport=(1200, 900)) as page:
        page.goto((out / "diagnosis.html").as_uri())
        page.wait_for_load_state("load")
        shot = screenshot(page, folder, "diagnosis", full_page=True)
        bottleneck = page.inner_text("#bottleneck")
        findings = page.eval_on_selector_all(
            "li.finding", "els => els.map(e => [e.dataset.cause, e.innerText])")
        remedies = page.inner_text("body")
        images = page.eval_on_selector_all(
            "img", "els => els.map(i => [i.alt, i.complete, i.naturalWidth])")
        width = page.evaluate("document.documentElement.scrollWidth")
    assert shot.stat().st_size > 0
    assert bottleneck == "reward_bound"
    assert findings[0][0] == "reward_bound" and "40% of the step" in findings[0][1]
    for remedy in ("tlt_threshold", "tlt_bandit", "async_one_step", "april", "tail_batching"):
        assert remedy in remedies, remedy
    assert sorted(alt for alt, _, _ in images) == ["live_batch", "remedies", "step_split"]
    assert all(done and w > 0 for _, done, w in images), images
    assert width <= 1200, f"the page is {width} px wide: a table widens it"
