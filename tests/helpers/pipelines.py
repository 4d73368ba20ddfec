"""A pipeline project in a temporary folder (the ``project`` fixture) and the notebooks it runs."""
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell
from nbformat.v4 import new_notebook


NOTEBOOK_METADATA = {
    "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
    "language_info": {"name": "python"},
}

PARAMETERS = 'out_dir = "."\nseed = 0\nx = 1\nfail = False'

BODY = [
    "if fail:\n    raise RuntimeError(f'asked to fail with x={x}')",
    "import json, pathlib\n"
    "pathlib.Path(out_dir, 'metrics.json').write_text("
    "json.dumps({'y': x * 2 + seed, 'extra': {'z': seed}, 'curve': [1, 2]}))",
]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root with notebooks/toy.ipynb and a pipelines/ folder."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pipelines").mkdir()
    write_notebook(tmp_path / "notebooks" / "toy.ipynb")
    return tmp_path


def write_pipeline(project: Path, text: str, name: str = "demo") -> Path:
    """The YAML lives in pipelines/, so notebook paths resolve against the project root (the
    test's cwd is elsewhere): the documented fallback."""
    path = project / "pipelines" / f"{name}.yaml"
    path.write_text(text)
    return path


def write_threads_notebook(project: Path, name: str, first: str = "") -> Path:
    """notebooks/<name>.ipynb: the toy notebook, then ``first`` and a cell adding the kernel's
    ``OMP_NUM_THREADS`` (0 when unset) to its metrics as ``threads``."""
    notebook = nbformat.read(project / "notebooks" / "toy.ipynb", as_version=4)
    notebook.cells.append(new_code_cell(
        f"import os, time, json, pathlib\n{first}\n"
        "m = pathlib.Path(out_dir, 'metrics.json')\n"
        "m.write_text(json.dumps({**json.loads(m.read_text()), "
        "'threads': int(os.environ.get('OMP_NUM_THREADS', '0'))}))"))
    path = project / "notebooks" / f"{name}.ipynb"
    nbformat.write(notebook, path)
    return path


def write_notebook(path: Path, parameters_cell: str | None = PARAMETERS) -> Path:
    cells = [new_code_cell(parameters_cell, metadata={"tags": ["parameters"]})] if parameters_cell else []
    cells += [new_code_cell(source) for source in BODY]
    nbformat.write(new_notebook(cells=cells, metadata=NOTEBOOK_METADATA), path)
    return path
