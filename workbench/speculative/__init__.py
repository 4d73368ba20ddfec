"""Speculative decoding: drafters, the EAGLE head and its training, measures, sweeps, and the
adaptive schedule (BEG-MAB bandit)."""
from .bandit import AdaptiveSchedule, BucketedBandit
from .drafters import CachedDrafter, Drafter, EagleDrafter, LMDrafter, NGramDrafter
from .eagle import EagleHead

__all__ = ["Drafter", "CachedDrafter", "NGramDrafter", "LMDrafter", "EagleDrafter", "EagleHead",
           "AdaptiveSchedule", "BucketedBandit"]
