"""RL variants by name: what one run of an ablation is (one of TLT's, a long-tail remedy's, or
a researcher's own), in one registry, so that a new variant is one class in one file.

An ablation names its runs (``run_ablation(variants=[...])``, the RL notebooks' ``variants``)
and asks each variant two things: whether its rollouts need the pre-RL EAGLE head
(``needs_head``: ``rl_setup`` loads it only then) and how one run of it is built
(``build``: a trainer the lockstep steps). Everything after that (the history and evaluation
tables, the figures, the checkpoint folders, the settings a resumed ablation must share)
reads a run by its name alone, so a plugin's variant is handled like a built-in.

The built-ins, registered here: TLT's ``baseline``, ``static_sd``, ``adaptive_drafter``, ``tlt``
and ``tlt_suffix`` (:class:`TLTVariant`: TLT's switches and drafter), and the long-tail
remedies ``overprovision``, ``april``, ``partial``, ``async`` and ``tail_batching``
(:class:`RemedyVariant`: ``RemedyConfig``'s fields, run by ``RemedyTrainer``), and Seer's
``seer_schedule`` and ``seer_divided`` (their dispatch in ``rl/remedies/seer_*.py``, which
import no variant, so the registry is filled by importing this module alone). A composable
variant (every remedy, a plugin's remedy too) also runs beside TLT as ``tlt+<name>``: its own
trainer, with TLT's SD, spot-trained drafter and adaptive engine in its rollouts.

A plugin (docs/extending.md, "An RL variant")::

    from workbench.rl.variants import RemedyVariant, rl_variant

    @rl_variant("my_remedy")
    class MyRemedy(RemedyVariant):
        def settings(self, grpo):            # RemedyConfig's fields it switches on
            return {"extra_groups": 1}

        def order(self, live):               # the order the workers take the requests in
            return sorted(range(len(live)), key=lambda i: len(live[i][0].prompt_ids))
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..checks import check_choice, check_list
from ..registry import PluginError, Registry
from .config import GRPOConfig
from .remedies import RemedyConfig, RemedyTrainer
from .remedies.seer_divided import DividedDispatch
from .remedies.seer_schedule import SeerDispatch, SeerTrainer
from .tlt import TLTConfig, TLTTrainer
from .tlt_suffix import SuffixTLTTrainer

__all__ = ["RLVariant", "TLTVariant", "RemedyVariant", "VariantRun", "VARIANTS", "rl_variant",
           "variant_names", "get_variant", "check_variant", "check_variants", "speculates",
           "tlt_config", "remedy_config"]

COMPOSER = "tlt"  # ``tlt+<name>``: the variant whose rollouts a composable variant takes on


@dataclass(frozen=True)
class VariantRun:
    """What one run of an ablation is built from (``build``'s argument).

    Args:
        seed: the run's seed (already in ``grpo``).
        policy: the run's own copy of the policy (it trains it).
        tokenizer, problems, reward: the RL task.
        grpo: the run's ``GRPOConfig`` (its ``seed`` is ``seed``).
        drafter_head: the pre-RL EAGLE head (None when no variant of the ablation
            needs it: ``needs_head``); a run that drafts with it copies it.
        backend: ``"local"`` (a local backend of the run's own) or the backend object every
            run of the ablation shares.
        tlt_kw: TLT's arguments (``TLTConfig.updated`` keywords: ``spec_k``, ``threshold``,
            ...).
        checkpoint_dir: the run's checkpoint folder (None: none); a trainer built on a
            folder that holds a checkpoint resumes from it.
        report_to, run_dir: where the run's per-step scalars go (``RLLoop``'s: ``"none"`` or
            ``"tensorboard"``, in ``run_dir/tensorboard``).
    """

    seed: int
    policy: Any
    tokenizer: Any
    problems: Sequence
    reward: Callable
    grpo: GRPOConfig
    drafter_head: Any = None
    backend: Any = "local"
    tlt_kw: dict = field(default_factory=dict)
    checkpoint_dir: str | os.PathLike | None = None
    report_to: str = "none"
    run_dir: str | os.PathLike | None = None

    @property
    def loop(self) -> dict:
        """The keywords of the trainer's loop shell (``rl.loop.RLLoop``)."""
        return {"checkpoint_dir": self.checkpoint_dir, "report_to": self.report_to,
                "run_dir": self.run_dir}


class RLVariant:
    """The protocol of an RL variant: subclass it (or :class:`TLTVariant` or
    :class:`RemedyVariant`, which implement ``build``) and register the class with
    :func:`rl_variant`. The ablation makes one instance per run.

    Hooks:
        build(run, tlt=None) -> trainer: **required**. One run of the variant from ``run``
            (a :class:`VariantRun`); ``tlt`` is a ``TLTConfig`` when the variant runs beside
            TLT (``tlt+<name>``, composable variants only), else None. The trainer is what
            the ablation steps and saves: an ``rl.loop.RLLoop`` (as ``TLTTrainer`` and
            ``RemedyTrainer`` are), built with ``**run.loop``, so that it resumes from
            ``run.checkpoint_dir`` and logs as ``run.report_to`` says; the ablation reads
            it through ``step()``, ``rl_step``, ``record``, ``model``, ``start_workers``,
            ``policy_changed``, ``restore_timelines`` and ``save_checkpoint(folder)``.
        speculative, needs_head(): whether its rollouts use SD, and the pre-RL EAGLE head
            (``run.drafter_head``, loaded only then). Defaults: False, ``speculative``.
        composable: whether it may run beside TLT as ``tlt+<name>`` (``build`` then gets
            ``tlt``). Default False.
        settings(grpo) -> dict | None: the ``RemedyConfig`` fields this variant stands for
            (:func:`remedy_config`), None when it is not one. Default None.
    """

    build: Callable[..., Any]  # required: declared here, defined by a variant
    speculative: bool = False
    composable: bool = False

    def settings(self, grpo: GRPOConfig) -> dict | None:
        return None

    def needs_head(self) -> bool:
        return self.speculative


class TLTVariant(RLVariant):
    """A variant that ``trainer_cls`` (a ``TLTTrainer``) runs: GRPO with TLT's switches
    (``TLTConfig``'s ``speculative``, ``adaptive_drafter``, ``adaptive_engine``, ``drafter``)."""

    adaptive_drafter: bool = False
    adaptive_engine: bool = False
    drafter, trainer_cls = "eagle", TLTTrainer  # TLTConfig.drafter; the trainer built

    def needs_head(self) -> bool:
        return self.speculative and self.drafter == "eagle"

    def settings(self, grpo: GRPOConfig) -> dict | None:
        """Plain GRPO is also a remedy config with every remedy off; a speculative one is
        not."""
        return None if self.speculative else {}

    def config(self, grpo: GRPOConfig | None = None, **tlt_kw) -> TLTConfig:
        """Its ``TLTConfig`` on ``grpo`` (``tlt_kw``: the other fields)."""
        return TLTConfig(grpo=grpo or GRPOConfig(), speculative=self.speculative,
                         adaptive_drafter=self.adaptive_drafter, drafter=self.drafter,
                         adaptive_engine=self.adaptive_engine).updated(**tlt_kw)

    def build(self, run: VariantRun, tlt: TLTConfig | None = None) -> TLTTrainer:
        cfg = self.config(run.grpo, **run.tlt_kw)
        return self.trainer_cls(run.policy, run.tokenizer, run.problems, run.reward, cfg,
                                drafter_head=run.drafter_head if cfg.speculative else None,
                                backend=run.backend, **run.loop)


class RemedyVariant(RLVariant):
    """A variant that ``RemedyTrainer`` runs: GRPO with remedies switched on by
    :meth:`settings`, its requests in the order :meth:`order` gives. Composable: beside TLT
    (``tlt+<name>``) its rollouts run with TLT's SD, drafter and engine."""

    composable = True

    def settings(self, grpo: GRPOConfig) -> dict | None:
        """The ``RemedyConfig`` fields it switches on for the run ``grpo`` (P, length cap);
        default: none (plain GRPO through the remedies' sampler)."""
        return {}

    def order(self, live: list) -> Sequence[int] | None:
        """The order the workers take one rollout's requests in: a permutation of
        ``range(len(live))``, where ``live[i]`` is the ``(Group, Response)`` of request ``i``
        (``rl.remedies.responses``: the group's prompt, its other responses, the response's
        tokens so far); None: as drawn (carried groups first, then fresh prompts). The engine
        deals the requests to the workers round-robin in this order and each worker admits
        its shard in it (``Sampler``)."""
        return None

    def config(self, grpo: GRPOConfig | None = None, **kw) -> RemedyConfig:
        """Its ``RemedyConfig`` on ``grpo``; ``kw`` overrides any field."""
        grpo = grpo or GRPOConfig()
        return RemedyConfig(grpo=grpo, **{**self.settings(grpo), **kw})

    def build(self, run: VariantRun, tlt: TLTConfig | None = None) -> RemedyTrainer:
        custom = type(self).order is not RemedyVariant.order
        return RemedyTrainer(run.policy, run.tokenizer, run.problems, run.reward,
                             self.config(run.grpo), backend=run.backend, tlt=tlt,
                             drafter_head=run.drafter_head, order=self.order if custom else None,
                             **run.loop)


def _check(name: str, plugin) -> None:
    """A variant is a class deriving from :class:`RLVariant` (whose defaults stand in for the
    hooks it leaves out), with boolean switches, under a name without ``+`` (which composes
    names: ``tlt+<name>``)."""
    if "+" in name:
        raise PluginError(f"RL variant name {name!r}: '+' composes names (tlt+<name>); "
                          "accepted: a name without '+'")
    if not (isinstance(plugin, type) and issubclass(plugin, RLVariant)):
        raise PluginError(f"RL variant {name!r} ({plugin!r}) is no subclass of "
                          "workbench.rl.variants.RLVariant; accepted: a class deriving from "
                          "RLVariant, TLTVariant or RemedyVariant")
    for switch in ("speculative", "composable", "adaptive_drafter", "adaptive_engine"):
        value = getattr(plugin, switch, False)
        if not isinstance(value, bool):
            raise PluginError(f"RL variant {name!r}: {switch}={value!r}; accepted: True or False")


VARIANTS: Registry[type[RLVariant]] = Registry(
    "RL variant", "workbench.variants", required=("build",),
    optional=("speculative", "composable", "settings", "config", "order", "adaptive_drafter",
              "adaptive_engine", "needs_head", "drafter", "trainer_cls"), check=_check)
"""The registry of RL variants: the built-in ones and plugins' (entry-point group
`workbench.variants`)."""


def rl_variant(name: str, *, builtin: bool = False):
    """Decorator: register an :class:`RLVariant` subclass as variant ``name`` (checked at
    registration: a missing ``build``, a misspelled hook or a taken name is refused, naming
    it)."""
    return VARIANTS.register(name, builtin=builtin)


def variant_names() -> list[str]:
    """Every name an ablation accepts: the registered variants (built-ins first), then
    ``tlt+<name>`` for each composable one."""
    names = VARIANTS.names()
    return names + [f"{COMPOSER}+{n}" for n in names if VARIANTS.get(n).composable]


def check_variant(name, what: str = "variant") -> str:
    """``name`` when an ablation accepts it (:func:`variant_names`); else ``ValueError``
    naming ``what``, the value and every accepted name."""
    return check_choice(what, name, variant_names())


def get_variant(name: str) -> RLVariant:
    """Variant ``name`` (checked: :func:`check_variant`), a new instance; ``tlt+<name>``: the
    composable variant with TLT's rollouts inside."""
    check_variant(name)
    if "+" in name:
        return _Composed(VARIANTS.get(name.split("+", 1)[1])())
    return VARIANTS.get(name)()


def speculates(names) -> bool:
    """Whether any variant of ``names`` needs the pre-RL EAGLE head (``needs_head``)."""
    return any(get_variant(n).needs_head() for n in names)


def tlt_config(name: str, grpo: GRPOConfig | None = None, **kw) -> TLTConfig:
    """The ``TLTConfig`` of RL variant ``name``, one that ``TLTTrainer`` runs (a
    :class:`TLTVariant`: ``baseline``, ``static_sd``, ``adaptive_drafter``, ``tlt``, or a
    plugin's): its switches on ``grpo``, ``kw`` the other fields. Any other name is refused,
    listing the TLT variants."""
    tlt_names = [n for n in VARIANTS.names() if issubclass(VARIANTS.get(n), TLTVariant)]
    return VARIANTS.get(check_choice("TLT variant", name, tlt_names))().config(grpo, **kw)


def remedy_config(name: str, grpo: GRPOConfig | None = None, **kw) -> RemedyConfig:
    """The ``RemedyConfig`` of RL variant ``name``, one whose ``settings`` are remedy fields
    (``baseline``, every remedy, a plugin's remedy), on ``grpo``: over-provisioning by half
    of ``P`` (at least 1 group), aborting or carrying (``april``) the rest; partial rollouts
    of a quarter of the length cap per step; one-step async; tail batching
    (over-provisioning as ``overprovision``, the unfinished deferred). ``kw`` overrides any
    of it. Any other name is refused, listing the variants that have remedy settings."""
    grpo = grpo or GRPOConfig()
    ours = {n: VARIANTS.get(n)().settings(grpo) for n in VARIANTS.names()}
    name = check_choice("remedy", name, [n for n, on in ours.items() if on is not None])
    return RemedyConfig(grpo=grpo, **{**ours[name], **kw})


class _Composed(RLVariant):
    """``tlt+<name>``: a composable variant whose rollouts run as TLT's (its ``tlt_kw``)."""

    speculative = True

    def __init__(self, inner: RLVariant):
        self.inner = inner

    def build(self, run: VariantRun, tlt: TLTConfig | None = None):
        tlt = VARIANTS.get(COMPOSER)().config(run.grpo, **run.tlt_kw)
        return self.inner.build(run, tlt)


# ---- the built-ins ------------------------------------------------------------------------
@rl_variant("baseline", builtin=True)
class Baseline(TLTVariant):
    """GRPO, every decode step plain."""


@rl_variant("static_sd", builtin=True)
class StaticSD(TLTVariant):
    """SD with the pre-RL drafter, never updated, a fixed chain of ``spec_k`` drafts."""

    speculative = True


@rl_variant("adaptive_drafter", builtin=True)
class AdaptiveDrafter(TLTVariant):
    """Static SD plus the spot trainer, which trains the drafter in idle windows."""

    speculative = adaptive_drafter = True


@rl_variant("tlt", builtin=True)
class TLT(TLTVariant):
    """Plus the adaptive engine: a bandit per batch-size bucket picks plain or an SD arm."""

    speculative = adaptive_drafter = adaptive_engine = True


@rl_variant("tlt_suffix", builtin=True)
class TLTSuffix(TLTVariant):
    """TLT's engine drafting with the suffix drafter over the rollout history, not the EAGLE
    head; no spot trainer: the drafter is model-free, it learns by remembering (tlt_suffix.py)."""
    speculative = adaptive_engine = True
    drafter, trainer_cls = "suffix", SuffixTLTTrainer


def _extra(grpo: GRPOConfig) -> int:
    """Over-provisioning's extra groups: half of ``P``, at least 1."""
    return max(1, grpo.prompts_per_step // 2)


@rl_variant("overprovision", builtin=True)
class Overprovision(RemedyVariant):
    """Half of P groups more; the rollout ends when P finished, the rest aborted."""

    def settings(self, grpo):
        return {"extra_groups": _extra(grpo), "leftover": "abort"}


@rl_variant("april", builtin=True)
class April(RemedyVariant):
    """As ``overprovision``, the unfinished groups carried into the next step (APRIL)."""

    def settings(self, grpo):
        return {"extra_groups": _extra(grpo), "leftover": "carry"}


@rl_variant("partial", builtin=True)
class Partial(RemedyVariant):
    """A response grows by at most a quarter of the length cap per step (Kimi k1.5)."""

    def settings(self, grpo):
        return {"segment_tokens": max(1, grpo.rollout.max_new_tokens // 4), "leftover": "carry"}


@rl_variant("async", builtin=True)
class Async(RemedyVariant):
    """Step t+1's rollout beside step t's update (AReaL, veRL's one-step off-policy)."""

    def settings(self, grpo):
        return {"one_step_async": True}


@rl_variant("tail_batching", builtin=True)
class TailBatching(RemedyVariant):
    """As ``overprovision``, the unfinished prompts deferred to a long round (RollPacker)."""

    def settings(self, grpo):
        return {"extra_groups": _extra(grpo), "leftover": "defer"}


@rl_variant("seer_schedule", builtin=True)
class SeerSchedule(RemedyVariant):
    """GRPO whose rollouts start their requests longest predicted first, across workers
    (Seer's context-aware scheduling); tokens as drawn, so nothing but time changes."""

    dispatch_cls = SeerDispatch

    def build(self, run: VariantRun, tlt=None) -> SeerTrainer:
        backend = run.backend
        if not isinstance(backend, str) and not backend.dispatches:
            raise ValueError(f"{type(self).__name__}: the {backend.name!r} backend moves no "
                             "work between its workers; accepted: the local or Ray backend")
        if tlt is not None and not isinstance(backend, str) and backend.clock != "sim":
            raise ValueError(f"{type(self).__name__} beside TLT: the {backend.name!r} backend "
                             "runs no tail jobs (the drafter's training) beside a dispatch; "
                             "accepted: the local backend")
        return SeerTrainer(run.policy, run.tokenizer, run.problems, run.reward,
                           self.config(run.grpo), backend=backend, tlt=tlt,
                           drafter_head=run.drafter_head, dispatch_cls=self.dispatch_cls,
                           **run.loop)


@rl_variant("seer_divided", builtin=True)
class SeerDivided(SeerSchedule):
    """GRPO whose rollouts divide the requests over the workers as they free (queued ones
    freely, running ones re-prefilled), longest predicted first; tokens unchanged."""

    dispatch_cls = DividedDispatch


def check_variants(variants) -> list[str]:
    """``variants`` as a list of registered RL variants' names, each once; ``ValueError``
    naming the first bad one and every accepted name."""
    return check_list("variants", variants, lambda name, v: check_variant(v, name),
                      f"variants of {variant_names()}")
