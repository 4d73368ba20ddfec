"""Speculative decoding: drafters, the EAGLE head and its training, measures, sweeps, and the
adaptive schedule (BEG-MAB bandit)."""
from .bandit import AdaptiveSchedule, BucketedBandit
from .drafter_set import DrafterSet
from .drafters import CachedDrafter, Drafter, EagleDrafter, LMDrafter, NGramDrafter
from .eagle import EagleHead
from .sibling import SiblingDrafter
from .suffix import SuffixDrafter

__all__ = ["Drafter", "CachedDrafter", "NGramDrafter", "LMDrafter", "EagleDrafter", "EagleHead",
           "SiblingDrafter", "SuffixDrafter", "DrafterSet", "AdaptiveSchedule", "BucketedBandit"]
