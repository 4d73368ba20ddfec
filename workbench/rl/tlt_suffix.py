"""TLT whose drafter is the model-free suffix drafter over the rollout history (the RL variant
``tlt_suffix``): the answer to "does a drafter that learns nothing but the responses already
sampled pay as well as TLT's EAGLE head, trained on idle workers?".

The suffix drafter (``speculative.suffix.SuffixDrafter``, DAS-style) drafts a row from the
counted suffixes of its prompt's references: the group's live siblings, which it reads as they
grow, and the prompt's earlier responses, its *memory*. The rollout fills nothing into the
memory by itself, so this trainer remembers every response of each step after its rollout: a
prompt that comes back in a later step (multi-epoch RL, a small pool) drafts from what it said
before. The memory is the drafter's whole learned state, so it goes into the run's checkpoint
(a resumed run drafts as the uninterrupted one would).

There is no spot trainer: the drafter has no weights to train in the idle windows, and
remembering a step's responses costs a few dictionary updates, not a training job.
"""
from __future__ import annotations

from ..speculative.drafter_spec import DrafterSpec
from ..speculative.drafters import DRAFTERS
from ..speculative.measure import acceptance_length
from ..speculative.suffix import SuffixDrafter
from .staleness.drafters import ResponseMemory
from .tlt import TLTConfig, TLTTrainer, tokens_digest

__all__ = ["SuffixTLTTrainer"]


class SuffixTLTTrainer(TLTTrainer):
    """:class:`~workbench.rl.tlt.TLTTrainer` whose drafter (``config.drafter``, a suffix
    drafter with its settings: ``"suffix"`` or ``"suffix:max_per_prompt=32,..."``)
    remembers every response of each RL step, for the prompt's later rollouts; the history's
    ``suffix_prompts``: the prompts in its memory after the step. Arguments as
    ``TLTTrainer``'s; ``config.adaptive_drafter`` must be False (``TLTConfig.parts``: the spot
    trainer trains EAGLE heads only), and ``drafter_head`` is not needed."""

    def __init__(self, model, tokenizer, problems, reward, config: TLTConfig, **kw):
        spec = DrafterSpec.parse(config.drafter) if config.drafter != "eagle" else None
        if not (config.speculative and spec is not None
                and issubclass(DRAFTERS.get(spec.name), SuffixDrafter)):
            raise ValueError(f"SuffixTLTTrainer: drafter {config.drafter!r} with "
                             f"speculative={config.speculative}; accepted: a speculative "
                             "config whose drafter is 'suffix' or 'suffix:key=value,...'")
        super().__init__(model, tokenizer, problems, reward, config, **kw)

    @property
    def memory(self) -> ResponseMemory:
        """The serving drafter's memory of earlier responses (the drafter itself, slowed or
        not: ``SlowedDrafter`` hands it on)."""
        return ResponseMemory("suffix", self.drafter)

    def _step(self) -> dict:
        """One RL step: the rollout (SD with the suffix drafter, as the schedule picks), its
        responses remembered, the policy update."""
        rl = self.grpo.rollout(self.schedule, self.drafter)
        extra = {"accept_len": acceptance_length(rl.result),
                 "tokens_digest": tokens_digest(rl.result),
                 **self.memory.learn(rl, self.grpo.engine.backend)}
        self.timelines[rl.step] = rl.result.timeline
        return self.grpo.update(rl, extra)

    def _own_state(self) -> dict:
        return {"suffix_memory": self.memory.state_dict()}

    def _load_own_state(self, state: dict) -> None:
        self.memory.load_state_dict(state["suffix_memory"])
