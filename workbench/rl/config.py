"""The arguments of a GRPO run: the rollout it samples with, the optimizer it updates with,
and what is GRPO's own (group size aside, which the rollout holds).

``GRPOConfig`` holds a :class:`~workbench.rollout.RolloutConfig` and a
:class:`~workbench.train.TrainConfig` rather than re-declaring their fields, so each field is
declared, defaulted and checked once. A notebook keeps flat parameters through
:meth:`GRPOConfig.flat`: ``GRPOConfig.flat(prompts_per_step=16, samples_per_prompt=8,
max_new_tokens=256, lr=2e-4, seed=0)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..checks import (check_bool, check_choice, check_fraction, check_int, check_non_negative,
                      check_positive)
from ..nested_config import NestedConfig
from ..rollout import RolloutConfig
from ..train import TrainConfig

__all__ = ["GRPOConfig", "LOSS_AGGREGATIONS"]

LOSS_AGGREGATIONS = ("token-mean", "sequence-mean")


def _default_rollout() -> RolloutConfig:
    return RolloutConfig(max_new_tokens=256, temperature=1.0, samples_per_prompt=8)


def _default_train() -> TrainConfig:
    """AdamW at a constant LR with no horizon (RL goes on as long as it is run), eval mode
    (dropout off: the update sees the numbers the rollout sampled from), no progress bar."""
    return TrainConfig(lr=5e-5, betas=(0.9, 0.99), train_mode=False, progress=False)


@dataclass
class GRPOConfig(NestedConfig):
    """Arguments of a GRPO run; every field is checked when the config is built.

    Args:
        rollout: how each step samples: ``samples_per_prompt`` is ``G``, the group size (at
            least 2, since the advantage compares a response with its group);
            ``temperature`` (> 0) also divides the logits of the loss's log-probabilities,
            as the sampler does; ``max_new_tokens``, ``workers`` (the sim clock charges the
            update as its time / N), ``max_batch_size``, ``spec_mode``; ``seed`` sets the
            sampling draws and the prompt order. The step's number (in every request's uid)
            and whether to harvest are arguments of each rollout call, not of the config
            (``GRPO.rollout(harvest=...)`` passes them).
        train: the policy's optimizer (AdamW, LR schedule, clipping, ``seed`` of its
            generator and of the minibatch order). Its ``checkpoint_dir`` stays None: the RL
            loop checkpoints the whole run (``RLLoop(grpo, checkpoint_dir=...)``).
        prompts_per_step: ``P``, prompts drawn per RL step.
        epochs: passes over the step's sequences.
        minibatches: optimizer steps per epoch (the step's sequences split evenly).
        clip_eps: the PPO clip range: ratios outside ``[1 - eps, 1 + eps]`` stop the gradient.
        loss_aggregation: ``"token-mean"`` (every response token weighs the same, as DAPO
            and TRL's default) or ``"sequence-mean"`` (each response's mean, then the mean
            over responses, as in the GRPO paper).
        kl_coef: ``beta`` of the k3 KL term to the reference policy; 0 turns it off (the
            KL to the starting policy is still measured every step).
        scale_rewards: divide each group's centred rewards by its standard deviation.
        micro_tokens: padded tokens per forward inside a minibatch (sequences of similar
            length go together; their losses sum into one backward).
        kl_sample: sequences per step on which the KL to the starting policy is measured
            when ``kl_coef`` is 0 (the measure needs the reference's forward; a sample keeps
            it cheap); with ``kl_coef`` > 0 every sequence has it anyway.
        request_steps: record each rollout's per-request, per-step table
            (``Timeline.request_steps``: a row per request per engine step, with its accepted
            length and the bandit's arm; ``rollout.request_steps``) in the step's timeline,
            hence in its saved folder and its Chrome trace. Off by default (it costs a tuple
            per live row per step). A recording choice only: the rollouts are the same either
            way, so it is left out of the config's ``repr`` and a checkpointed run resumes
            with it switched either way.
    """

    rollout: RolloutConfig = field(default_factory=_default_rollout)
    train: TrainConfig = field(default_factory=_default_train)
    prompts_per_step: int = 16
    epochs: int = 1
    minibatches: int = 1
    clip_eps: float = 0.2
    loss_aggregation: str = "token-mean"
    kl_coef: float = 0.0
    scale_rewards: bool = True
    micro_tokens: int = 8192
    kl_sample: int = 32
    request_steps: bool = field(default=False, repr=False)
    """Record ``Timeline.request_steps`` in every rollout of the run (see Args)."""

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field, its value and what is accepted
        (the held configs check their own fields when they are built)."""
        if not isinstance(self.rollout, RolloutConfig) or not isinstance(self.train,
                                                                         TrainConfig):
            raise ValueError(f"GRPOConfig.rollout must be a RolloutConfig and GRPOConfig.train "
                             f"a TrainConfig, got {type(self.rollout).__name__} and "
                             f"{type(self.train).__name__} (GRPOConfig.flat takes flat "
                             "parameters)")
        self._validate_parts()
        for name in ("prompts_per_step", "epochs", "minibatches", "micro_tokens", "kl_sample"):
            check_int(f"GRPOConfig.{name}", getattr(self, name), 1)
        if self.minibatches > self.sequences_per_step:
            raise ValueError(f"GRPOConfig.minibatches={self.minibatches} exceeds the "
                             f"{self.sequences_per_step} sequences of a step")
        check_choice("GRPOConfig.loss_aggregation", self.loss_aggregation, LOSS_AGGREGATIONS)
        check_fraction("GRPOConfig.clip_eps", self.clip_eps, low_open=True, high_open=True)
        check_non_negative("GRPOConfig.kl_coef", self.kl_coef)
        check_bool("GRPOConfig.scale_rewards", self.scale_rewards)
        check_bool("GRPOConfig.request_steps", self.request_steps)

    def _validate_parts(self) -> None:
        """What GRPO asks of its rollout and optimizer beyond their own checks."""
        check_int("GRPOConfig.rollout.samples_per_prompt (G: the advantage compares each "
                  "response with its group)", self.rollout.samples_per_prompt, 2)
        check_positive("GRPOConfig.rollout.temperature (GRPO samples)", self.rollout.temperature)
        if self.train.checkpoint_dir is not None:
            raise ValueError(f"GRPOConfig.train.checkpoint_dir must be None, got "
                             f"{str(self.train.checkpoint_dir)!r}: the RL loop checkpoints the "
                             "whole run into RLLoop(grpo, checkpoint_dir=...) or a trainer's "
                             "checkpoint_dir")

    @property
    def sequences_per_step(self) -> int:
        return self.prompts_per_step * self.rollout.samples_per_prompt
