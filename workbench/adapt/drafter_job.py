"""The drafter's training as idle-window jobs: one RL step's tail jobs, and the job of one
window.

Glossary:

tail      :class:`DrafterTail`, the spot trainer's jobs for one rollout
          (``rollout.idle.TailJobs``): the backend asks it for a worker's job when that
          worker's shard comes back, and it answers with a :class:`DrafterJob` on the pairs
          ready then (below), or ``None`` once it has handed out its ``copies``.
pairs     what a window's copy trains on: the buffer's pairs from before the step (the carry,
          and the history's) and this step's harvest as far as it has come back, its
          requests finished by the window's start (``DrafterBuffer.pairs``). One rule, two
          clocks: on the *sim* clock every shard has come back when the first job starts,
          so these are the step's requests that finished before the window opened; on the
          *wall* clock (Ray) they are the requests of the shards that came back before this
          one's job started, this one's included (the shards still decoding have given
          none).
copies    how many windows train (``idle_workers``): ``"all"``, every worker but the step's
          last (``workers - 1``; a window of no time has no job); ``"first"``, the first to
          finish. Copy r of k takes batches first + r, + r + k, ... (``first``: the trainer's
          step count at the step's start), so the copies' batches are disjoint; r is the
          order in which the windows opened (the shards came back), k is fixed before any
          opens.
undo      an open window (wall clock) gets its end while its job runs: the steps that ended
          past it before it was known are discarded, as far back as the job keeps the
          states before them (the last :data:`UNDO_STEPS` whole steps; a stop arrives within
          milliseconds, a step takes longer, so one is the usual case).
"""
from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass, field

from ..rollout.idle import IdleJob
from ..speculative.eagle import EagleHead
from ..speculative.train import EagleTrainConfig, EagleTrainer, harvest_pairs
from ..train import isolated_rng
from .buffer import BufferItem, DrafterBuffer

__all__ = ["DrafterTail", "DrafterJob", "DrafterOutcome"]

UNDO_STEPS = 4  # whole steps an open window's job can discard once its end is known
# policy -> the trainer a copy built on it in this process: every window resets the trainer to
# its job's start (weights, optimizer, generator), so a worker builds a head and an optimizer
# once, at its first window, not in every RL step's tail (what the local trainer does already)
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class DrafterOutcome:
    """What a :class:`DrafterJob` hands back from one idle window.

    ``losses``: one per whole drafter step; ``preempted`` (0 or 1): a step crossed the
    window's end and was discarded (with any after it), ``wasted_s`` its seconds in the
    window; ``step_s``: the running estimate of a step's seconds after the window; ``state``:
    the trainer's state after the last whole step (weights, optimizer, generator, history),
    ``None`` when no step was whole.
    """

    losses: list[float] = field(default_factory=list)
    preempted: int = 0
    wasted_s: float = 0.0
    step_s: float = 0.0
    state: dict | None = None


class DrafterTail:
    """The drafter jobs of one rollout (module docstring, "tail"), all starting from
    ``start`` (the published trainer state).

    Args:
        config: the drafter's training (``EagleTrainConfig``).
        start: the trainer state every copy starts from.
        buffer: the spot trainer's buffer, as it is before the step (carry, history).
        copies: how many windows train (module docstring, "copies").
        max_steps: cap on whole steps in one window.
        step_s: the running estimate of one step's seconds (0: none yet).
        local: the spot trainer's own ``EagleTrainer`` (``DrafterJob``'s ``local``).

    ``pairs``: worker -> the number of pairs its job got, in the order the jobs started.
    """

    def __init__(self, config: EagleTrainConfig, start: dict, buffer: DrafterBuffer,
                 copies: int, max_steps: int, step_s: float, local: EagleTrainer):
        self.config, self.start, self.buffer = config, start, buffer
        self.copies, self.max_steps, self.step_s, self.local = copies, max_steps, step_s, local
        self.pairs: dict[int, int] = {}
        self._harvest: dict[int, tuple] = {}  # uid -> ((prompt, sample), BufferItem)
        self._seen: set[int] = set()          # ids of the values harvested

    def job(self, window, returned: list) -> "DrafterJob | None":
        """The job of ``window``'s worker: a copy on the pairs ready now (module docstring);
        ``None`` once ``copies`` jobs are out."""
        if len(self.pairs) >= self.copies:
            return None
        for value in returned:
            if id(value) not in self._seen:
                self._seen.add(id(value))
                for r, pair in zip(value.requests, harvest_pairs(value)):
                    self._harvest[r.uid] = ((r.prompt_id, r.sample_idx),
                                            BufferItem(pair, r.end_s, len(r.tokens)))
        harvest = [item for _, item in sorted(self._harvest.values(), key=lambda x: x[0])]
        pairs = self.buffer.pairs(until_s=window.start_s, harvest=harvest)
        rank = len(self.pairs)
        self.pairs[window.worker] = len(pairs)
        return DrafterJob(self.config, self.start, pairs, rank, self.copies, self.max_steps,
                          self.step_s, self.local)


@dataclass
class JobProgress:
    """What a drafter job has done so far in its window, written by its ``run`` and read by
    ``settled`` from another thread (the wall clock's stop): the outcome as it grows, and the
    trainer state after each whole step that can still be undone. ``outcome`` is None until
    the run begins (the window closed before it did)."""

    outcome: DrafterOutcome | None = None
    after: dict[int, dict] = field(default_factory=dict)  # whole steps -> the state after


class DrafterJob(IdleJob):
    """Drafter training in one idle window (``rollout.idle.IdleJob``): a copy of
    ``start`` trains on ``pairs``, step after step while the estimate still fits the window.

    Args:
        config: the drafter's training (``EagleTrainConfig``; its batch size is the row's
            ``batch_size``, fewer when fewer pairs).
        start: the trainer state the copy starts from (the published one).
        pairs: what the copy trains on.
        rank, copies: this copy's place among the step's (module docstring, "copies").
        max_steps: cap on whole steps in the window.
        step_s: the running estimate of one step's seconds (0: none yet).
        local: the spot trainer's own ``EagleTrainer``, which trains in a window whose
            worker's policy is its policy (reset to ``start`` first). It never travels: a
            copy of the job (another process's) holds none and builds one.
    """

    def __init__(self, config: EagleTrainConfig, start: dict, pairs: list, rank: int,
                 copies: int, max_steps: int, step_s: float, local: EagleTrainer | None = None):
        self.config, self.start, self.pairs = config, start, pairs
        self.rank, self.copies = rank, copies
        self.max_steps, self.step_s, self.local = max_steps, step_s, local
        self.progress = JobProgress()

    def __getstate__(self) -> dict:
        # what travels: the state, config and pairs; the local trainer holds the policy
        return {**self.__dict__, "local": None}

    def trainer_on(self, policy) -> EagleTrainer:
        """The copy's trainer on ``policy`` (the window's worker's): the local one when that
        is its policy, else the one built here on it (once per policy and config: ``_BUILT``),
        its head's weights to come from ``start``."""
        if self.local is not None and self.local.policy is policy:
            return self.local
        built = _BUILT.get(policy)
        if built is None or built.config != self.config:
            with isolated_rng(self.config.train.seed):  # the caller's RNG untouched
                head = EagleHead(policy)
            built = _BUILT[policy] = EagleTrainer(policy, head, self.config)
        return built

    def run(self, window, clock) -> DrafterOutcome:
        """Train step after step while the estimate still fits the window; a step that
        crosses its end is preempted there and its update discarded, and so are the steps
        that ended past an open window's end before it was known (module docstring,
        "undo")."""
        progress = self.progress = JobProgress(DrafterOutcome(step_s=self.step_s))
        out = progress.outcome
        if not self.pairs or not clock.fits(out.step_s):  # nothing to train, or no time left
            return out
        eagle = self.trainer_on(clock.policy)
        # a deep copy: AdamW's load_state_dict keeps the tensors it is given, and steps update
        # them in place, which would change the start of the next window
        eagle.trainer.load_state_dict(copy.deepcopy(self.start))
        eagle.set_pairs(self.pairs)
        batch_size = min(self.config.batch_size, len(self.pairs))
        undoable = UNDO_STEPS if clock.open else 0
        with eagle.training():  # flags set once for the window, restored after it
            while len(out.losses) < self.max_steps and clock.fits(out.step_s):
                # 1) one drafter step on the worker's clock
                batch = self.start["step"] + self.rank + self.copies * len(out.losses)
                trained, row = clock.timed("drafter_train", lambda: eagle.step(batch),
                                           batch_size=batch_size)
                out.step_s = _next_estimate(out.step_s, row["forward_s"])  # what it took
                # 2) it crossed the window's end: preempted, its update discarded
                if row.get("preempted"):
                    out.preempted = 1
                    break
                out.losses.append(trained["loss"])
                progress.after[len(out.losses)] = trainer_snapshot(eagle.trainer)
                progress.after.pop(len(out.losses) - undoable - 1, None)  # beyond undoing
            # 3) an open window's end is known now: the steps that ended past it go too
            late = clock.settle(min(undoable, len(out.losses)))
            if late:
                del out.losses[-late:]
                out.preempted = 1
        out.wasted_s = clock.wasted_s()
        # the state after the last whole step kept (the trainer itself is reset by the next
        # window, and the spot trainer folds in the outcomes' states alone)
        out.state = progress.after.get(len(out.losses)) if out.losses else None
        return out

    def settled(self, rows: list[dict]) -> DrafterOutcome | None:
        """What this job did by its window's end, asked from another thread while it may
        still run (the wall clock's stop, ``IdleJob.settled``): ``rows``, the window's rows as
        they stand at the end, say how many whole steps count; their
        losses, and the state after them, are this job's. None when that state is no longer
        kept (more late steps than ``UNDO_STEPS``): the run's own outcome answers then."""
        progress = self.progress  # the run's, as it stands (it replaces the record whole)
        live = progress.outcome
        if live is None:  # the window closed before the job began
            return DrafterOutcome(step_s=self.step_s)
        whole = sum(1 for row in rows if not row.get("preempted"))
        state = progress.after.get(whole) if whole else None
        if whole and state is None:
            return None
        wasted = [row["end_s"] - row["start_s"] for row in rows if row.get("preempted")]
        return DrafterOutcome(list(live.losses[:whole]), int(bool(wasted)), float(sum(wasted)),
                              live.step_s, state)


def trainer_snapshot(trainer) -> dict:
    """The trainer's state as it is now, to go back to if the next step is preempted:
    weights, optimizer and generator copied; the history list (its rows are never changed in
    place) shared, since it grows with the whole run."""
    state = trainer.state_dict()
    return {k: v if k == "history" else copy.deepcopy(v) for k, v in state.items()}


def _next_estimate(step_s: float, seconds: float) -> float:
    """The running estimate of a drafter step's time after one that took ``seconds`` (what
    decides whether the next step still fits the idle window): up at once to a slower step,
    down slowly after faster ones, since a step started on too low an estimate is work
    thrown away."""
    return max(seconds, 0.8 * step_s + 0.2 * seconds)
