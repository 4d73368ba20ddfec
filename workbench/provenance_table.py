"""The table ``RESULTS.md``, generated from the result files (``workbench results table``).

Why generated: a figure quoted by hand drifts from the file that holds its spread, clock,
machine and command; a table written from the files alone cannot, and ``workbench results
table --check`` fails when the committed one is stale. The text is deterministic (the same
files give the same text), so the check is a plain comparison. The files and their schema are
:mod:`workbench.provenance`'s.
"""
from __future__ import annotations

import os

from .machine import FLAG_LABELS
from .provenance import read_result, result_files
from .speedup import WIDE_SPREAD

__all__ = ["results_table", "figure_cell"]


def _num(v: float) -> str:
    if v != 0 and (abs(v) >= 1000 or abs(v) < 0.001):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2e}"
    return f"{v:.3g}" if abs(v) >= 1 else f"{v:.3f}".rstrip("0").rstrip(".")


def figure_cell(name: str, fig: dict) -> str:
    """``name 1.54x (IQR 1.4-1.6, range 1.5-1.7, n=5)``, with ``WIDE`` when (max - min) /
    |value| exceeds ``workbench.speedup.WIDE_SPREAD`` (25%)."""
    unit = fig.get("unit") or ""
    unit = unit if unit in ("x", "%") else (f" {unit}" if unit else "")
    spread = []
    if "q25" in fig and "q75" in fig:
        spread.append(f"IQR {_num(fig['q25'])}-{_num(fig['q75'])}")
    if "min" in fig and "max" in fig:
        spread.append(f"range {_num(fig['min'])}-{_num(fig['max'])}")
    if "n" in fig:
        spread.append(f"n={fig['n']}")
    wide = ("min" in fig and "max" in fig and fig["value"]
            and (fig["max"] - fig["min"]) / abs(fig["value"]) > WIDE_SPREAD)
    text = f"{name} {_num(fig['value'])}{unit}"
    return text + (f" ({', '.join(spread)})" if spread else "") + (" WIDE" if wide else "")


def _cell(text) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def _machine_cell(box: dict) -> str:
    flags = [FLAG_LABELS.get(f, f) for f in box.get("flags", [])]
    parts = [box.get("cpu") or "?"]
    parts += [", ".join(flags)] if flags else []
    parts += [f"{box['cores']} cores"] if box.get("cores") else []
    parts += [box["accelerator"]] if box.get("accelerator") else []
    return "; ".join(parts)


def results_table(folder: str | os.PathLike | None = None) -> str:
    """The markdown text of ``RESULTS.md``: one row per result file of ``folder`` (name,
    question, headline figures with their spread, clock, disturbed share, machine, commit,
    date, command), ordered by name. Deterministic: the same files give the same text."""
    results = [read_result(p) for p in result_files(folder)]
    lines = ["# Results", "",
             "Generated from `benchmarks/results/*.json` (one file per question, schema in "
             "`workbench/provenance.py`) by `workbench results table`; do not edit by hand "
             "(`workbench results table --check` fails when this file is stale). New figures "
             "land here first; the lab notes (`docs/lab-notes/`) tell what they mean; a row whose "
             "question starts SUPERSEDED names the row that replaced it.", "",
             "Figures: the value (median unless the question says otherwise), with its "
             "quartiles (IQR), range and count; WIDE: (max-min)/value above 25%. Disturbed: "
             "the share of repeats or steps (by their seconds) whose CPU share (the CPU "
             "seconds the work got over its wall seconds: `workbench.clock`) fell under the "
             "bound.", ""]
    if not results:
        lines.append("No results recorded yet: measurement runs write them into "
                     "`benchmarks/results/` (`benchmarks/*.py --result NAME`, "
                     "`workbench results record`).")
        return "\n".join(lines) + "\n"
    lines += ["| name | question | figures | clock | disturbed | machine | commit | date | "
              "command |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        figures = "<br>".join(figure_cell(h, r["figures"][h]) for h in r["headline"])
        share = r["disturbed_share"]
        disturbed_text = ("not measured" if share is None
                          else f"{share:.0%} (< {r['disturbed_bound']:g})")
        sha = r["git"]["commit"]
        sha = "?" if sha is None else sha[:10] + (" (dirty)" if r["git"]["dirty"] else "")
        command = "`" + r["command"].replace("`", "'") + "`"
        cells = [r["name"], r["question"], figures, r["clock"], disturbed_text,
                 _machine_cell(r["machine"]), sha, r["date"], command]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"
