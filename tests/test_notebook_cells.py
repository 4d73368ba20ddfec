"""Notebooks are thin: each composes package functions, so a code cell is at most 25 lines
and defines no function or class (logic lives in the package, where it is tested). The
parameters cell is the exception to the length: papermill reads one assignment per line of
one tagged cell (test_notebooks.test_every_parameter_is_visible_to_papermill), so a notebook
with many parameters has a long parameters cell."""
import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_LINES = 25


def _code_cells(path: Path):
    nb = nbformat.read(path, as_version=4)
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cell_but_the_parameters_is_short_and_defines_nothing(path):
    long, defined = [], []
    for i, cell in _code_cells(path):
        if "parameters" in cell.metadata.get("tags", []):
            continue
        if len(cell.source.splitlines()) > MAX_LINES:
            long.append((i, len(cell.source.splitlines())))
        defined += [(i, node.name) for node in ast.walk(ast.parse(cell.source))
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert long == [], f"cells (index, lines) over {MAX_LINES} lines: move logic into the package"
    assert defined == [], "functions or classes defined in a notebook belong in the package"
