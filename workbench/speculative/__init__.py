"""Speculative decoding: drafters, the EAGLE head and its training, measures and sweeps."""
from .drafters import CachedDrafter, Drafter, EagleDrafter, LMDrafter, NGramDrafter
from .eagle import EagleHead

__all__ = ["Drafter", "CachedDrafter", "NGramDrafter", "LMDrafter", "EagleDrafter", "EagleHead"]
