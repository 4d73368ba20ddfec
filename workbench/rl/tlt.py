"""The TLT trainer: GRPO whose rollouts use SD, an adaptive drafter and an adaptive engine.

Each part has a switch, so one loop runs the whole ablation (TLT's variants, registered in
``rl.variants`` with those of the long-tail remedies and any plugin's):

- ``baseline``: GRPO, every decode step plain;
- ``static_sd``: SD with the drafter trained before RL, never updated, a fixed chain of
  ``spec_k`` drafts at every step (``grpo.rollout.spec_k``: the rollout's one draft depth);
- ``adaptive_drafter``: the same, plus the spot trainer, which trains the drafter in each
  step's idle window and serves the new version from the next step;
- ``tlt``: plus the adaptive engine: a bandit per batch-size bucket picks plain decoding or
  an SD strategy from the tokens per second each measured on this machine, so TLT falls back
  to plain decoding by itself where SD does not pay.

SD is lossless, so every variant samples from the same policy; with coupled sampling the
tokens (and hence the updates) are the same in float64, and a float32 run reports the first
step where a verify pass rounded differently (``tokens_digest`` per step).
"""
from __future__ import annotations

import copy
import hashlib
import os
from dataclasses import dataclass, field

import pandas as pd

from ..adapt import SpotConfig, SpotTrainer
from ..checks import check_bool, check_fraction, check_int
from ..nested_config import NestedConfig
from ..rollout import StaticSchedule
from ..speculative.bandit import DEFAULT_ARMS, AdaptiveSchedule
from ..speculative.drafter_spec import DrafterSpec
from ..speculative.drafters import EagleDrafter, SlowedDrafter
from ..speculative.measure import acceptance_length
from ..tasks import exact_match_reward
from .grpo import GRPO, GRPOConfig
from .loop import RLLoop

__all__ = ["TLTConfig", "TLTTrainer"]

STATE_FILE = "tlt_state.pt"


@dataclass
class TLTConfig(NestedConfig):
    """Arguments of the TLT trainer; every field is checked when the config is built.

    A :class:`~workbench.nested_config.NestedConfig`: ``TLTConfig.flat(spec_k=3,
    prompts_per_step=8, threshold=16)`` routes each keyword to the config that declares it
    (``spec_k`` is the rollout's, ``grpo.rollout.spec_k``: one draft depth for the static
    chain and the rollout). A keyword that both GRPO and the spot trainer declare (``lr``,
    ``seed``) goes to both; pass ``grpo=`` or ``spot=`` to set one.

    Args:
        grpo: the RL configuration (P, G, length cap, lr, workers, ...).
        speculative: decode with SD (False: the baseline; the other switches are ignored).
        adaptive_drafter: train the drafter on idle workers (the spot trainer).
        adaptive_engine: BEG-MAB picks plain decoding or one of ``arms`` per batch-size
            bucket; False: a fixed chain of ``grpo.rollout.spec_k`` drafts at every step.
        threshold: ``None``: the adaptive engine learns per bucket whether to speculate; an
            integer: it never speculates above that many live rows.
        arms: the bandit's SD strategies (``workbench.speculative.bandit`` syntax); plain
            decoding is always an arm besides them.
        epsilon, window, explore_budget: the bandit's exploration rate, sliding window and
            the share of a worker's decode time that exploring may lose.
        explore_run, settle: an explored arm's consecutive pulls in its bucket, and the first
            of them that teach nothing (the step after an arm switch is slower:
            ``speculative.bandit``, "run"); ``explore_run=1, settle=0`` explores one step at
            a time.
        spot: the spot trainer's configuration.
        drafter_delay_s: seconds added to every drafted depth (``SlowedDrafter``): a hostile
            machine where SD cannot pay, for tests and benchmarks; 0 for real runs.
        drafter: what drafts: ``"eagle"``, the pre-RL EAGLE head (``drafter_head``), which
            the spot trainer trains; or a registered drafter, a plugin's too, with its
            settings (``"NAME"`` or ``"NAME:key=value,..."``: ``speculative.drafter_spec``),
            built on the policy. The spot trainer trains EAGLE heads only, so a registered
            drafter runs in variants without ``adaptive_drafter``; what it learns by itself
            (its ``module``) is in the run's checkpoints (``RLLoop.state_dict``), and its
            name and settings, in this field, are in an ablation's settings.
    """

    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    speculative: bool = True
    adaptive_drafter: bool = True
    adaptive_engine: bool = True
    threshold: int | None = None
    arms: tuple = DEFAULT_ARMS
    epsilon: float = 0.1
    window: int = 300
    explore_budget: float = 0.02
    explore_run: int = 6
    settle: int = 3
    spot: SpotConfig = field(default_factory=SpotConfig)
    drafter_delay_s: float = 0.0
    drafter: str = "eagle"

    def __post_init__(self):
        for name, cls in (("grpo", GRPOConfig), ("spot", SpotConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"TLTConfig.{name} must be a {cls.__name__}, got "
                                 f"{type(getattr(self, name)).__name__} (TLTConfig.flat takes "
                                 "flat parameters)")
        for name in ("speculative", "adaptive_drafter", "adaptive_engine"):
            check_bool(f"TLTConfig.{name}", getattr(self, name))
        check_int("TLTConfig.threshold", self.threshold, 1, optional="learned per bucket")
        check_fraction("TLTConfig.epsilon", self.epsilon)
        check_fraction("TLTConfig.explore_budget", self.explore_budget)
        check_int("TLTConfig.window", self.window, 1)
        check_int("TLTConfig.explore_run", self.explore_run, 1)
        check_int(f"TLTConfig.settle (with explore_run={self.explore_run})", self.settle, 0,
                  self.explore_run - 1)
        SlowedDrafter.check_delay(self.drafter_delay_s)
        if self.drafter != "eagle":
            DrafterSpec.parse(self.drafter)  # a registered name, settings well formed
        if self.speculative:
            self.schedule()  # the arms parse as strategies

    def parts(self, model, drafter_head, drafter_dir=None, tokenizer=None) -> tuple:
        """``(drafter, spot trainer, schedule)`` of this variant on ``model``: the serving
        drafter (EAGLE on a copy of ``drafter_head``, or the registered ``drafter`` built on
        ``model`` and ``tokenizer``; slowed by ``drafter_delay_s``), the spot trainer that
        trains it in idle windows (publishing to ``drafter_dir``), and the step schedule; each
        None where the variant has none. Any trainer that runs TLT's rollouts builds them here
        (``TLTTrainer``, and ``RemedyTrainer`` with a remedy)."""
        self.check_head(drafter_head)
        if self.speculative and self.adaptive_drafter and self.drafter != "eagle":
            raise ValueError(f"drafter {self.drafter!r} with adaptive_drafter: the spot trainer "
                             "trains EAGLE heads only; accepted: drafter 'eagle', or variants "
                             "without the adaptive drafter (baseline, static_sd)")
        drafter = (None if not self.speculative
                   else EagleDrafter(copy.deepcopy(drafter_head).eval(), model)
                   if self.drafter == "eagle"
                   else DrafterSpec.parse(self.drafter).build(model, tokenizer))
        if drafter is not None and self.drafter_delay_s:
            drafter = SlowedDrafter(drafter, self.drafter_delay_s)
        spot = (SpotTrainer(model, drafter, self.spot, drafter_dir)
                if self.speculative and self.adaptive_drafter else None)
        return drafter, spot, self.schedule()

    def check_head(self, drafter_head) -> None:
        """Raise ``ValueError`` when this variant speculates with EAGLE and ``drafter_head``
        is None."""
        if self.speculative and self.drafter == "eagle" and drafter_head is None:
            raise ValueError("a speculative variant needs drafter_head (the pre-RL EAGLE head, "
                             "e.g. EagleHead.from_pretrained(DEFAULT_EAGLE, policy))")

    def schedule(self):
        """The step schedule of this variant (None: plain decoding)."""
        if not self.speculative:
            return None
        if not self.adaptive_engine:
            return StaticSchedule(self.grpo.rollout.spec_k)
        return AdaptiveSchedule(arms=self.arms, threshold=self.threshold, epsilon=self.epsilon,
                                window=self.window, explore_budget=self.explore_budget,
                                seed=self.grpo.rollout.seed, explore_run=self.explore_run,
                                settle=self.settle)


def tokens_digest(result) -> str:
    """A short hash of every response's tokens, in request order (divergence checks)."""
    h = hashlib.sha1()
    for r in result.requests:
        h.update(repr((r.uid, r.tokens)).encode())
    return h.hexdigest()[:16]


def first_divergence(a: pd.DataFrame, b: pd.DataFrame) -> int:
    """The first RL step whose tokens differ between two histories (``tokens_digest``);
    -1 when every common step matches."""
    for (_, x), (_, y) in zip(a.iterrows(), b.iterrows()):
        if x["tokens_digest"] != y["tokens_digest"]:
            return int(x["step"])
    return -1


class TLTTrainer(RLLoop):
    """GRPO with TLT's rollout speed-ups switched on or off by ``config``, in the RL loop
    shell (:class:`~workbench.rl.loop.RLLoop`: checkpoint, history, timelines, log).

    Args:
        model, tokenizer, problems, reward: as :class:`~workbench.rl.grpo.GRPO`.
        config: a :class:`TLTConfig`.
        drafter_head: the pre-RL EAGLE head (copied; static and adaptive variants start
            from the same one). Required when ``config.speculative``.
        checkpoint_dir: atomic checkpoint of the whole loop (policy, optimizer, drafter and
            its trainer, bandit, history); a run resumes from it.
        drafter_dir: where the spot trainer publishes each drafter version (atomically).
        engine: the rollout engine (default: a new one on ``model`` and ``backend``); its
            backend also runs the spot trainer's idle-window jobs.
        backend, ray_address: where the workers run, without ``engine`` (``"local"``,
            ``"ray"`` or a backend object; as :class:`~workbench.rl.grpo.GRPO`'s); the drafter
            travels with each rollout, so Ray actors serve the published one.
        report_to, run_dir: the per-step scalars' log and the run's folder (``RLLoop``'s).
    """

    STATE_FILE = STATE_FILE

    def __init__(self, model, tokenizer, problems, reward=exact_match_reward,
                 config: TLTConfig | None = None, drafter_head=None,
                 checkpoint_dir: str | os.PathLike | None = None,
                 drafter_dir: str | os.PathLike | None = None, engine=None, backend="local",
                 ray_address: str | None = None, report_to: str = "none",
                 run_dir: str | os.PathLike | None = None):
        self.config = config if config is not None else TLTConfig()
        c = self.config
        c.check_head(drafter_head)  # before the backend starts
        grpo = GRPO(model, tokenizer, problems, reward, c.grpo, engine=engine,
                    backend=backend, ray_address=ray_address)
        self.drafter, self.spot, self.schedule = c.parts(model, drafter_head, drafter_dir,
                                                         tokenizer)
        super().__init__(grpo, checkpoint_dir, report_to, run_dir)

    def _step(self) -> dict:
        """One RL step; returns the step's metrics row."""
        spot = self.spot
        # 1) rollout (SD as configured); the drafter trains on every worker whose shard came
        #    back, each a copy of the published state, until the last shard comes back
        tail = spot.tail(self.grpo.config.rollout.workers) if spot is not None else None
        rl = self.grpo.rollout(self.schedule, self.drafter, harvest=spot is not None, tail=tail)
        extra = {"accept_len": acceptance_length(rl.result),
                 "tokens_digest": tokens_digest(rl.result)}
        # 2) the copies merge by local SGD and the merge is published: it serves from the
        #    next step's rollout
        if spot is not None:
            extra.update(spot.merge(rl.result, tail))
        self.timelines[rl.step] = rl.result.timeline
        # 3) the policy update
        return self.grpo.update(rl, extra)
