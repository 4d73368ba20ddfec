"""Remedies for the long tail of RL rollouts, as parts of the RL step: over-provisioning with
early stop (APRIL), partial rollouts (Kimi k1.5), one-step async RL (AReaL, veRL), and the
decoupled PPO correction of the stale tokens they train on."""
from .config import RemedyConfig
from .offpolicy import Behaviour, staleness_metrics
from .sampler import Sampler
from .trainer import RemedyTrainer

__all__ = ["RemedyConfig", "RemedyTrainer", "Sampler", "Behaviour",
           "staleness_metrics"]
