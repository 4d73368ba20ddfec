"""The spot trainer: the drafter learns on workers that sit idle while the long tail decodes.

In a synchronous RL step most workers finish their shard long before the step's longest
response does. TLT puts those idle windows to work: every worker that finishes trains the
drafter on the harvest buffer (:class:`~workbench.adapt.buffer.DrafterBuffer`) until the
step's last worker finishes, and is then preempted (``SpotConfig.idle_workers="all"``; the
seeds' coordinator likewise trains on every free rank; ``"first"``: the first worker to finish
alone). One RL step, as the TLT trainer runs it:

1. :meth:`SpotTrainer.tail` gives the step's drafter jobs
   (:class:`~workbench.adapt.drafter_job.DrafterTail`), which the rollout hands to its backend
   (``Backend.map_tail``): each worker whose shard comes back trains a copy of the published
   state on the pairs ready then, until the last shard comes back. On Ray (the wall clock)
   this really happens while the other actors still decode, and the step in flight when the
   last shard comes back is cut at its end; on the local backend (the sim clock) the jobs run
   after the shards, each charged in its window. Their steps are ``drafter_train`` rows on
   that worker's clock, and what each copy learned comes back as a ``DrafterOutcome``.
2. :meth:`SpotTrainer.merge` merges the copies by local SGD at the step's end
   (:mod:`workbench.adapt.local_sgd`: each copy counts in the average by its whole steps),
   publishes the merge, and ends the buffer's step.

:meth:`SpotTrainer.train_in_idle` does both after the fact, for a rollout that is over (on
the sim clock: ``LocalBackend.run_idle``, which the staleness observer replays).

The jobs carry the published trainer state, the training's config and the pairs, never a
policy: each copy trains a head built on the policy of the worker it runs on (a Ray actor's
own; on the local backend, whose workers share the spot trainer's policy, the spot trainer's
own trainer trains: nothing is built). A worker lost in its window (the job raised, or the
worker died) takes its copy with it: the other copies merge as usual, or, when none is left,
the previous drafter keeps serving (``drafter_failed_workers`` counts the lost windows).
A step is started only when the running estimate of a step's time still fits the window, and
a step that would cross the window's end is **preempted** there: its row is cut at the end of
the window and flagged ``preempted``, its seconds count as wasted, and its update is
discarded (the trainer's weights, optimizer and generator go back to where the last whole step
left them). Drafter work therefore never stretches the RL step: the step's time is the
rollout's time plus the update's (``drafter_overrun_s`` is 0 by construction, on Ray unless a
stop came later than the steps a job can undo: ``drafter_job``'s "undo").
``drafter_stop_wait_s``: how long the driver waited for the jobs once the last shard was back
(on Ray at most the step in flight; 0 on the sim clock).

The drafter that serves rollouts is never the one being trained: training runs on a copy, and
:meth:`SpotTrainer.publish` saves it atomically (the previous files stay whole until the new
ones are complete) and then loads it into the serving drafter in one call. A preemption, or a
crash, in the middle of an update therefore leaves the previous drafter or the new one, never
a mix. The new drafter serves from the next RL step.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

from ..checks import check_choice, check_fraction, check_int
from ..nested_config import NestedConfig
from ..speculative.train import EagleTrainConfig, EagleTrainer, harvest_pairs
from .buffer import DrafterBuffer
from .drafter_job import DrafterOutcome, DrafterTail, trainer_snapshot
from .local_sgd import merge_copies

__all__ = ["SpotConfig", "SpotTrainer"]


IDLE_WORKERS = ("all", "first")


def _spot_eagle() -> EagleTrainConfig:
    # training that never ends during RL: a constant LR and no horizon. The shipped head
    # finished its own training at 2e-4; at 1e-3 a few steps per RL step on one step's
    # harvest lowered its acceptance, the more the larger the update (RESULTS.md,
    # drafter_narrow_harvest), hence 1e-4.
    return EagleTrainConfig.flat(horizon=None, schedule="constant", lr=1e-4, batch_size=16,
                                 checkpoint_every=0)


@dataclass
class SpotConfig(NestedConfig):
    """Arguments of the spot trainer. Flat: ``SpotConfig.flat(batch_size=4, max_steps=8)``.

    Args:
        eagle: the drafter's training (``EagleTrainConfig``: batch size, unroll, noise, state
            units, and its optimizer: constant LR 1e-4, no horizon, seed of noise and batch
            order).
        max_steps: cap on one worker's drafter steps per RL step.
        carry_fraction: share of a step's longest sequences the buffer carries into the next
            step (TLT's one-step offset).
        history_steps: previous steps whose whole harvest the buffer also serves (0: TLT's
            buffer; one step's harvest alone is narrow enough that training on it can cost
            acceptance on other prompts).
        idle_workers: ``"all"``: every worker trains in its idle window, the copies merged
            by local SGD at the step's end; ``"first"``: the first worker to finish alone.
    """

    eagle: EagleTrainConfig = field(default_factory=_spot_eagle)
    max_steps: int = 400
    carry_fraction: float = 0.25
    history_steps: int = 0
    idle_workers: str = "all"

    def __post_init__(self):
        check_int("SpotConfig.max_steps", self.max_steps, 0)
        check_fraction("SpotConfig.carry_fraction", self.carry_fraction)
        check_int("SpotConfig.history_steps", self.history_steps, 0)
        check_choice("SpotConfig.idle_workers", self.idle_workers, IDLE_WORKERS)
        if not isinstance(self.eagle, EagleTrainConfig):
            raise ValueError(f"SpotConfig.eagle must be an EagleTrainConfig, got "
                             f"{type(self.eagle).__name__} (SpotConfig.flat takes flat "
                             "arguments such as lr=1e-4, batch_size=16)")


class SpotTrainer:
    """Trains ``drafter``'s EAGLE head during RL in the idle windows of rollout steps.

    Args:
        policy: the policy (frozen while the drafter trains; shared with the engine).
        drafter: the serving :class:`~workbench.speculative.drafters.EagleDrafter`; its head
            is replaced by each published version.
        config: a :class:`SpotConfig`.
        out_dir: where each published head is saved (atomically); ``None``: memory only.
    """

    def __init__(self, policy, drafter, config: SpotConfig | None = None,
                 out_dir: str | os.PathLike | None = None):
        self.config = config if config is not None else SpotConfig()
        if drafter.head is None:
            raise ValueError(f"the spot trainer trains EAGLE heads; got a "
                             f"{type(drafter).__name__} (use EagleDrafter)")
        self.serving, self.out_dir = drafter, out_dir
        self.head = copy.deepcopy(drafter.head).requires_grad_(True)
        self.eagle = EagleTrainer(policy, self.head, self.config.eagle)
        self.buffer = DrafterBuffer(self.config.carry_fraction,
                                    history_steps=self.config.history_steps)
        self.version = 0
        self.step_s = 0.0  # running estimate of one drafter step's seconds (0: none yet)

    def tail(self, workers: int) -> DrafterTail:
        """The drafter jobs of the next rollout, on ``workers`` workers (``Backend.map_tail``;
        module docstring, step 1): copies of the published state, one per worker whose shard
        comes back (``idle_workers="all"``, every worker but the last) or the first's."""
        c = self.config
        copies = 1 if c.idle_workers == "first" else max(1, workers - 1)
        return DrafterTail(c.eagle, trainer_snapshot(self.eagle.trainer), self.buffer, copies,
                           c.max_steps, self.step_s, self.eagle)

    def merge(self, result, tail: DrafterTail) -> dict:
        """Merge what ``tail``'s jobs handed back in ``result.idle`` (the rollout they ran
        in, harvested) by local SGD, publish the merge, and end the buffer's step (module
        docstring, step 2). Returns the step's drafter figures."""
        run = result.idle
        self.buffer.add_step(result, harvest_pairs(result))  # the step's harvest, for the carry
        outcomes = [o for o in run.outcomes if o is not None]  # a lost window's copy is lost
        self.step_s = _fold_estimates(outcomes, self.step_s)
        merged = merge_copies(tail.start, [o.state for o in outcomes],
                              [len(o.losses) for o in outcomes])
        self.eagle.trainer.load_state_dict(merged if merged is not None else tail.start)
        if merged is not None:
            self.publish()
        buffered = self.buffer.state()
        self.buffer.end_step()  # this step's longest sequences are the next step's carry
        losses = [loss for o in outcomes for loss in o.losses]
        return {"drafter_steps": len(losses),
                "drafter_workers": sum(1 for o in outcomes if o.losses),
                "drafter_worker": run.windows[0].worker if run.windows else -1,
                "drafter_window_s": sum(w.seconds for w in run.windows),
                "drafter_train_s": float(result.timeline.busy_s(("drafter_train",),
                                                                False).sum()),
                "drafter_preempted": sum(o.preempted for o in outcomes),
                "drafter_wasted_s": sum(o.wasted_s for o in outcomes),
                "drafter_failed_workers": len(run.failed),
                "drafter_overrun_s": result.timeline.makespan_s - result.timeline.rollout_end_s,
                "drafter_stop_wait_s": run.stop_wait_s,
                "drafter_loss": sum(losses) / len(losses) if losses else float("nan"),
                "drafter_pairs": next(iter(tail.pairs.values()), 0),
                "drafter_version": self.version, **buffered}

    def train_in_idle(self, result, backend) -> dict:
        """Train in the idle windows of ``result``, a rollout that is over, on the sim clock:
        ``backend`` is the local one that ran it (or replays its clocks:
        ``LocalBackend.run_idle``); ``result.timeline`` gains the ``drafter_train`` rows.
        A rollout on the wall clock trains during itself instead (:meth:`tail`)."""
        if backend.clock != "sim":
            raise ValueError(f"train_in_idle trains after a rollout on the sim clock; the "
                             f"{backend.name!r} backend's clock is {backend.clock!r}: pass "
                             "spot.tail(workers) to its rollout (TLTTrainer.step does)")
        tail = self.tail(result.config.workers)
        result.idle = backend.run_idle(tail, result.timeline, [result])
        result.timeline = result.idle.on(result.timeline)
        return self.merge(result, tail)

    def publish(self) -> None:
        """Save the trained head (atomic folder swap) and load it into the serving drafter."""
        state = {k: v.detach().clone() for k, v in self.head.state_dict().items()}
        if self.out_dir is not None:
            self.head.save_pretrained(self.out_dir)
        self.serving.head.load_state_dict(state)
        self.version += 1

    # ---- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"trainer": self.eagle.trainer.state_dict(), "version": self.version,
                "serving": self.serving.head.state_dict(), "step_s": self.step_s,
                "carry": [(it.pair, it.end_s, it.response_tokens) for it in self.buffer.carry],
                "history": [[(it.pair, it.end_s, it.response_tokens) for it in step]
                            for step in self.buffer.history]}

    def load_state_dict(self, state: dict) -> None:
        from .buffer import BufferItem
        self.eagle.trainer.load_state_dict(state["trainer"])
        self.serving.head.load_state_dict(state["serving"])
        self.version = int(state["version"])
        # the step-time estimate decides which steps fit the next windows (older: none saved)
        self.step_s = float(state.get("step_s", 0.0))
        self.buffer.current = []
        self.buffer.carry = [BufferItem(*it) for it in state["carry"]]
        self.buffer.history.clear()
        self.buffer.history.extend([BufferItem(*it) for it in step]
                                   for step in state.get("history", []))


def _fold_estimates(outcomes: list[DrafterOutcome], step_s: float) -> float:
    """The estimate the next RL step starts from: the one of the window that took the most
    whole steps (the best informed; a window that took one slow first step alone would hold
    every window of the next RL step back); when no window took a whole step but some tried,
    the largest (the steps were slow everywhere); when none tried, half the last."""
    trained = [o for o in outcomes if o.losses]
    if trained:
        return max(trained, key=lambda o: len(o.losses)).step_s
    if any(o.preempted for o in outcomes):
        return max(o.step_s for o in outcomes)
    # no window dared a step: halve the estimate, so that one slow step (a first one, a busy
    # moment) cannot stop drafter training for good; a step that is still too slow is cut
    # at its window's end, which costs idle time only
    return 0.5 * step_s
