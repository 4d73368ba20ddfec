"""A registered drafter named with its settings in one string, for an RL run's config.

An RL run saves its config's text with its checkpoints, and an ablation compares its
settings as text (``rl.ablation.store.ablation_settings``) to refuse resuming a folder under
other ones. A drafter that a run builds by name must therefore carry its settings in that
name, so that both reach the fingerprint: ``"NAME"`` or ``"NAME:key=value,..."``, where
``NAME`` is registered in :data:`~workbench.speculative.drafters.DRAFTERS` (a built-in or a
plugin's) and each ``value`` is an integer, a number, ``true``/``false`` or a word. The run
builds it by its class's ``build(policy, tokenizer, **settings)`` (``Drafter.build``: by
default ``cls(**settings)``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .drafters import DRAFTERS

__all__ = ["DrafterSpec"]

_SETTING = re.compile(r"([A-Za-z_]\w*)=([^,=]+)")


@dataclass(frozen=True)
class DrafterSpec:
    """A registered drafter's name and the settings its ``build`` gets."""

    name: str
    settings: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "DrafterSpec":
        """The spec ``text`` writes (spaces ignored); ``ValueError`` naming what is wrong and
        the registered drafters."""
        if not isinstance(text, str):
            raise ValueError(f"drafter {text!r}: accepted a registered drafter's name, "
                             f"optionally with settings 'NAME:key=value,...'; registered: "
                             f"{DRAFTERS.names()}")
        name, _, params = text.replace(" ", "").partition(":")
        if name not in DRAFTERS:
            raise ValueError(f"drafter {name!r} is not registered; registered: "
                             f"{DRAFTERS.names()} (a plugin registers its own: docs/extending.md)")
        settings: dict = {}
        for part in params.split(",") if params else []:
            match = _SETTING.fullmatch(part)
            if match is None or match.group(1) in settings:
                raise ValueError(f"drafter {text!r}: setting {part!r} is not 'key=value' given "
                                 "once")
            settings[match.group(1)] = _value(match.group(2))
        return cls(name, settings)

    def build(self, policy, tokenizer):
        """The drafter for ``policy`` and ``tokenizer``: its class's ``build`` with the
        settings; ``ValueError`` when the class does not take them."""
        kind = DRAFTERS.get(self.name)
        try:
            return kind.build(policy, tokenizer, **self.settings)
        except TypeError as e:  # a setting its build or constructor does not take
            if not self.settings:
                raise
            raise ValueError(f"drafter {self.name!r} does not take the settings "
                             f"{self.settings} ({e})") from None


def _value(text: str):
    if text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
