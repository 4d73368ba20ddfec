"""Reinforcement learning: GRPO and the TLT trainer that speeds its rollouts up."""
from .grpo import (GRPOConfig, LOSS_AGGREGATIONS, aggregate, group_advantages, grpo_loss, k3,
                   token_terms)
from .runner import GRPO, RLStep

__all__ = ["GRPOConfig", "LOSS_AGGREGATIONS", "aggregate", "group_advantages", "grpo_loss",
           "k3", "token_terms", "GRPO", "RLStep"]
