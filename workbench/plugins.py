"""Loading a researcher's plugins: Python files or importable modules whose decorators
register drafters, decoding arms, RL variants or importance scores (``workbench.registry``).

Every notebook and the CLI take ``plugins``: a list of such files or module names, loaded
before anything else, so that their names are accepted by the parameters that follow. An
installed distribution needs none of this: its entry points are read at the first lookup.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_plugins", "check_plugins", "file_plugins"]

FILE_PLUGIN_PREFIX = "workbench_plugin_"
"""How the module name of a plugin loaded from a file starts (its path's stem and a hash of
the path follow): a name no other process can import (:func:`file_plugins`)."""


def check_plugins(plugins) -> list[str]:
    """``plugins`` as a list of strings: each an existing ``.py`` file or a module name that
    can be found; ``ValueError`` naming the first that is neither, before any is loaded."""
    if isinstance(plugins, (str, Path)):
        plugins = [plugins]
    if not isinstance(plugins, (list, tuple)):
        raise ValueError(f"plugins {plugins!r}: accepted a list of Python files (.py) or "
                         "importable module names")
    out = []
    for spec in plugins:
        text = str(spec)
        if text.endswith(".py"):
            if not Path(text).expanduser().is_file():
                raise ValueError(f"plugin {text!r}: no such file; accepted a Python file (.py) "
                                 "or an importable module name")
        elif not text or importlib.util.find_spec(text) is None:
            raise ValueError(f"plugin {text!r} is neither a .py file nor a module that can be "
                             f"imported (searched sys.path: {sys.path[:3]}...)")
        out.append(text)
    return out


def load_plugins(plugins) -> list[ModuleType]:
    """Import every plugin of ``plugins`` (checked first: :func:`check_plugins`), in order;
    their modules. A file is imported as a module named after its path, so loading it again
    re-runs it (its registrations replace their earlier selves) and two files of one name
    stay apart."""
    return [_load_file(Path(p).expanduser()) if p.endswith(".py") else importlib.import_module(p)
            for p in check_plugins(plugins)]


def _load_file(path: Path) -> ModuleType:
    path = path.resolve()
    name = f"{FILE_PLUGIN_PREFIX}{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def file_plugins() -> list[ModuleType]:
    """The plugins of this process loaded from ``.py`` files (:func:`load_plugins`). Their
    modules are named after their paths, which no other process can import, so a backend of
    processes ships their classes (a plugin arm in a schedule, a plugin drafter) by value
    rather than by reference (``rollout.ray_backend``); an importable plugin module needs no
    such care."""
    return [module for name, module in list(sys.modules.items())
            if name.startswith(FILE_PLUGIN_PREFIX)]
