"""A diagnosis written to a folder: ``diagnosis.html`` (one static page, its figures embedded,
the pipeline report's style: ``workbench.report``), ``diagnosis.json`` (the summary and the
findings), a CSV per table and a PNG per figure.

Why one folder, written whole: a report is read later, beside the logs it came from; a
report half-written (a figure that failed) would read as complete. The folder is written in
a temporary place and moved in at the end (``atomic_dir``), and only over a missing or empty
folder or an earlier diagnosis (one that holds ``diagnosis.json``), never over other files.
"""
from __future__ import annotations

import base64
import html
import io
import json
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from ..atomic import atomic_dir
from ..report import STYLE, _figure, _table
from .figures import live_batch_figure, remedies_figure, step_split_figure

__all__ = ["write_diagnosis", "check_out", "diagnosis_html", "TABLES", "FIGURES"]

TABLES = ("steps", "tail", "batch", "remedies", "measured", "curve")
FIGURES = {"step_split": step_split_figure, "live_batch": live_batch_figure,
           "remedies": remedies_figure}
CAPTIONS = {"step_split": "each step's time by part, from the logs",
            "live_batch": "the live batch over one simulated rollout, against where SD stops paying",
            "remedies": "each remedy's predicted end-to-end speedup (error bar: the simulator's "
                        "validated error)"}


def check_out(out: str | os.PathLike) -> Path:
    """``out`` as a Path if a report may be written there: missing, an empty folder or an
    earlier diagnosis; else ValueError naming it and what is accepted."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir())
                                              and not (out / "diagnosis.json").is_file())):
        raise ValueError(f"--out {str(out)!r} is {'a file' if not out.is_dir() else 'a folder of other files'}; "
                         "accepted: a missing or empty folder, or an earlier diagnosis "
                         "(a folder with diagnosis.json), which is replaced")
    return out


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _json_safe(value):
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def diagnosis_json(diagnosis) -> dict:
    return _json_safe({**diagnosis.summary, "findings": diagnosis.findings,
                       "reading": diagnosis.reading()})


def diagnosis_html(diagnosis, pngs: dict[str, bytes], title: str) -> str:
    """The page: the reading first (the bottleneck named), then the remedies, the figures and
    every table."""
    d = diagnosis
    reading = "".join(f'<li class="finding" data-cause="{html.escape(f["cause"])}">'
                      f'{html.escape(f["sentence"])}</li>' for f in d.findings)
    undecided = "".join(f'<li class="undecided">{html.escape(u)}</li>' for u in d.undecided)
    missing = d.summary.get("missing", {})
    figures = "".join(_figure(name, base64.b64encode(data).decode("ascii"), CAPTIONS[name])
                      for name, data in pngs.items())
    tables = "".join(f'<h2>{html.escape(name)}</h2>{_table(frame)}'
                     for name, frame in _tables(d).items() if name != "remedies")
    error = d.summary.get("simulator_error")
    quoted = (f"the simulator's validated error: ±{100 * error['error']:.1f}% "
              f"({html.escape(error['figure'])}, benchmarks/results/{html.escape(error['result'])}.json)"
              if error else "no validated simulator error found (benchmarks/results/)")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE} li.undecided {{ color: #8a5a00; }}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p>{html.escape(d.summary['source'])} · format "
            f"{html.escape(d.summary['format'])} · {d.summary['steps']} steps · bottleneck: "
            f"<b id='bottleneck'>{html.escape(str(d.bottleneck))}</b></p>"
            f"<h2>Reading</h2><ul id='reading'>{reading}</ul>"
            + (f"<h2>Could not decide</h2><ul id='undecided'>{undecided}</ul>" if undecided else "")
            + (f"<h2>Missing from the logs</h2>{_table(_missing_table(missing))}" if missing else "")
            + f"<h2>Remedies</h2><p>{quoted}</p>{_table(d.remedies)}{figures}{tables}"
            "</body></html>")


def _missing_table(missing: dict):
    import pandas as pd
    return pd.DataFrame({"field": list(missing), "read from": list(missing.values())})


def _tables(diagnosis) -> dict:
    return {name: getattr(diagnosis, name) for name in TABLES
            if getattr(diagnosis, name, None) is not None}


def write_diagnosis(diagnosis, out: str | os.PathLike, title: str = "Diagnosis") -> Path:
    """Write the report folder ``out`` (module docstring); returns ``out/diagnosis.html``."""
    out = check_out(out)
    pngs = {}
    for name, draw in FIGURES.items():
        fig = draw(diagnosis)
        if fig is not None:
            pngs[name] = _png(fig)
    page = diagnosis_html(diagnosis, pngs, title)
    with atomic_dir(out) as tmp:
        for name, frame in _tables(diagnosis).items():
            frame.to_csv(tmp / f"{name}.csv", index=False)
        for name, data in pngs.items():
            (tmp / f"{name}.png").write_bytes(data)
        (tmp / "diagnosis.json").write_text(json.dumps(diagnosis_json(diagnosis), indent=2))
        (tmp / "diagnosis.html").write_text(page, encoding="utf-8")
    return out / "diagnosis.html"
