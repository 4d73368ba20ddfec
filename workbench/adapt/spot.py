"""The spot trainer: the drafter learns on workers that sit idle while the long tail decodes.

In a synchronous RL step most workers finish their shard long before the step's longest
response does. TLT puts that idle window to work: the first worker to finish trains the
drafter on the harvest buffer (:class:`~workbench.adapt.buffer.DrafterBuffer`) until the
step's last worker finishes, and is then preempted. Training steps are measured for real and
recorded as ``drafter_train`` rows on that worker's clock, right after its last rollout step.
A step is started only when the running estimate of a step's time still fits the window, and
a step that would cross the window's end is **preempted** there: on the sim clock its row is
cut at the end of the window and flagged ``preempted``, its seconds count as wasted, and its
update is discarded (the trainer's weights, optimizer and generator go back to where the last
whole step left them). Drafter work therefore never stretches the RL step: the step's time is
the rollout's time plus the update's (``drafter_overrun_s`` is 0 by construction).

The drafter that serves rollouts is never the one being trained: training runs on a copy, and
:meth:`SpotTrainer.publish` saves it atomically (the previous files stay whole until the new
ones are complete) and then loads it into the serving drafter in one call. A preemption, or a
crash, in the middle of an update therefore leaves the previous drafter or the new one, never
a mix. The new drafter serves from the next RL step.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass

from ..speculative.train import EagleTrainConfig, EagleTrainer, harvest_pairs
from .buffer import DrafterBuffer

__all__ = ["SpotConfig", "SpotTrainer"]


@dataclass
class SpotConfig:
    """Arguments of the spot trainer.

    Args:
        lr: AdamW learning rate of the drafter (constant: training never ends during RL). The
            shipped head finished its own training at 2e-4; at 1e-3 a few steps per RL step
            on one step's harvest lowered its acceptance (4.18 to 3.48 in notebook 04).
        batch_size: sequences per drafter step.
        unroll, noise, state_units: EAGLE training (see ``EagleTrainConfig``).
        max_steps: cap on drafter steps per RL step.
        carry_fraction: share of a step's longest sequences the buffer carries into the next
            step (TLT's one-step offset).
        history_steps: previous steps whose whole harvest the buffer also serves (0: TLT's
            buffer; one step's harvest alone is narrow enough that training on it can cost
            acceptance on other prompts).
        seed: the drafter trainer's generator (noise) and batch order.
    """

    lr: float = 1e-4
    batch_size: int = 16
    unroll: int = 2
    noise: float = 0.05
    state_units: str = "rms"
    max_steps: int = 400
    carry_fraction: float = 0.25
    history_steps: int = 0
    seed: int = 0

    def __post_init__(self):
        v = self.max_steps
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"SpotConfig.max_steps must be an integer >= 0, got {v!r}")
        self.eagle_config().validate()

    def eagle_config(self) -> EagleTrainConfig:
        # training that never ends during RL: a constant LR, no horizon
        return EagleTrainConfig.flat(horizon=None, schedule="constant", batch_size=self.batch_size,
                                     lr=self.lr, unroll=self.unroll, noise=self.noise,
                                     state_units=self.state_units, seed=self.seed,
                                     checkpoint_every=0)


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
        if getattr(drafter, "head", None) is None:
            raise ValueError(f"the spot trainer trains EAGLE heads; got a "
                             f"{type(drafter).__name__} (use EagleDrafter)")
        self.serving, self.out_dir = drafter, out_dir
        self.head = copy.deepcopy(drafter.head).requires_grad_(True)
        self.eagle = EagleTrainer(policy, self.head, self.config.eagle_config())
        self.buffer = DrafterBuffer(self.config.carry_fraction,
                                    history_steps=self.config.history_steps)
        self.version = 0
        self.step_s = 0.0  # running estimate of one drafter step's seconds (0: none yet)

    def idle_window(self, timeline) -> tuple[int, float, float]:
        """``(worker, start_s, end_s)``: the idle window of the first worker to finish its
        shard, from its last rollout step to the end of the step's rollout."""
        last = timeline.steps.groupby("worker")["end_s"].max()
        w = int(last.idxmin())
        return w, float(last[w]), timeline.makespan_s

    def train_in_idle(self, result, workers) -> dict:
        """Train in ``result``'s idle window (``workers``: the backend's workers, indexed by
        worker id, whose recorders hold the step's clocks); the timeline gains the
        ``drafter_train`` rows. Returns the step's drafter figures."""
        self.buffer.add_step(result, harvest_pairs(result))
        rollout_end = result.timeline.makespan_s
        w, start, end = self.idle_window(result.timeline)
        data = self.buffer.pairs(until_s=start)
        rec = workers[w].recorder
        before = len(rec.rows)
        losses, preempted, wasted_s = [], 0, 0.0
        c = self.config
        if data:
            self.eagle.set_pairs(data)
            while len(losses) < c.max_steps and rec.mark + self.step_s < end:
                # 1) one drafter step on the worker's clock, from a copy of the last whole state
                kept = self._snapshot()
                hist = workers[w].timed("drafter_train", lambda: self.eagle.train(steps=1),
                                        batch_size=min(c.batch_size, len(data)), deadline=end)
                row = rec.rows[-1]
                self._observe_step(row["forward_s"])  # what it really took, cut or not
                # 2) it crossed the window's end: preempted, its update discarded
                if row.get("preempted"):
                    self.eagle.trainer.load_state_dict(kept)
                    preempted, wasted_s = 1, row["end_s"] - row["start_s"]
                    break
                losses.append(float(hist["loss"].iloc[-1]))
            result.timeline = result.timeline.with_steps(rec.rows[before:])
            if losses:
                self.publish()  # 3) the new version serves from the next RL step
        buffered = self.buffer.state()
        self.buffer.end_step()  # this step's longest sequences are the next step's carry
        new = result.timeline
        return {"drafter_steps": len(losses), "drafter_worker": w,
                "drafter_window_s": end - start,
                "drafter_train_s": float(new.busy_s(("drafter_train",), False).sum()),
                "drafter_preempted": preempted, "drafter_wasted_s": wasted_s,
                "drafter_overrun_s": new.makespan_s - rollout_end,
                "drafter_loss": sum(losses) / len(losses) if losses else float("nan"),
                "drafter_pairs": len(data), "drafter_version": self.version,
                **buffered}

    def _snapshot(self) -> dict:
        """The trainer's state as it is now, to go back to if the next step is preempted:
        weights, optimizer and generator copied; the history list (its rows are never
        changed in place) shared, since it grows with the whole run."""
        state = self.eagle.trainer.state_dict()
        return {k: v if k == "history" else copy.deepcopy(v) for k, v in state.items()}

    def _observe_step(self, seconds: float) -> None:
        """Update the running estimate of a drafter step's time (what decides whether the
        next step still fits the idle window): up at once to a slower step, down slowly
        after faster ones, since a step started on too low an estimate is work thrown away."""
        self.step_s = max(seconds, 0.8 * self.step_s + 0.2 * seconds)

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
                "serving": self.serving.head.state_dict(),
                "carry": [(it.pair, it.end_s, it.response_tokens) for it in self.buffer.carry],
                "history": [[(it.pair, it.end_s, it.response_tokens) for it in step]
                            for step in self.buffer.history]}

    def load_state_dict(self, state: dict) -> None:
        from .buffer import BufferItem
        self.eagle.trainer.load_state_dict(state["trainer"])
        self.serving.head.load_state_dict(state["serving"])
        self.version = int(state["version"])
        self.buffer.current = []
        self.buffer.carry = [BufferItem(*it) for it in state["carry"]]
        self.buffer.history.clear()
        self.buffer.history.extend([BufferItem(*it) for it in step]
                                   for step in state.get("history", []))
