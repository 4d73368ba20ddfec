"""Training on tokens an older policy sampled: the correction, and what it costs, measured.

The correction is the decoupled PPO objective (Hilton et al. 2022, as AReaL trains on stale
data) with the behaviour weight truncated (truncated IS, as veRL's TIS): for a token sampled
by the behaviour policy ``pi_behav`` (an older version), the clipped surrogate is taken
against the *proximal* policy ``pi_prox`` (the policy at the start of this update, whose
log-probs the trainer computes itself; ``pi_behav``'s are the rollout's own, as the sampler
drew the token), and multiplied by the detached weight
``min(pi_prox / pi_behav, is_cap)``. The trust region is then around the current policy,
however old the data, and the weight corrects the sampling distribution. A token the
current version sampled has weight exactly 1 (no forward's rounding decides it).

Glossary: a token's *staleness* is the current version minus the version that sampled it;
the *off-policy token share* of a step is the share of its trained response tokens with
staleness > 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Behaviour", "staleness_metrics"]


@dataclass
class Behaviour:
    """The behaviour side of a step's sequences, for :meth:`GRPO.update_data`.

    ``logp[i]`` ``[len(response i)]``: each token's log-prob under the policy that sampled
    it; ``versions[i]`` the version of that policy; ``current`` the version being updated;
    ``cap`` the truncation (None: none)."""

    logp: list[torch.Tensor]
    versions: list[list[int]]
    current: int
    cap: float | None

    def weights(self, prox_logp: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per sequence ``[len(response)]``: ``min(exp(prox - behav), cap)`` on stale tokens,
        1 on the current version's."""
        out = []
        for behav, versions, prox in zip(self.logp, self.versions, prox_logp):
            stale = torch.tensor(versions, device=prox.device) < self.current
            w = torch.exp(prox - behav.to(prox))
            if self.cap is not None:
                w = w.clamp(max=self.cap)
            out.append(torch.where(stale, w, torch.ones_like(w)).detach())
        return out


def staleness_metrics(versions: list[list[int]], current: int) -> dict:
    """``offpolicy_token_share`` (response tokens sampled by an older version, over all),
    ``max_staleness`` and ``mean_staleness`` (in versions, over tokens) of a step's
    sequences, trained by version ``current``."""
    ages = torch.tensor([current - v for seq in versions for v in seq], dtype=torch.float64)
    if not len(ages):
        return {"offpolicy_token_share": 0.0, "max_staleness": 0, "mean_staleness": 0.0}
    return {"offpolicy_token_share": float((ages > 0).double().mean()),
            "max_staleness": int(ages.max()), "mean_staleness": float(ages.mean())}
