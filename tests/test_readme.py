"""The README's public API names what the packages export."""
import importlib
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


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
