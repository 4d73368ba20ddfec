"""The map agrees with the territory: every import in workbench/ is one that the layer table of
docs/architecture.md allows, and the page's diagram draws that same table."""
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


def test_the_layout_of_the_design_notes_names_only_what_exists():
    block = (ROOT / "docs" / "design.md").read_text().split("## Layout", 1)[1]
    block = block.split("```", 2)[1]
    package = None
    for line in block.splitlines():  # entries: a file or folder at column 0 or 2
        entry = re.match(r"^( {0,2})(\w[\w.]*(?:/|\.\w+))\s", line + " ")
        if not entry:
            continue
        indent, name = entry.groups()
        if not indent:
            package = name if name.endswith("/") else None
            path = ROOT / name
        else:
            path = ROOT / (package or "") / name
        assert path.exists(), f"docs/design.md's layout names {path.relative_to(ROOT)}"
