"""The README a newcomer reads first: short, with its sections, its figure and links that
resolve, the quickstart described as its pipeline runs it, and every name it shows importable
(the full list of public names is the generated API reference: tests/test_public_api.py)."""
import importlib
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_readme_is_short_and_has_its_sections():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "the README is at most 200 lines: move detail to docs/"
    headings = re.findall(r"^## (.+)$", text, re.M)
    for wanted in ("Two commands", "Notebooks", "Use your own model", "JupyterLab", "Ray",
                   "Command line", "Where to read next"):
        assert any(wanted in h for h in headings), (wanted, headings)


def test_the_readme_links_and_figure_resolve():
    """Every relative link and image of the README names a file of the repository; the
    reading path (architecture, design, extending, RESULTS.md, the API reference) is linked."""
    text = README.read_text()
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
               if not re.match(r"^[a-z]+:", t)]
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == [], missing
    assert re.search(r"!\[[^\]]+\]\(docs/figures/[\w.-]+\.png\)", text), "the figure"
    for page in ("docs/architecture.md", "docs/design.md", "docs/extending.md", "RESULTS.md",
                 "docs/api/index.md"):
        assert page in targets, page


def test_the_readme_says_which_notebooks_the_quickstart_runs():
    spec = yaml.safe_load((ROOT / "pipelines" / "quickstart.yaml").read_text())
    runs = sorted(Path(entry["notebook"]).name[:2] for entry in spec["notebooks"])
    said = re.findall(r"quickstart[^()\n]*?(?:\(|notebooks )(\d\d) and (\d\d)",
                      README.read_text().replace("\n", " "))
    assert said, "the README names the quickstart's notebooks"
    assert all(sorted(pair) == runs for pair in said), (said, runs)


def test_every_import_in_the_readme_resolves():
    text = README.read_text()
    imports = re.findall(r"^from (workbench[\w.]*) import ([\w, ]+?)\s*(?:#.*)?$", text, re.M)
    assert len(imports) >= 6
    for module, names in imports:
        mod = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            if not hasattr(mod, name):  # a subpackage, as in `from workbench import viz`
                importlib.import_module(f"{module}.{name}")


def test_every_dotted_name_in_the_readme_exists():
    """`workbench.a.b.c` mentioned in the README is a module or an attribute of one."""
    for dotted in set(re.findall(r"`(workbench(?:\.\w+)+)", README.read_text())):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"README names {dotted}, but {attr} is missing"
                obj = getattr(obj, attr)
            break
        else:
            raise AssertionError(f"README names {dotted}, which does not import")
