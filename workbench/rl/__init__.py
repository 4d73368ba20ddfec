"""Reinforcement learning: GRPO and the TLT trainer that speeds its rollouts up."""
from .config import GRPOConfig, LOSS_AGGREGATIONS
from .grpo import GRPO, RLStep
from .loss import aggregate, group_advantages, grpo_loss, k3, token_terms

__all__ = ["GRPOConfig", "LOSS_AGGREGATIONS", "aggregate", "group_advantages", "grpo_loss",
           "k3", "token_terms", "GRPO", "RLStep"]
