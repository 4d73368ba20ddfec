"""Speculative decoding: drafters, acceptance rules, the EAGLE head and its training."""
from .drafters import Drafter, LMDrafter, NGramDrafter, ScriptedDrafter
from .verify import accept_by_target, speculative_accept

__all__ = ["Drafter", "NGramDrafter", "ScriptedDrafter", "LMDrafter", "accept_by_target",
           "speculative_accept"]
