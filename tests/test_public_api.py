"""The README's list of public names (section "Every public name, by module") is what a user
calls: each name imports from the module the list says, the module's ``__all__`` is exactly its
row, every subpackage's ``__init__`` exports its row or nothing, and the notebooks, the
package's first users, call nothing the list leaves out."""
import ast
import importlib
import importlib.util
import json
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def public_names() -> dict[str, list[str]]:
    """``{module: [names]}`` from the table between the README's public-api markers."""
    text = README.read_text()
    block = text.split("<!-- public-api: begin -->", 1)[1].split("<!-- public-api: end -->", 1)[0]
    rows = re.findall(r"^\| `(workbench[\w.]*)` \| (.*) \|$", block, re.M)
    return {module: re.findall(r"`(\w+)`", names) for module, names in rows}


def test_the_list_is_there_and_names_each_module_once():
    rows = re.findall(r"^\| `(workbench[\w.]*)` \|",
                      README.read_text().split("<!-- public-api: begin -->", 1)[1]
                      .split("<!-- public-api: end -->", 1)[0], re.M)
    assert len(rows) >= 40
    assert len(rows) == len(set(rows)), sorted(m for m in rows if rows.count(m) > 1)


@pytest.mark.parametrize("module", sorted(public_names()))
def test_every_listed_name_imports_from_its_module_and_is_exported(module):
    mod = importlib.import_module(module)
    names = public_names()[module]
    assert names, module
    missing = [n for n in names if not hasattr(mod, n)]
    assert missing == [], f"{module} lacks {missing}"
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{module} has no __all__"
    unexported = [n for n in names if n not in exported]
    assert unexported == [], f"{module}.__all__ leaves out {unexported}"


@pytest.mark.parametrize("module", sorted(public_names()))
def test_every_listed_module_exports_exactly_its_row(module):
    """The README's row and the module's ``__all__`` are one list written twice: a name added
    to either alone fails here, so the two cannot drift."""
    exported = set(importlib.import_module(module).__all__)
    listed = set(public_names()[module])
    assert exported - listed == set(), f"{module}.__all__ exports names the README leaves out"
    assert listed - exported == set(), f"the README lists names {module}.__all__ leaves out"


def _subpackages() -> list[str]:
    import workbench
    return sorted(info.name for info in pkgutil.walk_packages(workbench.__path__, "workbench.")
                  if info.ispkg)


def test_the_walk_finds_the_subpackages():
    assert {"workbench.rollout", "workbench.speculative", "workbench.compress",
            "workbench.viz"} <= set(_subpackages())


@pytest.mark.parametrize("package", _subpackages())
def test_every_subpackage_exports_its_row_or_nothing(package):
    """A package's ``__init__`` re-exports what a user calls from the package top: its README
    row, or nothing where the README lists none (its modules are then imported by path)."""
    mod = importlib.import_module(package)
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{package} has no __all__"
    assert set(exported) == set(public_names().get(package, [])), package


def _notebook_calls(source: str) -> set[tuple[str, str]]:
    """``(module, name)`` for every workbench name a cell imports or reaches as an attribute
    of a workbench module it imported (``viz.gantt``, ``cviz.pareto``); submodules skipped."""
    bound, calls = {}, set()

    def is_module(dotted: str) -> bool:
        try:
            return importlib.util.find_spec(dotted) is not None
        except ModuleNotFoundError:  # the parent is a module, not a package
            return False

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if is_module(full):
                    bound[alias.asname or alias.name] = full
                else:
                    calls.add((node.module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("workbench") and alias.asname:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound):
            module = bound[node.value.id]
            if not is_module(f"{module}.{node.attr}"):
                calls.add((module, node.attr))
    return calls


def test_the_notebooks_call_only_listed_names():
    listed = {(m, n) for m, names in public_names().items() for n in names}
    unlisted = set()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        unlisted |= {(notebook.stem, m, n) for m, n in _notebook_calls(source)
                     if (m, n) not in listed}
    assert unlisted == set(), "list these in the README's public names, or stop calling them"


def test_the_check_reads_attributes_and_imports():
    calls = _notebook_calls("from workbench import viz\nfrom workbench.viz import rl as rlviz\n"
                            "from workbench.models import load_model\n"
                            "viz.gantt(x); rlviz.reward_curves(y); viz.sd_whatif")
    assert calls == {("workbench.viz", "gantt"), ("workbench.viz.rl", "reward_curves"),
                     ("workbench.models", "load_model")}
