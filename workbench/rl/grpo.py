"""GRPO: group-relative policy optimisation, one RL step at a time, on the training harness.

One RL step reads top to bottom (:meth:`GRPO.step`):

1. **rollout**: take the step's ``P`` prompts and sample ``G`` responses to each with the
   rollout engine; score them with the task's reward (:meth:`GRPO.rollout`);
2. **update data**: normalise each reward inside its group (the advantage) and compute the
   old and reference log-probabilities, once, into a frozen
   :class:`~workbench.rl.loss.UpdateData`;
3. **update**: one :meth:`~workbench.train.Trainer.step` per minibatch of the step's sequences,
   ``epochs`` passes, on the clipped token-level surrogate, optionally with a k3 KL term to
   the reference policy (:func:`~workbench.rl.loss.minibatch_loss`);
4. **metrics**: reward, accuracy (``workbench.evaluate``'s definition), lengths, KL to the
   start, loss and timings, one row per RL step.

The trainer recomputes the old log-probabilities itself from the policy it updates, never
trusting the rollout's: a speculative verify pass rounds differently from a one-token step, and
the update must see the policy's own numbers. With one epoch of one minibatch (the default,
on-policy) the old log-probabilities are the detached values of the same forward, so the
ratio is exactly 1 and nothing is computed twice.

:class:`GRPO` owns the policy's optimizer (a :class:`~workbench.train.Trainer`), a frozen copy
of the starting policy (the KL reference and the drift measure) and the rollout engine. The
TLT trainer calls the halves (``rollout`` and ``update``) with drafter training in between.
Everything a step does is a function of the config and the step number (prompt order,
sampling draws, minibatch order), so a run resumed from its checkpoint continues exactly.
The loop around the steps (``run``, the checkpoint, the log) is :class:`~workbench.rl.loop.
RLLoop`'s: ``RLLoop(GRPO(...), checkpoint_dir=...).run(steps)`` is a resumable GRPO run.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, replace

import pandas as pd
import torch

from ..clock import cpu_share, seconds_reader, sim_work, usage_probe
from ..evaluate import accuracy, score_rollout
from ..rollout import RolloutEngine, make_backend
from ..rollout.compiled import use_compile_choices
from ..rollout.timeline_stats import usage_of, usage_shares
from ..tasks import Problem, exact_match_reward
from ..train import Trainer
from .config import GRPOConfig
from .loss import UpdateData, group_advantages, minibatch_loss

__all__ = ["GRPO", "RLStep"]


def _engine(model, tokenizer, engine, backend, ray_address) -> tuple:
    """GRPO's rollout engine: ``engine``, or a new one on ``backend``; and the backend GRPO
    made from a name (its to close; None when the engine or backend came from the caller)."""
    if engine is not None:
        if not (isinstance(backend, str) and backend == "local") or ray_address is not None:
            raise ValueError(f"backend={backend!r} and ray_address={ray_address!r} given with "
                             "an engine; accepted: an engine (on its own backend), or "
                             "backend= and ray_address=")
        return engine, None
    made = make_backend(backend, ray_address)
    owned = made if isinstance(backend, str) else None
    return RolloutEngine(model, tokenizer, backend=made), owned


@dataclass
class RLStep:
    """One RL step's rollout, rewards and metrics row. ``behaviour``: for data that older
    policies sampled (``rl.remedies``), what its ``weights(old_logp)`` turns into each
    response token's importance weight from the proximal (current) policy's log-probs;
    None: on-policy data."""

    step: int
    result: object            # the RolloutResult (timeline, requests)
    problems: list[Problem]
    rewards: list[float]
    metrics: dict
    behaviour: object = None


class GRPO:
    """GRPO on ``problems`` with ``reward``; ``run(steps)`` or ``step()`` at a time.

    Args:
        model: any HF causal LM (the policy; trained in place).
        tokenizer: its tokenizer.
        problems: the RL prompt pool (``workbench.tasks.Problem``); step ``s`` takes the next
            ``P`` of a seeded permutation per epoch of the pool.
        reward: ``reward(prompt, completion, answer) -> float``.
        config: a :class:`GRPOConfig`.
        engine: the rollout engine (default: a new one on ``model`` and ``backend``).
        backend: where the rollout workers run, without ``engine``: ``"local"`` (this process,
            the sim clock), ``"ray"`` (Ray actors, each with a copy of the policy that gets
            the new weights after every update, the wall clock) or a backend object
            (``rollout.make_backend``). A backend this GRPO made is closed by :meth:`close`.
        ray_address: with ``backend="ray"``, a cluster's ``"host:port"``; None reads
            ``$RAY_ADDRESS``, and without it a local Ray starts on 127.0.0.1.
    """

    def __init__(self, model, tokenizer, problems: list[Problem], reward=exact_match_reward,
                 config: GRPOConfig | None = None, engine: RolloutEngine | None = None,
                 backend="local", ray_address: str | None = None):
        self.config = config if config is not None else GRPOConfig()
        self.config.validate()
        if not callable(reward):
            raise TypeError(f"reward must be a callable reward(prompt, completion, answer), "
                            f"got {reward!r}")
        if not problems or not all(isinstance(p, Problem) for p in problems):
            raise ValueError("problems must be a non-empty list of workbench.tasks.Problem "
                             "(get_problems(...) or load_jsonl(...))")
        self.model, self.tokenizer, self.problems, self.reward = model, tokenizer, problems, reward
        self.engine, self._owned_backend = _engine(model, tokenizer, engine, backend,
                                                   ray_address)
        self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.trainer = Trainer(model, self._loss, self.config.train)
        self.rl_step = 0  # the policy's version: updates done
        self.rows: list[dict] = []
        # compile="auto"'s path per bucket, as the rollouts returned them: saved with the
        # run, so that a resumed run decodes as it did, untimed (load_state_dict)
        self.compile_choices: dict[str, str] = {}

    # ---- data ---------------------------------------------------------------------------
    def problems_for(self, step: int) -> list[Problem]:
        """The ``P`` problems of RL step ``step``: a seeded permutation per pass of the pool."""
        n, P = len(self.problems), self.config.prompts_per_step
        seed = self.config.rollout.seed
        out = []
        for j in range(step * P, (step + 1) * P):
            epoch, i = divmod(j, n)
            g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            out.append(self.problems[int(torch.randperm(n, generator=g)[i])])
        return out

    # ---- one step -----------------------------------------------------------------------
    def rollout(self, schedule=None, drafter=None, harvest: bool = False,
                tail=None) -> RLStep:
        """Sample this step's groups and score them (the policy is not changed); ``tail``:
        jobs for the idle windows of the rollout (``RolloutEngine.rollout``); the timeline
        records ``request_steps`` when the config asks."""
        problems = self.problems_for(self.rl_step)
        result = self.engine.rollout([p.prompt for p in problems], self.config.rollout,
                                     progress=False, drafter=drafter, schedule=schedule,
                                     tail=tail, rl_step=self.rl_step, harvest=harvest,
                                     request_steps=self.config.request_steps)
        rewards = score_rollout(result, problems, self.reward)
        return RLStep(self.rl_step, result, problems, rewards, {})

    def update(self, rl: RLStep, extra: dict | None = None) -> dict:
        """Update the policy on ``rl``'s groups; returns (and records) the step's metrics."""
        self.compile_choices.update(rl.result.compile_choices)
        clock = rl.result.timeline.clock  # the rollout's clock (workbench.clock)
        with sim_work() if clock == "sim" else nullcontext():
            read, usage = seconds_reader(clock), usage_probe(clock)
            t0, used = read(), usage()
            data = self.update_data(rl)                                # 2) frozen inputs
            rows = []
            with self.trainer.training():                              # 3) the steps
                for index in self.minibatch_plan(rl.step, len(data)):
                    rows.append(self.trainer.step((data, index)))
            update_s, update_share = read() - t0, cpu_share(used, usage())
        self.engine.policy_changed()  # workers with a copy get policy v+1 before its rollout
        row = self._metrics(rl, pd.DataFrame(rows), update_s)          # 4) the row
        row.update(_usage_columns(rl.result.timeline, update_s, update_share))
        row.update(extra or {})
        self.rl_step += 1
        return self.record_row(row)

    def record_row(self, row: dict) -> dict:
        """Add ``row`` to the history (a step's; one without an update records its own) and
        return it."""
        self.rows.append(row)
        return row

    def step(self, schedule=None, drafter=None) -> dict:
        """One RL step: rollout, rewards, update. Returns the step's metrics row."""
        return self.update(self.rollout(schedule, drafter))

    def close(self) -> None:
        """Close the backend this GRPO made from a name (a Ray backend's actors, and the
        local Ray it started); an engine or backend object passed in stays its owner's."""
        if self._owned_backend is not None:
            self._owned_backend.close()

    @property
    def history(self) -> pd.DataFrame:
        """One row per RL step: reward, accuracy, ``groups_with_signal`` (the share of groups
        whose rewards differ: the others get advantage 0 and teach nothing), lengths, KL to
        the start, loss, timings."""
        return pd.DataFrame(self.rows)

    # ---- the update's inputs and plan -----------------------------------------------------
    def update_data(self, rl: RLStep) -> UpdateData:
        """Everything the update of ``rl`` reads, computed once before its first step: the
        sequences, their advantages, the old log-probabilities (off-policy only: several
        optimizer steps, or data an older policy sampled, whose importance weights they
        give with ``rl.behaviour``) and the reference's (every sequence with a KL term, else
        the first ``kl_sample``)."""
        c = self.config
        reqs = rl.result.requests
        device = self.model.get_input_embeddings().weight.device  # the logprobs' device
        advantages = group_advantages(rl.rewards, c.rollout.samples_per_prompt,
                                      c.scale_rewards).to(device)
        data = UpdateData([r.prompt_ids for r in reqs], [r.tokens for r in reqs], advantages,
                          None, None, self.engine.pad_id, device)
        temperature, budget = c.rollout.temperature, c.micro_tokens
        on_policy = c.epochs == 1 and c.minibatches == 1 and rl.behaviour is None
        old = None if on_policy else data.logprobs(self.model, len(data), temperature, budget)
        weights = None if rl.behaviour is None else rl.behaviour.weights(old)
        sampled = len(data) if c.kl_coef else min(c.kl_sample, len(data))
        ref = data.logprobs(self.reference, sampled, temperature, budget)
        return replace(data, old_logp=old, ref_logp=ref, weights=weights)

    def minibatch_plan(self, step: int, n: int) -> list[list[int]]:
        """The sequence indices of each optimizer step of RL step ``step``: ``epochs`` passes,
        each a seeded permutation of the ``n`` sequences cut into ``minibatches``."""
        c = self.config
        plan = []
        for epoch in range(c.epochs):
            g = torch.Generator().manual_seed((c.train.seed * 1_000_003 + step) * 101 + epoch)
            perm = torch.randperm(n, generator=g).tolist() if c.minibatches > 1 else list(range(n))
            plan.extend(perm[m::c.minibatches] for m in range(c.minibatches))
        return plan

    def _loss(self, batch, generator):
        data, index = batch
        return minibatch_loss(self.model, data, index, self.config)

    @staticmethod
    def usage(history: pd.DataFrame) -> dict[str, float]:
        """``disturbed_share`` and ``cpu_share`` of a run (``workbench.clock``): its rollouts'
        steps and its updates pooled by their seconds (``Timeline.usage_s``); NaN for a
        history recorded before the columns."""
        if "usage_measured_s" not in history:
            return usage_shares([])
        return usage_shares([{"measured_s": history["usage_measured_s"].sum(),
                              "disturbed_s": history["usage_disturbed_s"].sum(),
                              "cpu_s": history["usage_cpu_s"].sum()}])

    def _metrics(self, rl: RLStep, hist: pd.DataFrame, update_s: float) -> dict:
        reqs = rl.result.requests
        lengths = [len(r.tokens) for r in reqs]
        tl = rl.result.timeline
        n = self.config.rollout.workers
        rollout_s = tl.rollout_end_s
        groups = torch.tensor(rl.rewards).view(-1, self.config.rollout.samples_per_prompt)
        signal = (groups != groups[:, :1]).any(dim=1).float().mean()
        return {"step": rl.step, "reward": sum(rl.rewards) / len(rl.rewards),
                "groups_with_signal": float(signal),
                "accuracy": accuracy([rl.problems[r.prompt_id] for r in reqs],
                                     [r.text for r in reqs]),
                "response_len": sum(lengths) / len(lengths), "response_len_max": max(lengths),
                "kl_start": float(hist["drift_sum"].sum() / hist["drift_tokens"].sum()),
                "loss": float(hist["loss"].mean()),
                "clip_fraction": float(hist["clip_fraction"].mean()),
                "grad_norm": float(hist["grad_norm"].mean()),
                "rollout_s": rollout_s, "update_s": update_s, "update_sim_s": update_s / n,
                "step_s": tl.makespan_s + update_s / n, "clock": tl.clock,
                "idle_fraction": tl.idle_fraction(), "wasted_fraction": tl.wasted_fraction(),
                "tokens": int(sum(lengths))}

    # ---- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"rl_step": self.rl_step, "rows": list(self.rows),
                "trainer": self.trainer.state_dict(),
                "reference": self.reference.state_dict(),
                "compile_choices": dict(self.compile_choices)}

    def load_state_dict(self, state: dict) -> None:
        self.trainer.load_state_dict(state["trainer"])
        self.reference.load_state_dict(state["reference"])
        self.rl_step, self.rows = int(state["rl_step"]), list(state["rows"])
        self._resume_compile_choices(state.get("compile_choices") or {})
        self.engine.policy_changed()

    def _resume_compile_choices(self, choices: dict) -> None:
        """Decode on the paths the saved run chose (``compile="auto"``'s per bucket): given
        to the policy's compiled step before the first step, so no bucket is timed again and
        float32 tokens do not depend on a timing. Refused where this run's ``compile`` is not
        ``"auto"``: it would decode otherwise than the run it resumes."""
        if not choices:
            return
        mode = self.config.rollout.compile
        if not (isinstance(mode, str) and mode == "auto"):
            raise ValueError(f"the checkpoint records the paths compile='auto' chose per "
                             f"bucket {choices}, but this run has compile={mode!r}; accepted: "
                             "compile='auto' (as saved: it resumes on those paths), or another "
                             "checkpoint_dir to start over")
        use_compile_choices(self.model, choices)
        self.compile_choices = dict(choices)


def _usage_columns(timeline, update_s: float, update_share: float) -> dict[str, float]:
    """A step's history columns for :meth:`GRPO.usage`: its rollout's ``Timeline.usage_s``
    and its update's seconds, pooled, and the update's own CPU share."""
    rollout, update = timeline.usage_s(), usage_of([update_s], [update_share])
    return {"update_cpu_share": update_share,
            **{f"usage_{key}": rollout[key] + update[key] for key in rollout}}
