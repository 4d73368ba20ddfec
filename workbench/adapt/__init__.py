"""Adaptive drafter: the harvest buffer and the spot trainer that uses idle workers."""
from .buffer import DrafterBuffer
from .spot import SpotConfig, SpotTrainer

__all__ = ["DrafterBuffer", "SpotConfig", "SpotTrainer"]
