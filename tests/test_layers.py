"""The map agrees with the territory: every import in workbench/ is one that the layer table of
docs/architecture.md allows, the page's diagram draws that same table, and every file and module
the page names exists (the layout lives on that page only)."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "workbench"


def layer_table() -> dict[str, tuple[list[str], list[str]]]:
    """``{layer: (module prefixes, layers it sits on)}`` in the page's order (bottom up)."""
    rows = re.findall(r"^\| (\w+) \| (`.*`) \| ([\w, -]+) \|$", PAGE.read_text(), re.M)
    table = {}
    for layer, modules, below in rows:
        prefixes = [f"workbench.{m}" for m in re.findall(r"`([\w.]+)`", modules)]
        table[layer] = (prefixes, [] if below.strip() == "-" else
                        [b.strip() for b in below.split(",")])
    return table


def diagram_edges() -> set[tuple[str, str]]:
    block = PAGE.read_text().split("```mermaid", 1)[1].split("```", 1)[0]
    return set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", block, re.M))


def allowed(table) -> dict[str, set[str]]:
    """Each layer with every layer it may import: itself and what it sits on, transitively."""
    out: dict[str, set[str]] = {}
    for layer, (_, below) in table.items():  # bottom up, so each layer below is done
        out[layer] = {layer}.union(*(out[b] for b in below))
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The workbench modules ``path`` imports, lazy imports inside functions included."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:  # `from workbench import viz` imports a module
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in out if m == "workbench" or m.startswith("workbench.")}


def layer_of(module: str, table) -> str | None:
    """The layer of the longest prefix that holds ``module`` (``rollout.timeline`` lies in
    *tables*, the rest of ``rollout`` in *rollout*)."""
    best = None
    for layer, (prefixes, _) in table.items():
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (layer, prefix)
    return best and best[0]


def test_the_table_is_bottom_up_and_the_diagram_draws_it():
    table = layer_table()
    assert len(table) >= 10 and list(table)[0] == "foundation"
    seen = set()
    for layer, (prefixes, below) in table.items():
        assert prefixes, layer
        assert set(below) <= seen, f"{layer} sits on {sorted(set(below) - seen)}, not below it"
        seen.add(layer)
    drawn = {(layer, b) for layer, (_, below) in table.items() for b in below}
    assert diagram_edges() == drawn


def test_every_module_lies_in_a_layer():
    table = layer_table()
    homeless = [m for m in modules() if m != "workbench" and layer_of(m, table) is None]
    assert homeless == [], "add them to the table of docs/architecture.md"


def test_no_layer_imports_one_above_it():
    table, found = layer_table(), modules()
    may = allowed(table)
    wrong = []
    for name, path in found.items():
        if name == "workbench":  # the package root holds the version only
            continue
        mine = layer_of(name, table)
        for target in sorted(imported(name, path, set(found))):
            theirs = layer_of(target, table)
            if theirs not in may[mine]:
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert wrong == [], "\n".join(wrong)


def test_viz_reads_tables_only():
    """The rule the table encodes for figures, said once more in its own words."""
    table, found = layer_table(), modules()
    for name, path in found.items():
        if layer_of(name, table) == "viz":
            used = {layer_of(t, table) for t in imported(name, path, set(found))}
            assert used <= {"viz", "tables", "foundation"}, (name, used)


@pytest.mark.parametrize("source, target, ok", [
    ("workbench.viz.timeline", "workbench.rollout.timeline", True),
    ("workbench.viz.sd_whatif", "workbench.speculative.whatif", False),
    ("workbench.rollout.engine", "workbench.speculative.bandit", False),
    ("workbench.rl.tlt", "workbench.speculative.bandit", True),
    ("workbench.compress.evaluate", "workbench.rollout", True),
    ("workbench.speculative.fit", "workbench.compress.prune", False),
    ("workbench.speculative.fit", "workbench.compress.plan", True),  # a table, not a model
])
def test_the_rule_tells_allowed_from_forbidden_imports(source, target, ok):
    table = layer_table()
    assert (layer_of(target, table) in allowed(table)[layer_of(source, table)]) is ok


def named_paths() -> list[str]:
    """What the page names in backticks that must exist: file and folder paths (``rl/loop.py``,
    ``rl/ablation/``, under ``workbench/`` or the repository) and dotted names that start with
    a package module (``rollout.decoder.BatchDecoder.step``)."""
    return re.findall(r"`([\w./]+)`", PAGE.read_text())


def resolves(name: str) -> bool:
    if "/" in name or name.endswith(".py"):
        return (PACKAGE / name).exists() or (ROOT / name).exists()
    parts = name.split(".")
    known = modules()
    if f"workbench.{parts[0]}" not in known:
        return True  # a class, parameter or value, not a module path
    for i in range(len(parts), 0, -1):  # the longest module prefix; the rest are attributes
        module = ".".join(["workbench", *parts[:i]])
        if module in known:
            if i == len(parts):
                return True
            attr = re.escape(parts[i])  # defined, assigned, exported or imported there
            return re.search(rf"(def|class) {attr}\b|^{attr}\s*[:=]|[\"']{attr}[\"']|"
                             rf"import .*\b{attr}\b", known[module].read_text(), re.M) is not None
    return False


def test_the_page_names_only_files_and_modules_that_exist():
    """The layout lives on this page only (docs/design.md keeps contracts, clocks and
    measures), so every file, folder and module it names must exist."""
    missing = [n for n in named_paths() if not resolves(n)]
    assert missing == [], f"docs/architecture.md names what does not exist: {missing}"


def test_the_design_notes_hold_no_second_layout():
    assert "## Layout" not in (ROOT / "docs" / "design.md").read_text(), (
        "the layout lives in docs/architecture.md only")
