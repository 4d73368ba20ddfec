"""Configs that hold other configs, and still take flat keyword arguments.

A config that needs a rollout's or an optimizer's settings holds that config
(``GRPOConfig.rollout`` is a ``RolloutConfig``, ``GRPOConfig.train`` a ``TrainConfig``)
instead of re-declaring its fields and copying them over by hand, so every field is declared,
defaulted and checked once, and its error names the class that declares it. Notebooks and
YAML pipelines keep flat parameters: :meth:`NestedConfig.flat` routes each keyword to the
config that declares it, by field name, so a cell reads
``GRPOConfig.flat(prompts_per_step=16, max_new_tokens=256, lr=2e-4, seed=0)``.

Layering: imports nothing from the workbench, so every layer's config may use it.
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

__all__ = ["NestedConfig"]


def _parts(config) -> dict:
    """The fields of ``config`` that hold a config themselves: ``{field name: config}``."""
    out = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if f.init and is_dataclass(value) and not isinstance(value, type):
            out[f.name] = value
    return out


def _accepted(config) -> set[str]:
    """Every keyword that sets a field of ``config``: its own init fields and, when it is a
    :class:`NestedConfig`, recursively those of the configs it holds."""
    names = {f.name for f in fields(config) if f.init}
    if isinstance(config, NestedConfig):
        for part in _parts(config).values():
            names |= _accepted(part)
    return names


class NestedConfig:
    """Mixin for a dataclass config that holds other dataclass configs.

    A keyword goes to the config's own field of that name when there is one, else to every
    held config that accepts it (``seed`` seeds both the rollout and the optimizer of a
    ``GRPOConfig``). Every config involved validates itself as it is built.
    """

    def __new__(cls, *args, **values):
        """Refuse a flat keyword given to the constructor, naming the config that holds it
        and :meth:`flat` (the dataclass's own ``__init__`` would say only "unexpected keyword
        argument", and code written against a flat constructor would not know where the
        field went)."""
        own = {f.name for f in fields(cls) if f.init}
        stray = [key for key in values if key not in own]
        if stray:
            default = cls()
            homes = {key: [name for name, part in _parts(default).items()
                           if key in _accepted(part)] for key in stray}
            unknown = [key for key in stray if not homes[key]]
            if unknown:
                raise TypeError(f"{cls.__name__} has no parameter {unknown[0]!r}; accepted: "
                                f"{sorted(_accepted(default))}")
            where = "; ".join(f"{key!r} is a field of "
                              + " and ".join(f"{cls.__name__}.{name}" for name in homes[key])
                              for key in stray)
            raise TypeError(f"{cls.__name__}({', '.join(f'{k}=...' for k in stray)}): {where}; "
                            f"pass it inside that config, or build with "
                            f"{cls.__name__}.flat({stray[0]}=...), which routes flat keywords")
        return super().__new__(cls)

    @classmethod
    def flat(cls, **values):
        """The default config with ``values`` set wherever they are declared."""
        return cls().updated(**values)

    def updated(self, **values):
        """A copy of this config with ``values`` set wherever they are declared; a name no
        config here declares is a ``ValueError`` that lists the accepted ones."""
        own = {f.name for f in fields(self) if f.init}
        parts = _parts(self)
        top: dict = {}
        nested: dict[str, dict] = {name: {} for name in parts}
        for key, value in values.items():
            if key in own:
                top[key] = value
                continue
            homes = [name for name, part in parts.items() if key in _accepted(part)]
            if not homes:
                raise ValueError(f"{type(self).__name__} has no parameter {key!r}; accepted: "
                                 f"{sorted(_accepted(self))}")
            for name in homes:
                nested[name][key] = value
        for name, kw in nested.items():
            if kw:
                base = top.get(name, parts[name])
                try:
                    top[name] = (base.updated(**kw) if isinstance(base, NestedConfig)
                                 else replace(base, **kw))
                except ValueError as err:  # say which part of this config refused it
                    raise ValueError(f"{type(self).__name__}.{name}: {err}") from err
        return replace(self, **top)
