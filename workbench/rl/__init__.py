"""Reinforcement learning: GRPO and the TLT trainer that speeds its rollouts up."""
from .config import GRPOConfig
from .grpo import GRPO
from .loss import aggregate, group_advantages, grpo_loss, k3, token_terms

__all__ = ["GRPOConfig", "aggregate", "group_advantages", "grpo_loss", "k3", "token_terms", "GRPO"]
