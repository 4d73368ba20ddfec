"""Registries and plugin loading (``workbench.registry``, ``workbench.plugins``): a plugin
missing a required hook or misspelling one is refused at registration, naming it; a lookup
of an unknown name lists the registered ones; installed distributions register through entry
points (a distribution's metadata folder on ``sys.path``, no pip install); a plugin file or
module loads, and loads again in place."""
import sys

import pytest

from workbench.plugins import check_plugins, load_plugins
from workbench.registry import PluginError, Registry


class Base:
    def begin(self):
        pass

    def keep_rows(self, rows):
        pass


def _registry(group="workbench.test_things"):
    return Registry("thing", group, required=("draft",), optional=("begin", "keep_rows"))


def test_a_plugin_registers_and_is_found_by_name_built_ins_first():
    things = _registry()

    @things.register("builtin_one", builtin=True)
    class One(Base):
        def draft(self):
            return 1

    @things.register("mine")
    class Mine(Base):
        def draft(self):
            return 2
    assert things["mine"] is Mine and things.get("builtin_one") is One
    assert things.names() == ["builtin_one", "mine"] and things.plugin_names() == ["mine"]
    with pytest.raises(ValueError, match=r"thing 'minr': accepted one of \['builtin_one', 'mine'\]"):
        things.get("minr")


def test_a_plugin_without_a_required_hook_is_refused_naming_it():
    things = _registry()
    with pytest.raises(PluginError, match=r"lacks the required hook\(s\) \['draft'\]"):
        @things.register("lazy")
        class Lazy(Base):
            pass
    assert "lazy" not in things


def test_a_misspelled_hook_is_refused_at_registration_naming_the_hook():
    things = _registry()
    with pytest.raises(PluginError, match=r"defines 'keep_row', .* looks like the hook 'keep_rows'"):
        @things.register("typo")
        class Typo(Base):
            def draft(self):
                return 0

            def keep_row(self, rows):  # meant keep_rows: the default would stay in place
                pass
    assert "typo" not in things


def test_a_taken_name_is_refused_and_the_same_plugin_again_replaces_itself():
    things = _registry()

    def make():
        class Same(Base):
            def draft(self):
                return 0
        return Same
    first, again = make(), make()
    things.add("same", first)
    things.add("same", again)  # a file loaded twice: its new definition stands
    assert things["same"] is again

    class Other(Base):
        def draft(self):
            return 1
    with pytest.raises(PluginError, match="'same' is taken by"):
        things.add("same", Other)
    with pytest.raises(PluginError, match="name 'a:b'"):
        things.add("a:b", Other)


def test_installed_distributions_register_through_entry_points(tmp_path, monkeypatch):
    """A distribution's metadata folder on ``sys.path``, as pip would leave it."""
    (tmp_path / "my_drafting").mkdir()
    (tmp_path / "my_drafting" / "__init__.py").write_text(
        "class Echo:\n    def draft(self):\n        return 'echo'\n")
    meta = tmp_path / "my_drafting-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: my-drafting\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text("[workbench.test_things]\necho = my_drafting:Echo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    things = _registry()
    assert things.names() == ["echo"] and things["echo"]().draft() == "echo"


def test_plugin_files_and_modules_load_and_bad_ones_are_refused_before_any_loads(tmp_path):
    seen = tmp_path / "seen.txt"
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(f"open({str(seen)!r}, 'a').write('x')\n")
    modules = load_plugins([str(plugin), "json"])
    assert modules[1] is sys.modules["json"] and seen.read_text() == "x"
    load_plugins(str(plugin))  # a file loads again in place
    assert seen.read_text() == "xx"
    with pytest.raises(ValueError, match="no such file"):
        load_plugins([str(plugin), str(tmp_path / "missing.py")])
    assert seen.read_text() == "xx"  # refused before any was loaded
    with pytest.raises(ValueError, match="neither a .py file nor a module"):
        check_plugins(["no_such_module_anywhere"])
    with pytest.raises(ValueError, match="accepted a list"):
        check_plugins(3)


def test_the_cli_loads_plugins_before_its_command_and_refuses_a_missing_one(tmp_path, capsys):
    from workbench.cli import main
    seen = tmp_path / "seen.txt"
    plugin = tmp_path / "cli_plugin.py"
    plugin.write_text(f"open({str(seen)!r}, 'a').write('loaded')\n")
    table = tmp_path / "RESULTS.md"
    assert main(["--plugins", str(plugin), "results", "table", "--folder", str(tmp_path),
                 "--out", str(table)]) == 0
    assert seen.read_text() == "loaded"
    assert main(["--plugins", str(tmp_path / "missing.py"), "results", "table"]) == 2
    assert "missing.py" in capsys.readouterr().err
