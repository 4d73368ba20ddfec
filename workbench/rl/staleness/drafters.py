"""The drafters a staleness run measures, each with what it learns from an RL step.

Each is an object with ``drafter`` (what the measurement decodes with), ``learn(rl, backend)
-> dict`` (what it takes from RL step ``rl`` after its tau on that step was measured, so that
it serves from the next step, as TLT's drafter does; the dict joins the step's row) and
``state_dict`` / ``load_state_dict`` (the run's checkpoint).

- :class:`FrozenDrafter`: the pre-RL EAGLE head, never trained.
- :class:`AdaptiveDrafter`: TLT's: the spot trainer on every idle worker of the step's
  rollout, on the sim clock, from its buffer of the last steps' harvests
  (:class:`~workbench.adapt.spot.SpotTrainer`).
- :class:`CeilingDrafter`: what an unlimited idle budget would buy: a copy trained on each
  step's whole harvest until it converges, warm-started from its previous state.
- :class:`SiblingMemory`: the model-free
  :class:`~workbench.speculative.sibling.SiblingDrafter`: a row drafts from its group's other
  rows on the same worker, and remembers each step's responses for the steps after.
- :class:`SuffixMemory`: the model-free :class:`~workbench.speculative.suffix.SuffixDrafter`
  (DAS/SuffixDecoding): the same sources as the sibling drafter, pooled in a suffix trie per
  prompt, drafting the most frequent continuation.

Glossary:

held back    every ``holdout_every``-th prompt group of a step's harvest (groups 0,
             ``holdout_every``, ...), which the ceiling never trains on: its loss there says
             whether training still helps on prompts it has not seen, as the next step's are.
converged    the held-back loss, measured every ``check_every`` steps, has not fallen below
             ``(1 - min_improvement)`` times its best for ``patience`` measurements in a row;
             the head and its optimizer then go back to the best measurement's state. A step
             also stops at ``max_steps`` (the cap), keeping its best state likewise.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ...adapt import SpotConfig, SpotTrainer
from ...checks import check_fraction, check_int
from ...nested_config import NestedConfig
from ...speculative.drafters import EagleDrafter
from ...speculative.sibling import SiblingDrafter
from ...speculative.suffix import SuffixDrafter
from ...speculative.train import EagleTrainConfig, EagleTrainer, harvest_pairs

__all__ = ["CeilingConfig", "FrozenDrafter", "AdaptiveDrafter", "CeilingDrafter",
           "ResponseMemory", "SiblingMemory", "SuffixMemory"]


def _spot_eagle() -> EagleTrainConfig:
    return SpotConfig().eagle


@dataclass
class CeilingConfig(NestedConfig):
    """How the ceiling drafter trains (module docstring: *held back*, *converged*). Flat:
    ``CeilingConfig.flat(max_steps=200, lr=1e-4)``.

    Args:
        eagle: the head's training; by default the spot trainer's (constant LR 1e-4, batch
            16), so that the ceiling differs from the adaptive drafter in budget and data only.
        holdout_every: one prompt group in this many is held back (at least 2, and 2 groups a
            step).
        check_every: training steps between two held-back measurements.
        patience: measurements without improvement that end a step's training.
        min_improvement: the relative fall of the held-back loss that counts as improving.
        max_steps: the cap on one RL step's training steps.
    """

    eagle: EagleTrainConfig = field(default_factory=_spot_eagle)
    holdout_every: int = 8
    check_every: int = 8
    patience: int = 2
    min_improvement: float = 0.002
    max_steps: int = 400

    def __post_init__(self):
        check_int("CeilingConfig.holdout_every (1 would hold every group back)",
                  self.holdout_every, 2)
        for name in ("check_every", "patience", "max_steps"):
            check_int(f"CeilingConfig.{name}", getattr(self, name), 1)
        check_fraction("CeilingConfig.min_improvement", self.min_improvement, high_open=True)
        if not isinstance(self.eagle, EagleTrainConfig):
            raise ValueError(f"CeilingConfig.eagle must be an EagleTrainConfig, got "
                             f"{type(self.eagle).__name__} (CeilingConfig.flat takes flat "
                             "arguments such as lr=1e-4, batch_size=16)")


def _serving(head, policy) -> EagleDrafter:
    return EagleDrafter(copy.deepcopy(head).eval(), policy)


def _trainer_state(trainer) -> dict:
    """A trainer's state to go back to: weights, optimizer and generator copied; the history
    list copied shallowly (its rows are never changed in place)."""
    state = trainer.state_dict()
    return {k: list(v) if k == "history" else copy.deepcopy(v) for k, v in state.items()}


class FrozenDrafter:
    """The pre-RL EAGLE head ``head`` on ``policy``, never trained: the stale drafter."""

    def __init__(self, head, policy):
        self.drafter = _serving(head, policy)

    def learn(self, rl, backend) -> dict:
        """Nothing: a frozen drafter learns nothing from RL."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: it is the pre-RL head it was built with."""


class AdaptiveDrafter:
    """TLT's drafter: ``head`` trained by a :class:`~workbench.adapt.spot.SpotTrainer` with
    ``config`` in every idle window of each step's rollout (``backend``: the one that ran it,
    on its clock); the merged head serves from the next step."""

    def __init__(self, head, policy, config: SpotConfig):
        self.drafter = _serving(head, policy)
        self.spot = SpotTrainer(policy, self.drafter, config)

    def learn(self, rl, backend) -> dict:
        """Train in ``rl``'s idle windows; the spot trainer's figures, ``adaptive_*``."""
        out = self.spot.train_in_idle(rl.result, backend)
        return {"adaptive_" + key.removeprefix("drafter_"): value for key, value in out.items()}

    def state_dict(self) -> dict:
        return self.spot.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.spot.load_state_dict(state)


class CeilingDrafter:
    """A copy of ``head`` trained on each step's whole harvest until it converges (module
    docstring), with ``config``; ``group_size`` is G (rows per prompt group)."""

    def __init__(self, head, policy, config: CeilingConfig, group_size: int):
        self.config, self.group_size = config, check_int("group_size", group_size, 1)
        self.drafter = _serving(head, policy)
        self.head = copy.deepcopy(head).requires_grad_(True)
        self.eagle = EagleTrainer(policy, self.head, config.eagle)

    def split(self, pairs) -> tuple[list, list]:
        """``(train, held back)``: whole prompt groups, every ``holdout_every``-th held back."""
        every, g = self.config.holdout_every, self.group_size
        held = [p for i, p in enumerate(pairs) if (i // g) % every == 0]
        train = [p for i, p in enumerate(pairs) if (i // g) % every != 0]
        if not train:
            raise ValueError(f"the ceiling drafter holds back every {every}th prompt group; "
                             f"{len(pairs) // g} group(s) leave nothing to train on: at least "
                             "2 prompts per step")
        return train, held

    def learn(self, rl, backend) -> dict:
        """Train on ``rl``'s harvest until converged or capped, keep the best state and
        serve it. Returns ``ceiling_steps`` (taken), ``ceiling_kept_steps`` (up to the best
        measurement), ``ceiling_converged`` (False: stopped by the cap) and the held-back
        loss before and after (``ceiling_loss_start``, ``ceiling_loss``)."""
        c = self.config
        train, held = self.split(harvest_pairs(rl.result))
        self.eagle.set_pairs(train)
        start = best = self.eagle.evaluate(held)
        kept, kept_steps, steps, stale = _trainer_state(self.eagle.trainer), 0, 0, 0
        with self.eagle.training():
            while stale < c.patience and steps < c.max_steps:
                for _ in range(min(c.check_every, c.max_steps - steps)):
                    self.eagle.step()
                    steps += 1
                loss = self.eagle.evaluate(held)
                if loss < best * (1 - c.min_improvement):
                    best, kept, kept_steps, stale = loss, _trainer_state(self.eagle.trainer), \
                        steps, 0
                else:
                    stale += 1
        self.eagle.trainer.load_state_dict(kept)
        self.drafter.head.load_state_dict(
            {k: v.detach().clone() for k, v in self.head.state_dict().items()})
        return {"ceiling_steps": steps, "ceiling_kept_steps": kept_steps,
                "ceiling_converged": stale >= c.patience, "ceiling_loss_start": start,
                "ceiling_loss": best}

    def state_dict(self) -> dict:
        return {"trainer": self.eagle.trainer.state_dict(),
                "serving": self.drafter.head.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.eagle.trainer.load_state_dict(state["trainer"])
        self.drafter.head.load_state_dict(state["serving"])


class ResponseMemory:
    """A model-free drafter that drafts from its prompt's earlier responses (``drafter``: a
    ``SiblingDrafter`` or ``SuffixDrafter``, named ``name``), which it learns by remembering
    every response of each step (the latest ``max_per_prompt`` per prompt)."""

    def __init__(self, name: str, drafter):
        self.name, self.drafter = name, drafter

    def learn(self, rl, backend) -> dict:
        """Remember every response of ``rl``; ``<name>_prompts``: prompts in memory."""
        self.drafter.remember_result(rl.result)
        return {f"{self.name}_prompts": len(self.drafter.memory)}

    def state_dict(self) -> dict:
        return {"memory": [(key, list(responses))
                           for key, responses in self.drafter.memory.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.drafter.memory.clear()
        for key, responses in state["memory"]:
            for response in responses:
                self.drafter.remember(key, response)


class SiblingMemory(ResponseMemory):
    """The sibling drafter (``SiblingDrafter(**kw)``): it drafts from the row's siblings on
    its worker (the nearest n-gram occurrence) and from its prompt's earlier responses."""

    def __init__(self, **kw):
        super().__init__("sibling", SiblingDrafter(**kw))

    def load_state_dict(self, state: dict) -> None:
        self.drafter.memory_index.clear()  # indexes of the memory replaced
        super().load_state_dict(state)


class SuffixMemory(ResponseMemory):
    """The suffix drafter (``SuffixDrafter(**kw)``, DAS/SuffixDecoding style): the most
    frequent continuation of the row's context among its siblings on its worker and its
    prompt's earlier responses, counted in one suffix trie per prompt (rebuilt from the
    memory at each rollout's start)."""

    def __init__(self, **kw):
        super().__init__("suffix", SuffixDrafter(**kw))
