"""One static HTML page per pipeline run folder: ``workbench pipeline report runs/<pipeline>``.

The page needs no Jupyter server and no other file: every figure a run saved (``*.png`` in its
folder) is embedded as a data URI, and so is the explorer's last figure, the static PNG that a
notebook ending with an explorer leaves in its last cell under papermill. It holds the results
summary (one ``mean ± sd`` column per metric over seeds, as the CLI prints it:
:func:`workbench.pipeline_results.summary_view`), then every run with its status, duration,
parameters, metrics, figures and, for a failed run, its error. It reads only what
``workbench.pipeline`` wrote (``results.parquet``, each run's ``run.json`` and executed
``notebook.ipynb``), so it works on any finished or partly failed pipeline.
"""
from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path

import pandas as pd

from .atomic import write_text
from .pipeline_results import load_results, summary_view

__all__ = ["explorer_images"]

EXECUTED = "notebook.ipynb"  # the executed notebook a pipeline leaves in each run folder
WIDGET = "application/vnd.jupyter.widget-view+json"  # an explorer's controls, as saved

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
td, th { border: 1px solid #ddd; padding: 3px 7px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.run { margin: 1.5em 0; } .failed { color: #b00020; } .ok { color: #1b7f3b; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0; }
pre { background: #fbeff1; padding: 0.6em; white-space: pre-wrap; }
.scroll { overflow-x: auto; }
"""


def _table(frame: pd.DataFrame) -> str:
    """The table in a box that scrolls sideways: a summary with dozens of metric columns
    stays readable without widening the whole page."""
    body = frame.to_html(index=False, border=0, na_rep="", float_format=lambda v: f"{v:.4g}")
    return f'<div class="scroll">{body}</div>'



def _key_values(mapping: dict, title: str) -> str:
    if not mapping:
        return ""
    rows = pd.DataFrame({title: list(mapping), "value": [json.dumps(v) if isinstance(
        v, (list, dict)) else v for v in mapping.values()]})
    return _table(rows)


def _figure(alt: str, data: str, caption: str) -> str:
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
            f'<figcaption>{html.escape(caption)}</figcaption></figure>')


def explorer_images(notebook: str | os.PathLike) -> list[str]:
    """The base64 PNGs of an explorer in the last code cell of an executed notebook: the
    figure it opened on (under papermill nobody moves a control). A last cell that shows no
    ipywidgets (no explorer), or an unreadable notebook, gives none."""
    try:
        cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
        code = [c for c in cells if c.get("cell_type") == "code"]
        data = [o.get("data", {}) for o in (code[-1].get("outputs", []) if code else [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    if not any(WIDGET in d for d in data):
        return []
    images = [d["image/png"] for d in data if d.get("image/png")]
    return ["".join(i if isinstance(i, list) else [i]).replace("\n", "") for i in images]


def _figures(run_dir: Path) -> str:
    parts = [_figure(png.name, base64.b64encode(png.read_bytes()).decode("ascii"), png.name)
             for png in sorted(run_dir.glob("*.png"))]
    parts += [_figure(f"explorer {i}", data, "explorer: the last figure of the notebook (its "
                      "controls move in JupyterLab)")
              for i, data in enumerate(explorer_images(run_dir / EXECUTED), start=1)]
    return "\n".join(parts)


def _run_section(pipeline_dir: Path, row: pd.Series) -> str:
    run_dir = pipeline_dir / row["run_name"]
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        record = {}
    status = row["status"]
    head = (f'<h2 id="{html.escape(row["run_name"])}">{html.escape(row["run_name"])}</h2>'
            f'<p><span class="{status}">{status}</span> · notebook '
            f'{html.escape(str(row["notebook"]))} · {row["duration_s"]:.1f} s</p>')
    error = (f'<pre>{html.escape(str(row["error"]))}</pre>' if status != "ok" else "")
    return (f'<section class="run">{head}{error}'
            f'{_key_values(record.get("parameters", {}), "parameter")}'
            f'{_key_values(record.get("metrics", {}), "metric")}'
            f'{_figures(run_dir)}</section>')


def report_html(pipeline_dir: str | os.PathLike) -> str:
    """The report page of ``pipeline_dir`` (``<runs_root>/<pipeline>``) as HTML text."""
    pipeline_dir = Path(pipeline_dir)
    if not (pipeline_dir / "results.parquet").is_file():
        raise FileNotFoundError(
            f"no results in {str(pipeline_dir)!r}: expected results.parquet, which "
            "`workbench pipeline run <yaml>` writes into runs/<pipeline>/; pass that folder")
    table = load_results(pipeline_dir)
    name = str(table["pipeline"].iloc[0])
    ok = int((table["status"] == "ok").sum())
    index = " · ".join(f'<a href="#{html.escape(r)}">{html.escape(r)}</a>'
                       for r in table["run_name"])
    runs = "\n".join(_run_section(pipeline_dir, row) for _, row in table.iterrows())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(name)}"
            f"</title><style>{STYLE}</style></head><body><h1>Pipeline {html.escape(name)}</h1>"
            f"<p>{ok} of {len(table)} runs ok. Runs: {index}</p><h2>Summary over seeds</h2>"
            f"{_table(summary_view(table))}{runs}</body></html>")


def write_report(pipeline_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the report of ``pipeline_dir`` to ``out`` (default ``<pipeline_dir>/report.html``),
    atomically; returns its path."""
    page = report_html(pipeline_dir)
    out = Path(out) if out is not None else Path(pipeline_dir) / "report.html"
    write_text(out, page)
    return out
