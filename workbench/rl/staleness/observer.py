"""Steps 2) and 3) of a staleness run: measure every drafter on an RL step, then let it learn.

One code path for both ways of running (:mod:`workbench.rl.staleness`): the one-process
:class:`~workbench.rl.staleness.run.StalenessRun` calls :meth:`StalenessObserver.observe` between
its rollout and its update, on the trajectory's own policy and backend; the observer process
of a two-core run (:mod:`workbench.rl.staleness.split`) calls it on an observation from the
spool, with its own copy of the policy (loaded in place with the weights that sampled the
step, so the drafters stay bound to it) and the rollout workers' clocks replayed
(:func:`~workbench.rl.staleness.spool.replay_backend`). Same inputs, same RNG seed per step:
the same row.

Nothing here changes the trajectory: the global RNG is seeded per step and put back after
(``train.isolated_rng``), the drafters train on copies of their own and hold the policy
frozen, and measuring decodes on an engine of its own.
"""
from __future__ import annotations

import time

import pandas as pd
import torch

from ...rollout import RolloutEngine
from ...train import isolated_rng
from ..acceptance import measure_tau
from .drafters import (AdaptiveDrafter, CeilingDrafter, FrozenDrafter, SiblingMemory,
                       SuffixMemory)

__all__ = ["StalenessObserver", "rng_seed"]

POSITION_COLUMNS = ["step", "drafter", "position", "verify_steps", "emitted"]


def rng_seed(config, step: int) -> int:
    """The global RNG's seed of steps 2)-3) of RL step ``step`` (and of the held-out
    evaluation after ``step`` steps) under a ``StalenessConfig``."""
    return (config.grpo.rollout.seed * 1_000_003 + step) % 2**63


class StalenessObserver:
    """The drafters of ``config.drafters`` on ``policy`` (all bound to it), the engine that
    measures them, and the tau-by-position table so far.

    Args:
        policy, tokenizer: the policy the drafters serve (measured against, trained on).
        drafter_head: the pre-RL EAGLE head; every drafter starts from a copy.
        config: a ``StalenessConfig`` (checked by its caller).
    """

    def __init__(self, policy, tokenizer, drafter_head, config):
        self.config = c = config
        self.measurer = RolloutEngine(policy, tokenizer)  # one worker, a backend of its own
        dtype = policy.get_output_embeddings().weight.dtype
        self.strict = c.divergence == "raise" or (c.divergence == "auto"
                                                  and dtype == torch.float64)
        G = c.grpo.rollout.samples_per_prompt
        build = {"frozen": lambda: FrozenDrafter(drafter_head, policy),
                 "adaptive": lambda: AdaptiveDrafter(drafter_head, policy, c.spot),
                 "ceiling": lambda: CeilingDrafter(drafter_head, policy, c.ceiling, G),
                 "sibling": SiblingMemory, "suffix": SuffixMemory}
        self.drafters = {name: build[name]() for name in c.drafters}
        self._positions: list[dict] = []

    def observe(self, rl, backend) -> dict:
        """Steps 2) and 3) of RL step ``rl`` (a ``GRPO.rollout(harvest=True)``, sampled by
        the policy as it is now; ``backend``: the one whose workers ran it, for the idle
        windows). Returns the step's part of the row:
        ``tau_<drafter>``, ``diverged_<drafter>``, what each drafter learned,
        ``measure_s``, ``learn_s`` and the timeline's ``idle_fraction`` and
        ``wasted_fraction`` with the drafters' training in it."""
        with isolated_rng(rng_seed(self.config, rl.step)):  # nothing here touches GRPO's RNG
            t0 = time.perf_counter()
            out = self._measure(rl)
            t1 = time.perf_counter()
            for drafter in self.drafters.values():
                out.update(drafter.learn(rl, backend))
            out.update(measure_s=t1 - t0, learn_s=time.perf_counter() - t1)
        timeline = rl.result.timeline  # the adaptive drafter's training fills idle windows
        out.update(idle_fraction=timeline.idle_fraction(),
                   wasted_fraction=timeline.wasted_fraction())
        return out

    def _measure(self, rl) -> dict:
        """``tau_<drafter>`` and ``diverged_<drafter>`` on the first ``measure_groups``
        groups of ``rl``; tau by position into :attr:`positions`."""
        c = self.config
        groups = c.measure_groups
        prompts = [p.prompt for p in rl.problems[:groups]]
        reference = rl.result.requests[:groups * c.grpo.rollout.samples_per_prompt]
        out = {}
        for name, drafter in self.drafters.items():
            tm = measure_tau(self.measurer, drafter.drafter, prompts, reference,
                             c.grpo.rollout, rl.step, c.grpo.rollout.spec_k, self.strict, name,
                             c.position_bucket)
            out[f"tau_{name}"], out[f"diverged_{name}"] = tm.tau, tm.diverged
            self._positions += [{"step": rl.step, "drafter": name, **r}
                                for r in tm.positions.to_dict("records")]
        return out

    @property
    def positions(self) -> pd.DataFrame:
        """tau against response position: ``step``, ``drafter``, ``position`` (bucket
        start), ``verify_steps``, ``emitted`` (tau of a bucket: emitted / verify_steps)."""
        return pd.DataFrame(self._positions, columns=POSITION_COLUMNS)

    def state_dict(self) -> dict:
        return {"drafters": {n: d.state_dict() for n, d in self.drafters.items()},
                "positions": list(self._positions)}

    def load_state_dict(self, state: dict) -> None:
        for name, drafter in self.drafters.items():
            drafter.load_state_dict(state["drafters"][name])
        self._positions = list(state["positions"])
