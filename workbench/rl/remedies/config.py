"""The arguments of an RL run with long-tail remedies: the GRPO run it changes, and each
remedy's own switch.

``RemedyConfig`` holds a :class:`~workbench.rl.config.GRPOConfig` (as ``TLTConfig`` does)
rather than copying its fields; ``RemedyConfig.flat(extra_groups=4, prompts_per_step=8,
max_new_tokens=64)`` routes each keyword to the config that declares it. Every remedy is off
by default, so the default config is plain GRPO. ``rl.variants.remedy_config(name)`` is the
config of an RL variant of the ablation (the remedies, the baseline, a plugin's).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...checks import check_bool, check_choice, check_int, check_real
from ...nested_config import NestedConfig
from ..config import GRPOConfig

__all__ = ["RemedyConfig", "LEFTOVERS"]

LEFTOVERS = ("abort", "carry", "defer")


@dataclass
class RemedyConfig(NestedConfig):
    """Arguments of :class:`~workbench.rl.remedies.RemedyTrainer`; checked when built.

    Args:
        grpo: the RL run (P, G, length cap, learning rate, workers, ...).
        extra_groups: over-provisioning (APRIL): groups sampled beyond the ``P`` a step
            trains on; the rollout ends when ``P`` groups have finished (all ``G`` samples
            done). 0: off.
        leftover: what becomes of the groups unfinished when a step's rollout ends:
            ``"abort"`` (dropped, their tokens wasted), ``"carry"`` (their partial
            responses continue in the next step, under the next policy) or ``"defer"``
            (tail batching, RollPacker: dropped, and their prompts, which ran long, sampled
            afresh in a long round of their own once ``P`` of them wait).
        segment_tokens: partial rollouts (Kimi k1.5): tokens a response may grow by in one
            step; a response cut there continues in the next step (needs ``leftover=
            "carry"``). None: off (a response runs to EOS or ``max_new_tokens`` in the step
            it starts).
        one_step_async: the rollout of step ``t + 1`` runs with the policy of step ``t``,
            beside step ``t``'s update (AReaL, veRL's one-step off-policy mode): step ``t``
            trains on data one policy version old (step 0 on its own, on-policy data).
        is_cap: the truncation of the behaviour importance weight ``pi_prox / pi_behav`` of
            tokens an older policy sampled (decoupled PPO with truncated IS); None: no
            truncation.
    """

    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    extra_groups: int = 0
    leftover: str = "abort"
    segment_tokens: int | None = None
    one_step_async: bool = False
    is_cap: float | None = 2.0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field, its value and what is accepted."""
        if not isinstance(self.grpo, GRPOConfig):
            raise ValueError(f"RemedyConfig.grpo must be a GRPOConfig, got "
                             f"{type(self.grpo).__name__} (RemedyConfig.flat takes flat "
                             "parameters)")
        check_int("RemedyConfig.extra_groups", self.extra_groups, 0)
        check_choice("RemedyConfig.leftover", self.leftover, LEFTOVERS)
        check_int("RemedyConfig.segment_tokens", self.segment_tokens, 1, optional=True)
        if self.segment_tokens is not None and self.leftover != "carry":
            raise ValueError(f"RemedyConfig.segment_tokens={self.segment_tokens} cuts responses "
                             f"to continue them next step, but leftover={self.leftover!r}; "
                             "accepted: leftover='carry' with segment_tokens")
        check_bool("RemedyConfig.one_step_async", self.one_step_async)
        if self.grpo.request_steps:
            raise ValueError("RemedyConfig.grpo.request_steps=True: the remedies' sampler does "
                             "not record Timeline.request_steps (its timelines are cut where "
                             "the step ends, and the table's rows are not cut with them); "
                             "accepted: request_steps=False with a remedy")
        check_real("RemedyConfig.is_cap", self.is_cap, 1.0, optional=True)
        if self.off_policy and self.grpo.rollout.top_p != 1:
            raise ValueError(f"top_p={self.grpo.rollout.top_p} with off-policy remedies: the "
                             "behaviour log-probs are the sampler's (within the nucleus), the "
                             "loss's are the whole distribution's; accepted: top_p=1")

    @property
    def carries(self) -> bool:
        """Whether responses outlive their step (their tokens may be trained off-policy)."""
        return self.leftover == "carry"

    @property
    def off_policy(self) -> bool:
        """Whether any token may be trained by a newer policy than the one that sampled it
        (the behaviour log-probs are then recorded as tokens are sampled)."""
        return self.carries or self.one_step_async
