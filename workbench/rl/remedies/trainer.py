"""GRPO with the long-tail remedies: one RL step that reads top to bottom.

:meth:`RemedyTrainer.step`:

1. **sample** (:class:`~workbench.rl.remedies.sampler.Sampler`): this step's rollout by the
   current policy: over-provisioned and ended early, with partial responses carried, as
   :class:`RemedyConfig` says. With one-step async the rollout sampled now is the *next*
   step's data, run beside this step's update (step 0 first samples its own, alone);
2. **data**: the trained groups (this step's, or with async the ones the last step
   sampled) as one :class:`~workbench.rl.grpo.RLStep`, scored, with their behaviour
   (:class:`~workbench.rl.remedies.offpolicy.Behaviour`) when any token is stale;
3. **update**: :meth:`GRPO.update` (the decoupled PPO objective on stale tokens), or none
   when no group finished;
4. **the clock**: the step's sim time (below), rollout and idle fractions (``Timeline``'s
   measures on the rollouts of the step), off-policy share and staleness of the trained
   tokens.

On the sim clock a synchronous step lasts its rollout (cut where it ended) plus the
update / N (with stale tokens, the update includes the forward of the proximal policy's
log-probs); an async step lasts ``max(rollout, update / N)``, plus the first rollout at
step 0. The behaviour log-probs are the rollout's own (no forward of the trainer's).
"""
from __future__ import annotations

import os
from pathlib import Path

from ...evaluate import score_rollout
from ...rollout import RequestOutput, RolloutResult
from ...rollout.timeline import ROLLOUT_KINDS
from ...tasks import exact_match_reward
from ..checkpoint import has_state, load_state, save_state
from ..grpo import GRPO, RLStep
from .config import RemedyConfig
from .offpolicy import Behaviour, staleness_metrics
from .sampler import Sampled, Sampler

__all__ = ["RemedyTrainer"]

STATE_FILE = "remedy_state.pt"


class RemedyTrainer:
    """GRPO whose steps sample, end and train as ``config`` (a :class:`RemedyConfig`) says.

    Args:
        model, tokenizer, problems, reward: as :class:`~workbench.rl.grpo.GRPO`.
        config: a :class:`RemedyConfig` (its ``grpo`` is the GRPO run).
        engine, backend, ray_address: where the rollouts run (as ``GRPO``'s).
        checkpoint_dir: atomic checkpoint of the whole loop (policy, optimizer, history, the
            carried and deferred groups, the queued async data); a run resumes from it.
    """

    def __init__(self, model, tokenizer, problems, reward=exact_match_reward,
                 config: RemedyConfig | None = None, engine=None, backend="local",
                 ray_address: str | None = None,
                 checkpoint_dir: str | os.PathLike | None = None):
        self.config = c = config if config is not None else RemedyConfig()
        self.grpo = GRPO(model, tokenizer, problems, reward, c.grpo, engine=engine,
                         backend=backend, ray_address=ray_address)
        self.sampler = Sampler(self.grpo.engine, c.grpo.rollout, c.grpo.prompts_per_step,
                               self.grpo.problems_for, c.extra_groups, c.leftover,
                               c.segment_tokens)
        self.queued: Sampled | None = None  # async: the data the next step trains on
        self.steps = 0
        self.last: list[Sampled] = []       # the rollouts of the latest step
        self.timelines: dict[int, object] = {}  # step -> its (first) rollout's timeline
        self.schedule = None                # plain decoding (the ablation reads it)
        self.checkpoint_dir = checkpoint_dir
        if checkpoint_dir is not None and has_state(checkpoint_dir, STATE_FILE):
            self.load_checkpoint(checkpoint_dir)

    @property
    def model(self):
        return self.grpo.model

    @property
    def version(self) -> int:
        """The policy's version: the updates done so far."""
        return self.grpo.rl_step

    def step(self, schedule=None, drafter=None, harvest: bool = False) -> dict:
        """One RL step (the module docstring); returns its metrics row. ``schedule``,
        ``drafter`` and ``harvest`` go to every rollout (TLT's engine and drafter; the
        rollouts of the step are :attr:`last`)."""
        c = self.config

        def sample() -> Sampled:
            return self.sampler.sample(self.version, c.off_policy, schedule, drafter, harvest)
        before = []                                                         # 1) sample
        if not c.one_step_async or self.queued is None:
            before.append(sample())
        if c.one_step_async:
            train = self.queued if self.queued is not None else before[0]
            self.queued = ahead = sample()
        else:
            train, ahead = before[0], None
        self.last = before + ([ahead] if ahead is not None else [])
        self.timelines[self.steps] = self.last[0].timeline
        rl = self.rl_step(train)                                            # 2) data
        extra = {"groups_trained": len(train.trained), "carried_groups": len(train.carried),
                 "aborted_tokens": train.aborted_tokens, "sampled_version": train.version,
                 "long_round": train.long_round,
                 **staleness_metrics([r.versions for g in train.trained for r in g.responses],
                                     self.version)}
        if train.trained:                                                   # 3) update
            row = self.grpo.update(rl, extra)
        else:
            row = {"step": self.steps, "update_s": 0.0, **extra}
            self.grpo.rows.append(row)
        row.update(self.clock(before, ahead, row["update_s"]))              # 4) the clock
        self.steps += 1
        return row

    def rl_step(self, sampled: Sampled) -> RLStep:
        """2) the trained groups of ``sampled`` as GRPO's step data, scored; their behaviour
        when an older version sampled any of their tokens."""
        c, groups = self.config, sampled.trained
        decode = self.grpo.tokenizer.decode
        requests = [RequestOutput(r.uid, p, s, list(g.prompt_ids), tokens=list(r.tokens),
                                  finish=r.finish, text=decode(r.tokens, skip_special_tokens=True))
                    for p, g in enumerate(groups) for s, r in enumerate(g.responses)]
        result = RolloutResult(requests, sampled.timeline, c.grpo.rollout)
        problems = [g.problem for g in groups]
        rewards = score_rollout(result, problems, self.grpo.reward) if groups else []
        responses = [r for g in groups for r in g.responses]
        stale = any(v < self.version for r in responses for v in r.versions)
        behaviour = (Behaviour([r.behaviour() for r in responses], [r.versions for r in responses],
                               self.version, c.is_cap) if stale else None)
        return RLStep(self.steps, result, problems, rewards, {}, behaviour)

    def clock(self, before: list[Sampled], ahead: Sampled | None, update_s: float) -> dict:
        """4) the step on the sim clock: ``rollout_s`` (the makespans of its rollouts),
        ``step_s``, ``rollout_fraction``, and ``idle_fraction`` and ``wasted_fraction`` over
        every rollout of the step (idle worker-seconds over N x makespan, from
        ``Timeline.idle_s``: without and with drafter training as work)."""
        n = self.config.grpo.rollout.workers
        runs = before + ([ahead] if ahead is not None else [])
        train_s = update_s / n
        first = sum(s.timeline.makespan_s for s in before)
        step_s = first + (train_s if ahead is None else max(ahead.timeline.makespan_s, train_s))
        rollout_s = sum(s.timeline.makespan_s for s in runs)
        span = sum(n * s.timeline.makespan_s for s in runs)
        idle = sum(float(s.timeline.idle_s().sum()) for s in runs)
        wasted = sum(float(s.timeline.idle_s(ROLLOUT_KINDS + ("drafter_train",),
                                             preempted=False).sum()) for s in runs)
        return {"rollout_s": rollout_s, "step_s": step_s, "update_sim_s": train_s,
                "rollout_fraction": rollout_s / step_s if step_s > 0 else 0.0,
                "idle_fraction": idle / span if span > 0 else 0.0,
                "wasted_fraction": wasted / span if span > 0 else 0.0,
                "clock": runs[0].timeline.clock}

    def run(self, steps: int, progress: bool = True, desc: str = "RL"):
        """``steps`` more RL steps (checkpointing after each when ``checkpoint_dir`` is set);
        the history."""
        from ...progress import tqdm
        for _ in tqdm(range(steps), desc=desc, disable=not progress):
            self.step()
            if self.checkpoint_dir is not None:
                self.save_checkpoint()
        return self.history

    @property
    def history(self):
        return self.grpo.history

    def close(self) -> None:
        self.grpo.close()

    # ---- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Write the whole loop's state atomically (an interruption leaves the previous)."""
        s = self.sampler
        state = {"grpo": self.grpo.state_dict(), "steps": self.steps, "queued": self.queued,
                 "sampler": {"pool": s.pool, "tail": s.tail, "drawn": s.drawn,
                             "rollouts": s.rollouts}}
        return save_state(path if path is not None else self.checkpoint_dir, STATE_FILE, state)

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        state = load_state(path, STATE_FILE)
        self.grpo.load_state_dict(state["grpo"])
        self.steps, self.queued = state["steps"], state["queued"]
        for name, value in state["sampler"].items():
            setattr(self.sampler, name, value)
