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

With TLT (``tlt``, a :class:`~workbench.rl.tlt.TLTConfig`) every rollout of the step decodes
with its SD, drafter and adaptive engine, as ``TLTTrainer.step`` does: the spot trainer's
jobs (``spot.tail``) go into the rollout, its copies merge after it (``spot.merge``), and then
the policy updates; with an early-stop cut the jobs train in the idle windows of the cut
rollout, which end at the cut (``Sampler``).

On the sim clock a synchronous step lasts its rollout (cut where it ended) plus the
update / N (with stale tokens, the update includes the forward of the proximal policy's
log-probs); an async step lasts ``max(rollout, update / N)``, plus the first rollout at
step 0. The behaviour log-probs are the rollout's own (no forward of the trainer's).
"""
from __future__ import annotations

import os

from ...evaluate import score_rollout
from ...rollout import RequestOutput, RolloutResult
from ...rollout.timeline import ROLLOUT_KINDS
from ...speculative.measure import acceptance_length
from ...tasks import exact_match_reward
from ..grpo import GRPO, RLStep
from ..loop import RLLoop
from ..tlt import TLTConfig, tokens_digest
from .config import RemedyConfig
from .offpolicy import Behaviour, staleness_metrics
from .sampler import Sampled, Sampler

__all__ = ["RemedyTrainer"]

STATE_FILE = "remedy_state.pt"


class RemedyTrainer(RLLoop):
    """GRPO whose steps sample, end and train as ``config`` (a :class:`RemedyConfig`) says,
    in the RL loop shell (:class:`~workbench.rl.loop.RLLoop`: checkpoint, history,
    timelines, log).

    Args:
        model, tokenizer, problems, reward: as :class:`~workbench.rl.grpo.GRPO`.
        config: a :class:`RemedyConfig` (its ``grpo`` is the GRPO run).
        engine, backend, ray_address: where the rollouts run (as ``GRPO``'s).
        checkpoint_dir: atomic checkpoint of the whole loop (policy, optimizer, history, the
            carried and deferred groups, the queued async data, the drafter and bandit); a
            run resumes from it.
        tlt: TLT's rollouts beside the remedy (a ``TLTConfig``: SD, the spot-trained drafter
            and the adaptive engine; its ``grpo`` is not read, ``config.grpo`` is the run);
            None: plain decoding.
        drafter_head, drafter_dir: the pre-RL EAGLE head and where the spot trainer
            publishes (as :class:`~workbench.rl.tlt.TLTTrainer`'s).
        order: the order of each rollout's requests (``Sampler``'s; None: as drawn).
        dispatch: where each rollout's requests run (``Sampler``'s; None: each worker its
            shard).
        report_to, run_dir: the per-step scalars' log and the run's folder (``RLLoop``'s).
    """

    STATE_FILE = STATE_FILE

    def __init__(self, model, tokenizer, problems, reward=exact_match_reward,
                 config: RemedyConfig | None = None, engine=None, backend="local",
                 ray_address: str | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, tlt: TLTConfig | None = None,
                 drafter_head=None, drafter_dir: str | os.PathLike | None = None,
                 order=None, report_to: str = "none", run_dir: str | os.PathLike | None = None,
                 dispatch=None):
        self.config = c = config if config is not None else RemedyConfig()
        if tlt is not None:
            tlt.check_head(drafter_head)  # before the backend starts
        grpo = GRPO(model, tokenizer, problems, reward, c.grpo, engine=engine,
                    backend=backend, ray_address=ray_address)
        # TLT's drafter, spot trainer and schedule (None each: plain decoding)
        self.drafter, self.spot, self.schedule = (
            tlt.parts(model, drafter_head, drafter_dir) if tlt is not None else (None,) * 3)
        clock = grpo.engine.backend.clock
        if self.spot is not None and c.extra_groups and clock != "sim":
            grpo.close()
            raise ValueError(f"TLT's drafter training with over-provisioning (extra_groups="
                             f"{c.extra_groups}) on the {clock!r} clock: its jobs would train "
                             "past the early stop; accepted: the local backend (sim clock), "
                             "or extra_groups=0")
        self.sampler = Sampler(grpo.engine, c.grpo.rollout, c.grpo.prompts_per_step,
                               grpo.problems_for, c.extra_groups, c.leftover,
                               c.segment_tokens, order, dispatch)
        self.queued: Sampled | None = None  # async: the data the next step trains on
        self.last: list[Sampled] = []       # the rollouts of the latest step
        super().__init__(grpo, checkpoint_dir, report_to, run_dir)

    @property
    def version(self) -> int:
        """The policy's version: the updates done so far."""
        return self.grpo.rl_step

    def _step(self) -> dict:
        """One RL step (the module docstring); returns its metrics row (the rollouts of the
        step are :attr:`last`)."""
        c = self.config
        drafts = []  # the drafter figures of each rollout (TLT)
        before = []                                                         # 1) sample
        if not c.one_step_async or self.queued is None:
            before.append(self.sample(drafts))
        if c.one_step_async:
            train = self.queued if self.queued is not None else before[0]
            self.queued = ahead = self.sample(drafts)
        else:
            train, ahead = before[0], None
        self.last = before + ([ahead] if ahead is not None else [])
        self.timelines[self.rl_step] = self.last[0].timeline
        rl = self.step_data(train)                                          # 2) data
        extra = {"groups_trained": len(train.trained), "carried_groups": len(train.carried),
                 "aborted_tokens": train.aborted_tokens, "sampled_version": train.version,
                 "long_round": train.long_round,
                 "tokens_digest": tokens_digest(self.last[0].result),
                 **staleness_metrics([r.versions for g in train.trained for r in g.responses],
                                     self.version), **_fold_drafter_figures(drafts)}
        if train.trained:                                                   # 3) update
            row = self.grpo.update(rl, extra)
        else:
            row = self.grpo.record_row({"step": self.rl_step, "update_s": 0.0, **extra})
        row.update(self.clock(before, ahead, row["update_s"]))              # 4) the clock
        return row

    def sample(self, drafts: list[dict]) -> Sampled:
        """1) one rollout by the current policy; with TLT, as ``TLTTrainer.step`` runs it:
        the drafter trains on every worker whose shard came back, each a copy of the
        published state, until the last shard came back (or the early stop); the copies
        merge by local SGD and the merge is published, serving from the next rollout. Its
        drafter figures are appended to ``drafts``."""
        spot = self.spot
        tail = spot.tail(self.config.grpo.rollout.workers) if spot is not None else None
        sampled = self.sampler.sample(self.version, self.config.off_policy, self.schedule,
                                      self.drafter, harvest=spot is not None, tail=tail)
        if self.drafter is not None:
            figures = {"accept_len": acceptance_length(sampled.result)}
            if spot is not None:
                figures.update(spot.merge(sampled.at_end, tail))
            drafts.append(figures)
        return sampled

    def step_data(self, sampled: Sampled) -> RLStep:
        """2) the trained groups of ``sampled`` as GRPO's step data, scored; their behaviour
        when an older version sampled any of their tokens."""
        c, groups = self.config, sampled.trained
        decode = self.grpo.tokenizer.decode
        requests = [RequestOutput(r.uid, p, s, list(g.prompt_ids), tokens=list(r.tokens),
                                  finish=r.finish, text=decode(r.tokens, skip_special_tokens=True))
                    for p, g in enumerate(groups) for s, r in enumerate(g.responses)]
        # with the paths compile="auto" chose, which the run records (GRPO.update)
        result = RolloutResult(requests, sampled.timeline, c.grpo.rollout,
                               compile_choices=sampled.result.compile_choices)
        problems = [g.problem for g in groups]
        rewards = score_rollout(result, problems, self.grpo.reward) if groups else []
        responses = [r for g in groups for r in g.responses]
        stale = any(v < self.version for r in responses for v in r.versions)
        behaviour = (Behaviour([r.behaviour() for r in responses], [r.versions for r in responses],
                               self.version, c.is_cap) if stale else None)
        return RLStep(self.rl_step, result, problems, rewards, {}, behaviour)

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

    # ---- checkpoints (``RLLoop``'s, with the sampler's and the async queue) --------------
    def _own_state(self) -> dict:
        s = self.sampler
        return {"steps": self.rl_step, "queued": self.queued,
                "sampler": {"pool": s.pool, "tail": s.tail, "drawn": s.drawn,
                            "rollouts": s.rollouts}}

    def _load_own_state(self, state: dict) -> None:
        self.queued = state["queued"]
        for name, value in state["sampler"].items():
            setattr(self.sampler, name, value)


# drafter figures that add up over the rollouts of one step (async's step 0 has two); of the
# others the last rollout's stand
_ADDED = ("drafter_steps", "drafter_window_s", "drafter_train_s", "drafter_preempted",
          "drafter_wasted_s", "drafter_failed_workers", "drafter_stop_wait_s")


def _fold_drafter_figures(rows: list[dict]) -> dict:
    """One step's drafter figures from its rollouts' (``SpotTrainer.merge``'s and the
    acceptance length): the counts and seconds of :data:`_ADDED` summed, the overrun the
    largest, the acceptance length the mean, the rest the last rollout's."""
    if not rows:
        return {}
    out = dict(rows[-1])
    for key in _ADDED:
        if key in out:
            out[key] = sum(r[key] for r in rows)
    if "drafter_overrun_s" in out:
        out["drafter_overrun_s"] = max(r["drafter_overrun_s"] for r in rows)
    out["accept_len"] = sum(r["accept_len"] for r in rows) / len(rows)
    return out
