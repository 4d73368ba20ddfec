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

from dataclasses import dataclass, field

from ..registry import parse_settings
from .drafters import DRAFTERS

__all__ = ["DrafterSpec"]

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
        try:
            settings = parse_settings(params, what="setting", booleans=True)
        except ValueError as e:
            raise ValueError(f"drafter {text!r}: {e}") from None
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
