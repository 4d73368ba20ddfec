"""The spot trainer: the drafter learns on workers that sit idle while the long tail decodes.

In a synchronous RL step most workers finish their shard long before the step's longest
response does. TLT puts those idle windows to work: every worker that finishes trains the
drafter on the harvest buffer (:class:`~workbench.adapt.buffer.DrafterBuffer`) until the
step's last worker finishes, and is then preempted (``SpotConfig.idle_workers="all"``; the
seeds' coordinator likewise trains on every free rank; ``"first"``: the first worker to finish
alone). The training is a :class:`DrafterJob` that the rollout's backend runs in each window
(``Backend.run_idle``): its steps are measured for real and recorded by the backend as
``drafter_train`` rows on that worker's clock, right after its last rollout step, and what
each worker learned comes back as a :class:`DrafterOutcome`. The workers' copies are merged by
local SGD at the step's end (:mod:`workbench.adapt.local_sgd`: each copy starts from the
published state, trains on its own batches of the pairs ready when its window opened, and
counts in the average by its whole steps). The job carries the published trainer state, the
training's config and the pairs, never a policy: each copy trains a head built on the policy
of the worker it runs on (a Ray actor's own; on the local backend, whose workers share the
spot trainer's policy, the spot trainer's own trainer trains: nothing is built). A worker
lost in its window (the job raised, or the worker died) takes its copy with it: the other
copies merge as usual, or, when none is left, the previous drafter keeps serving
(``drafter_failed_workers`` counts the lost windows).
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
from dataclasses import dataclass, field

from ..checks import check_choice, check_fraction, check_int
from ..nested_config import NestedConfig
from ..speculative.eagle import EagleHead
from ..speculative.train import EagleTrainConfig, EagleTrainer, harvest_pairs
from ..train import isolated_rng
from .buffer import DrafterBuffer
from .local_sgd import merge_copies

__all__ = ["SpotConfig", "SpotTrainer", "DrafterJob", "DrafterOutcome"]


IDLE_WORKERS = ("all", "first")


def _spot_eagle() -> EagleTrainConfig:
    # training that never ends during RL: a constant LR and no horizon. The shipped head
    # finished its own training at 2e-4; at 1e-3 a few steps per RL step on one step's
    # harvest lowered its acceptance (4.18 to 3.48 in notebook 04), hence 1e-4.
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
        if getattr(drafter, "head", None) is None:
            raise ValueError(f"the spot trainer trains EAGLE heads; got a "
                             f"{type(drafter).__name__} (use EagleDrafter)")
        self.serving, self.out_dir = drafter, out_dir
        self.head = copy.deepcopy(drafter.head).requires_grad_(True)
        self.eagle = EagleTrainer(policy, self.head, self.config.eagle)
        self.buffer = DrafterBuffer(self.config.carry_fraction,
                                    history_steps=self.config.history_steps)
        self.version = 0
        self.step_s = 0.0  # running estimate of one drafter step's seconds (0: none yet)

    def train_in_idle(self, result, backend) -> dict:
        """Train in the idle windows of ``result`` (every worker's, or the first to finish's:
        ``config.idle_workers``) through ``backend`` (the one that ran the rollout:
        ``Backend.run_idle``); ``result.timeline`` becomes the backend's, with the
        ``drafter_train`` rows. Returns the step's drafter figures."""
        # 1) this step's harvest joins the buffer; the windows that train, and their pairs:
        #    those ready when each window opens
        self.buffer.add_step(result, harvest_pairs(result))
        rollout_end = result.timeline.makespan_s
        windows = [w for w in result.timeline.idle_windows() if w.seconds > 0]
        windows = windows[:1] if self.config.idle_workers == "first" else windows
        pairs = {w.worker: self.buffer.pairs(until_s=w.start_s) for w in windows}
        # 2) the backend runs the job in each window, on that worker's clock: a copy of the
        #    published state trains on its own batches and records its steps
        c = self.config
        start = _snapshot(self.eagle.trainer)
        job = DrafterJob(c.eagle, start, pairs, c.eagle.batch_size, c.max_steps, self.step_s,
                         local=self.eagle)
        run = backend.run_idle(job, result.timeline, windows)
        result.timeline = run.timeline
        outcomes = [o for o in run.outcomes if o is not None]  # a lost window's copy is lost
        # 3) the copies merge at the step's end (local SGD); the merge serves from the next step
        self.step_s = _fold_estimates(outcomes, self.step_s)
        merged = merge_copies(start, [o.state for o in outcomes],
                              [len(o.losses) for o in outcomes])
        self.eagle.trainer.load_state_dict(merged if merged is not None else start)
        if merged is not None:
            self.publish()
        buffered = self.buffer.state()
        self.buffer.end_step()  # 4) this step's longest sequences are the next step's carry
        new = result.timeline
        losses = [loss for o in outcomes for loss in o.losses]
        return {"drafter_steps": len(losses),
                "drafter_workers": sum(1 for o in outcomes if o.losses),
                "drafter_worker": windows[0].worker if windows else -1,
                "drafter_window_s": sum(w.seconds for w in windows),
                "drafter_train_s": float(new.busy_s(("drafter_train",), False).sum()),
                "drafter_preempted": sum(o.preempted for o in outcomes),
                "drafter_wasted_s": sum(o.wasted_s for o in outcomes),
                "drafter_failed_workers": len(run.failed),
                "drafter_overrun_s": new.makespan_s - rollout_end,
                "drafter_loss": sum(losses) / len(losses) if losses else float("nan"),
                "drafter_pairs": len(pairs[windows[0].worker]) if windows else 0,
                "drafter_version": self.version, **buffered}

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


@dataclass
class DrafterOutcome:
    """What a :class:`DrafterJob` hands back from one idle window.

    ``losses``: one per whole drafter step; ``preempted`` (0 or 1): a step crossed the
    window's end and was discarded, ``wasted_s`` its seconds; ``step_s``: the running estimate
    of a step's seconds after the window; ``state``: the trainer's state after the last whole
    step (weights, optimizer, generator, history), ``None`` when no step was whole.
    """

    losses: list[float] = field(default_factory=list)
    preempted: int = 0
    wasted_s: float = 0.0
    step_s: float = 0.0
    state: dict | None = None


class DrafterJob:
    """Drafter training as an idle-window job (``rollout.backend.IdleJob``): in every window
    it runs in, a copy of ``start`` trains on that window's pairs (module docstring).

    Args:
        config: the drafter's training (``EagleTrainConfig``).
        start: the trainer state every window starts from (the published one).
        pairs: worker -> the buffer's pairs ready when its window opens.
        batch_size: sequences per step (the row's ``batch_size``; fewer when fewer pairs).
        max_steps: cap on whole steps in one window.
        step_s: the running estimate of one step's seconds (0: none yet).
        local: the spot trainer's own ``EagleTrainer``, which trains in a window whose
            worker's policy is its policy (reset to ``start`` at each window). It never
            travels: a copy of the job (another process's) holds none and builds one.
    """

    def __init__(self, config: EagleTrainConfig, start: dict, pairs: dict[int, list],
                 batch_size: int, max_steps: int, step_s: float,
                 local: EagleTrainer | None = None):
        self.config, self.start, self.pairs = config, start, pairs
        self.batch_size, self.max_steps, self.step_s = batch_size, max_steps, step_s
        self.ranks = {worker: rank for rank, worker in enumerate(pairs)}
        self.local = local
        self._built: dict[int, EagleTrainer] = {}  # id(policy) -> a trainer built on it

    def __getstate__(self) -> dict:
        # what travels: the state, config and pairs; the local trainer holds the policy
        return {**self.__dict__, "local": None, "_built": {}}

    def trainer_on(self, policy) -> EagleTrainer:
        """The trainer of a copy on ``policy`` (the window's worker's): the local one when
        that is its policy, else one built here once, its head's weights to come from
        ``start``."""
        if self.local is not None and self.local.policy is policy:
            return self.local
        built = self._built.get(id(policy))
        if built is None or built.policy is not policy:
            with isolated_rng(self.config.train.seed):  # the caller's RNG untouched
                head = EagleHead(policy)
            built = self._built[id(policy)] = EagleTrainer(policy, head, self.config)
        return built

    def run(self, window, clock) -> DrafterOutcome:
        """Train step after step while the estimate still fits ``window``; a step that
        crosses its end is preempted there and its update discarded."""
        out = DrafterOutcome(step_s=self.step_s)
        pairs = self.pairs.get(window.worker, [])
        if not pairs:
            return out
        eagle = self.trainer_on(clock.policy)
        # the copies' batches are disjoint: copy r of k takes batches first + r, + r + k, ...
        rank, copies = self.ranks[window.worker], len(self.ranks)
        first = self.start["step"]
        # a deep copy: AdamW's load_state_dict keeps the tensors it is given, and steps update
        # them in place, which would change the start of the next window
        eagle.trainer.load_state_dict(copy.deepcopy(self.start))
        eagle.set_pairs(pairs)
        batch_size = min(self.batch_size, len(pairs))
        with eagle.training():  # flags set once for the window, restored after it
            while len(out.losses) < self.max_steps and clock.now() + out.step_s < window.end_s:
                # 1) one drafter step on the worker's clock, from a copy of the last whole state
                kept = _snapshot(eagle.trainer)
                batch = first + rank + copies * len(out.losses)
                trained, row = clock.timed("drafter_train", lambda: eagle.step(batch),
                                           batch_size=batch_size)
                out.step_s = _next_estimate(out.step_s, row["forward_s"])  # what it took
                # 2) it crossed the window's end: preempted, its update discarded
                if row.get("preempted"):
                    eagle.trainer.load_state_dict(kept)
                    out.preempted, out.wasted_s = 1, row["end_s"] - row["start_s"]
                    break
                out.losses.append(trained["loss"])
        if out.losses:
            out.state = _snapshot(eagle.trainer)  # the next window resets the trainer
        return out


def _snapshot(trainer) -> dict:
    """The trainer's state as it is now, to go back to if the next step is preempted:
    weights, optimizer and generator copied; the history list (its rows are never changed in
    place) shared, since it grows with the whole run."""
    state = trainer.state_dict()
    return {k: v if k == "history" else copy.deepcopy(v) for k, v in state.items()}


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


def _next_estimate(step_s: float, seconds: float) -> float:
    """The running estimate of a drafter step's time after one that took ``seconds`` (what
    decides whether the next step still fits the idle window): up at once to a slower step,
    down slowly after faster ones, since a step started on too low an estimate is work
    thrown away."""
    return max(seconds, 0.8 * step_s + 0.2 * seconds)
