"""The pipeline report in a real browser: ``report.html`` opened from disk in headless Chromium.

A small pipeline shaped like the quickstart (two notebook entries, one over two seeds, plus a
run that fails) runs through ``workbench pipeline run`` on tiny notebooks that draw a matplotlib
figure each (seconds, not the quickstart's minutes); ``workbench pipeline report`` writes the
page; the test opens it via ``file://``, saves a full-page screenshot to
test-artifacts/test_report_shows_every_run_in_chromium/ and checks that every run is on the
page and every embedded figure loaded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from .browser import artifacts_dir, launch, require_chromium, screenshot

ROOT = Path(__file__).resolve().parent.parent
METADATA = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"}}
PARAMETERS = 'out_dir = "."\nseed = 0\nsize = 8\nfail = False'
BODY = [
    "if fail:\n    raise RuntimeError(f'asked to fail with size={size}')",
    "import json, pathlib\n"
    "import matplotlib\nmatplotlib.use('agg')\nfrom matplotlib.figure import Figure\n"
    "fig = Figure(figsize=(4, 3))\n"
    "fig.add_subplot().bar(range(size), [(i * (seed + 3)) % 7 + 1 for i in range(size)])\n"
    "fig.savefig(pathlib.Path(out_dir, 'bars.png'))\n"
    "pathlib.Path(out_dir, 'metrics.json').write_text("
    "json.dumps({'total': size * (seed + 1), 'seed': seed}))",
]
PIPELINE = """name: quickstart_like
notebooks:
  - notebook: notebooks/toy.ipynb
    name: small
    parameters: {size: 4}
  - notebook: notebooks/toy.ipynb
    name: seeded
    parameters: {size: 12}
    seeds: [0, 1]
  - notebook: notebooks/toy.ipynb
    name: broken
    parameters: {fail: true}
"""


def workbench_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def report(tmp_path) -> tuple[Path, list[str], list[str]]:
    """(report.html, every run's name, the runs that failed) of a small pipeline."""
    require_chromium()  # skip or fail before running anything
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pipelines").mkdir()
    cells = [new_code_cell(PARAMETERS, metadata={"tags": ["parameters"]})]
    nbformat.write(new_notebook(cells=cells + [new_code_cell(s) for s in BODY],
                                metadata=METADATA), tmp_path / "notebooks" / "toy.ipynb")
    (tmp_path / "pipelines" / "quickstart_like.yaml").write_text(PIPELINE)
    ran = workbench_cli("pipeline", "run", "pipelines/quickstart_like.yaml", "--runs-root",
                        "runs", cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr  # one run fails on purpose, the others go on
    pipeline_dir = tmp_path / "runs" / "quickstart_like"
    runs = sorted(p.name for p in pipeline_dir.iterdir() if (p / "run.json").is_file())
    failed = [r for r in runs if json.loads((pipeline_dir / r / "run.json").read_text())[
        "status"] != "ok"]
    assert len(runs) == 4 and len(failed) == 1, runs
    wrote = workbench_cli("pipeline", "report", str(pipeline_dir), cwd=tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    return pipeline_dir / "report.html", runs, failed


def test_report_shows_every_run_in_chromium(report, request):
    """Every run's name and status are on the rendered page, and every figure loaded."""
    path, runs, failed = report
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
        images = page.eval_on_selector_all(
            "img", "els => els.map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])")
    assert shot.stat().st_size > 0
    assert "Pipeline quickstart_like" in text and "3 of 4 runs ok" in text
    for run in runs:
        assert run in text, f"run {run} is not shown"
    assert sorted(name for name, _, _ in sections) == runs
    for name, figures, is_failed in sections:
        assert is_failed == (name in failed), name
        assert figures == (0 if is_failed else 1), (name, figures)
    assert "asked to fail with size=8" in text
    assert len(images) == len(runs) - len(failed)
    assert all(done and width > 0 and height > 0 for _, done, width, height in images), images
    print(f"report browser check: {time.monotonic() - started:.1f} s")
