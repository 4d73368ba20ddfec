"""Registries: the named seams a researcher plugs into (drafters, decoding arms, RL variants,
importance scores), one kind each.

A registry maps a name to a plugin (a class or a function) and says what a plugin of its kind
must have: the *required* hooks (no default: a plugin without one is refused when it is
registered, naming the hook) and the *optional* ones (the protocol's defaults stand in). A
public method whose name is one letter or two off a hook's (``keep_row`` for ``keep_rows``)
is refused too, naming both: a misspelled optional hook would otherwise leave the default in
place without a word.

Names come from three places, all before a name is looked up:

1. the package's built-ins, registered where they are defined (``@DRAFTERS.register("ngram")``);
2. installed distributions, through the entry-point group of the registry's kind
   (``[project.entry-points."workbench.drafters"]``: ``name = "module:object"``; the object
   is registered under ``name``, or, when it is a module, importing it registers what it
   defines), read once, at the first lookup;
3. a researcher's own files or modules, loaded by ``workbench.plugins.load_plugins`` (the
   notebooks' and the CLI's ``plugins``), whose decorators run on import.

Every lookup of an unknown name raises a ``ValueError`` that lists the registered names.
"""
from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from types import ModuleType
from typing import Generic, TypeVar

__all__ = ["Registry", "PluginError", "parse_settings"]

T = TypeVar("T")


class PluginError(TypeError):
    """A plugin refused at registration: a required hook missing, a hook misspelled, or a
    name already taken by another plugin."""


class Registry(Generic[T]):
    """Named plugins of one ``kind``, checked against their hooks when registered.

    Args:
        kind: what a plugin is, in messages (``"drafter"``).
        group: the entry-point group installed distributions register under
            (``"workbench.drafters"``).
        required: hooks a plugin must define (a method, or an attribute of a class).
        optional: hooks the protocol defines with defaults; a plugin may override them.
        check: further checks of a plugin (``None``: hooks only); raises ``PluginError``.
    """

    def __init__(self, kind: str, group: str, required: tuple[str, ...] = (),
                 optional: tuple[str, ...] = (), check: Callable[[str, T], None] | None = None):
        self.kind, self.group = kind, group
        self.required, self.optional = tuple(required), tuple(optional)
        self._check = check
        self._entries: dict[str, T] = {}
        self._builtin: set[str] = set()
        self._discovered = False

    # ---- registering --------------------------------------------------------------------
    def register(self, name: str, *, builtin: bool = False) -> Callable[[T], T]:
        """Decorator: register the decorated class or function under ``name`` (checked
        first: :meth:`add`); returns it unchanged."""
        def decorate(plugin: T) -> T:
            self.add(name, plugin, builtin=builtin)
            return plugin
        return decorate

    def add(self, name: str, plugin: T, *, builtin: bool = False) -> None:
        """Register ``plugin`` under ``name``. Refused (``PluginError``, nothing registered):
        a name that is not an identifier-like string, a name another plugin holds (the same
        plugin again, as when its file is loaded twice, is taken), a missing required hook,
        a public method named like a hook but misspelled, or the registry's own check."""
        if not isinstance(name, str) or not name or name != name.strip() or ":" in name:
            raise PluginError(f"{self.kind} name {name!r}: accepted a non-empty string without "
                              "spaces at its ends or ':'")
        held = self._entries.get(name)
        if held is not None and not _same(held, plugin):
            raise PluginError(f"{self.kind} {name!r} is taken by {_label(held)}; {_label(plugin)} "
                              f"needs another name (registered: {self.names(discover=False)})")
        self._check_hooks(name, plugin)
        if self._check is not None:
            self._check(name, plugin)
        self._entries[name] = plugin
        if builtin:
            self._builtin.add(name)

    def _check_hooks(self, name: str, plugin) -> None:
        missing = [h for h in self.required if not hasattr(plugin, h)]
        if missing:
            raise PluginError(f"{self.kind} {name!r} ({_label(plugin)}) lacks the required "
                              f"hook(s) {missing}; a {self.kind} defines {list(self.required)}"
                              + (f" and may define {list(self.optional)}" if self.optional else ""))
        hooks = self.required + self.optional
        for attr in _own_public_names(plugin):
            if attr in hooks:
                continue
            near = difflib.get_close_matches(attr, hooks, n=1, cutoff=0.85)
            if near:
                raise PluginError(f"{self.kind} {name!r} ({_label(plugin)}) defines {attr!r}, "
                                  f"which is no hook but looks like the hook {near[0]!r}; rename "
                                  f"it (hooks: {list(hooks)})")

    # ---- looking up ---------------------------------------------------------------------
    def names(self, discover: bool = True) -> list[str]:
        """Every registered name: the built-ins first, in the order registered, then the
        plugins'."""
        if discover:
            self.discover()
        return [n for n in self._entries if n in self._builtin] + \
            [n for n in self._entries if n not in self._builtin]

    def plugin_names(self) -> list[str]:
        """The names registered by plugins (entry points and loaded files), not built in."""
        return [n for n in self.names() if n not in self._builtin]

    def __contains__(self, name) -> bool:
        self.discover()
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        """The plugin registered as ``name``; ``ValueError`` naming it and the registered
        names otherwise."""
        return self._entries[self.check(name)]

    __getitem__ = get

    def check(self, name, what: str | None = None) -> str:
        """``name`` when it is registered; else ``ValueError`` naming ``what`` (default: the
        kind), the value and every registered name."""
        if name in self:
            return name
        raise ValueError(f"{what or self.kind} {name!r}: accepted one of {self.names()} (a "
                         f"plugin registers more: docs/extending.md)")

    def discover(self) -> None:
        """Register what installed distributions declare in the registry's entry-point
        group, once (a later call does nothing)."""
        if self._discovered:
            return
        self._discovered = True
        for point in entry_points(group=self.group):
            loaded = point.load()
            if not isinstance(loaded, ModuleType):  # a module registers itself on import
                self.add(point.name, loaded)

    def unregister(self, name: str) -> None:
        """Forget plugin ``name`` (built-ins stay): for tests and notebooks that load a
        plugin file again under another definition."""
        if name in self._builtin:
            raise ValueError(f"{self.kind} {name!r} is built in and stays registered")
        self._entries.pop(name, None)


def _own_public_names(plugin) -> list[str]:
    """The public names a plugin class defines itself (not inherited: those are the
    protocol's own), or nothing for a function."""
    if not inspect.isclass(plugin):
        return []
    return [n for n in vars(plugin) if not n.startswith("_")]


def _same(a, b) -> bool:
    """The same plugin: the same object, or the same qualified name in the same file (a file
    loaded again defines new objects)."""
    if a is b:
        return True
    key = lambda p: (getattr(p, "__module__", None), getattr(p, "__qualname__", None),  # noqa: E731
                     inspect.getsourcefile(p) if inspect.isclass(p) or inspect.isfunction(p)
                     else None)
    try:
        return key(a) == key(b) and key(a)[1] is not None
    except TypeError:
        return False


def _label(plugin) -> str:
    module = getattr(plugin, "__module__", None) or "?"
    return f"{module}.{getattr(plugin, '__qualname__', type(plugin).__name__)}"


_SETTING = re.compile(r"([A-Za-z_]\w*)=([^,=]+)")


def parse_settings(params: str, *, what: str, booleans: bool) -> dict:
    """The ``key=value,...`` tail of a registered name's spec (``"NAME:key=value,..."``, as
    drafters and decoding arms are named) as a dict, each value an integer, a number, with
    ``booleans`` ``true``/``false`` as bools, else the word; ``ValueError`` naming the first
    part that is not ``key=value`` or repeats a key (``what``: ``"setting"``, ``"parameter"``)."""
    settings: dict = {}
    for part in params.split(",") if params else []:
        match = _SETTING.fullmatch(part)
        if match is None or match.group(1) in settings:
            raise ValueError(f"{what} {part!r} is not 'key=value' given once")
        settings[match.group(1)] = _value(match.group(2), booleans)
    return settings


def _value(text: str, booleans: bool):
    if booleans and text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
