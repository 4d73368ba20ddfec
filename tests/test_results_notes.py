"""RESULTS.md, the lab notes and the citations agree (issue 42): every result links a lab note
that exists, a superseded result names its successor, the notes' index lists every note and
each note's rows exist, BENCHMARKS.md stays a pointer, and code and docs cite results by
their RESULTS.md row names, which exist."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.provenance import read_result

ROOT = Path(__file__).resolve().parent.parent
NOTES = ROOT / "docs" / "lab-notes"
RESULTS = ROOT / "benchmarks" / "results"


def results() -> dict[str, dict]:
    return {p.stem: read_result(p) for p in sorted(RESULTS.glob("*.json"))}


def notes() -> list[Path]:
    return sorted(p for p in NOTES.glob("*.md") if p.name != "README.md")


def test_every_result_links_a_lab_note_that_exists():
    missing, broken = [], []
    for name, result in results().items():
        links = re.findall(r"\]\((docs/lab-notes/[\w.-]+\.md)(?:#[\w-]+)?\)", result["question"])
        if not links:
            missing.append(name)
        broken += [f"{name}: {link}" for link in links if not (ROOT / link).is_file()]
    assert missing == [], f"results without a lab note link in their question: {missing}"
    assert broken == [], broken


def test_a_superseded_result_names_an_existing_successor():
    found = results()
    wrong = []
    for name, result in found.items():
        m = re.match(r"SUPERSEDED by `([\w.-]+)`", result["question"])
        if m and (m[1] not in found or m[1] == name
                  or found[m[1]]["question"].startswith("SUPERSEDED")):
            wrong.append(f"{name} -> {m[1]}")
    assert wrong == [], f"a successor must be a current result: {wrong}"


def test_the_index_lists_every_note_and_each_note_names_existing_rows():
    index = (NOTES / "README.md").read_text()
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    assert {p.name for p in notes()} <= listed, "add the notes to docs/lab-notes/README.md"
    assert all((NOTES / name).is_file() for name in listed)
    found = results()
    for path in notes():
        assert re.match(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md$", path.name), path.name
        header = path.read_text().split("\n\n", 3)[1]  # the line after the title
        rows = re.findall(r"`([\w.-]+)`", header.split("Machine", 1)[0])
        assert rows and all(r in found for r in rows), (path.name, rows)


def test_benchmarks_md_is_a_pointer():
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert len(text.splitlines()) <= 20 and "RESULTS.md" in text and "docs/lab-notes/" in text


def cited_rows(text: str) -> list[str]:
    """Row names cited as "RESULTS.md, `name`" (or ":", " (", " rows") in ``text``, up to the
    closing parenthesis."""
    out = []
    for m in re.finditer(r"RESULTS\.md`{0,2}(?=,|:| \(| rows?\b)", text):
        window = text[m.end():m.end() + 200].split(")", 1)[0]
        out += re.findall(r"(?<![\w/.-])`{0,2}([a-z][a-z0-9]*(?:_[a-z0-9.-]+)+)`{0,2}(?![\w/])",
                          window)
    return out


def sources() -> list[Path]:
    files = [*sorted((ROOT / "workbench").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py")),
             *sorted((ROOT / "pipelines").glob("*.yaml")), *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "notebooks").glob("*.ipynb")), ROOT / "README.md"]
    return [f for f in files if f.is_file()]


def test_code_and_docs_cite_results_by_row_names_that_exist():
    found = results()
    wrong, dated = [], []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT).as_posix()
        wrong += [f"{where}: {row}" for row in cited_rows(text) if row not in found]
        if "BENCHMARKS.md" in text:
            dated.append(where)
    assert wrong == [], f"cited rows that RESULTS.md does not have: {wrong}"
    assert dated == [], f"cite RESULTS.md rows, not BENCHMARKS.md: {dated}"


@pytest.mark.parametrize("text, rows", [
    ("(RESULTS.md, ``ablation_memory``: three runs)", ["ablation_memory"]),
    ("(RESULTS.md: `sd_eagle_batch`,\n`sd_threshold`), because", ["sd_eagle_batch", "sd_threshold"]),
    ("# (RESULTS.md,\n    # drafter_narrow_harvest), hence 1e-4", ["drafter_narrow_harvest"]),
    ("[RESULTS.md](../RESULTS.md), with the commands (`tests/test_layers.py`)", []),
    ("the table ``RESULTS.md`` generated from write_text", []),
])
def test_cited_rows_reads_the_names_after_results_md(text, rows):
    assert cited_rows(text) == rows
