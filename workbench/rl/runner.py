"""The GRPO loop: rollout, rewards, advantages, update; one RL step per call, resumable.

:class:`GRPO` owns the policy's optimizer (through :class:`~workbench.train.Trainer`), a frozen
copy of the starting policy (the KL reference and the drift measure) and the rollout engine.
``step()`` is one synchronous RL step; the TLT trainer calls its halves (``rollout`` and
``update``) with drafter training in between. Everything a step does is a function of the
config and the step number (prompt order, sampling draws, minibatch order), so a run resumed
from its checkpoint continues exactly.
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ..evaluate import score_rollout
from ..rollout import RolloutConfig, RolloutEngine
from ..rollout.timeline import ROLLOUT_KINDS
from ..tasks import Problem, exact_match_reward
from ..train import TrainConfig, Trainer
from .checkpoint import has_state, load_state, save_state
from .grpo import (GRPOConfig, SequenceBatch, aggregate_sums, group_advantages, k3,
                   micro_batches, sequence_logprobs, token_terms)

__all__ = ["GRPO", "RLStep", "STATE_FILE"]

STATE_FILE = "rl_state.pt"


@dataclass
class RLStep:
    """One RL step's rollout, rewards, metrics row and the update's wall seconds."""

    step: int
    result: object            # the RolloutResult (timeline, requests)
    problems: list[Problem]
    rewards: list[float]
    metrics: dict


def _no_batch(step):
    raise RuntimeError("GRPO sets the trainer's batches before each update")


class GRPO:
    """GRPO on ``problems`` with ``reward``; ``run(steps)`` or ``step()`` at a time.

    Args:
        model: any HF causal LM (the policy; trained in place).
        tokenizer: its tokenizer.
        problems: the RL prompt pool (``workbench.tasks.Problem``); step ``s`` takes the next
            ``P`` of a seeded permutation per epoch of the pool.
        reward: ``reward(prompt, completion, answer) -> float``.
        config: a :class:`GRPOConfig`.
        engine: the rollout engine (default: a new one on ``model``).
        checkpoint_dir: folder of the atomic RL checkpoint (policy, optimizer, step, history);
            a run resumes from it.
    """

    def __init__(self, model, tokenizer, problems: list[Problem], reward=exact_match_reward,
                 config: GRPOConfig | None = None, engine: RolloutEngine | None = None,
                 checkpoint_dir: str | os.PathLike | None = None):
        self.config = config if config is not None else GRPOConfig()
        self.config.validate()
        if not callable(reward):
            raise TypeError(f"reward must be a callable reward(prompt, completion, answer), "
                            f"got {reward!r}")
        if not problems or not all(isinstance(p, Problem) for p in problems):
            raise ValueError("problems must be a non-empty list of workbench.tasks.Problem "
                             "(get_problems(...) or load_jsonl(...))")
        self.model, self.tokenizer, self.problems, self.reward = model, tokenizer, problems, reward
        self.engine = engine or RolloutEngine(model, tokenizer)
        self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        c = self.config
        self.trainer = Trainer(model, self._loss, _no_batch, TrainConfig(
            steps=1 << 40, lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay,
            clip_norm=c.clip_norm, seed=c.seed, train_mode=False, progress=False))
        self.pad_id = self.engine.pad_id
        self.rl_step = 0
        self.rows: list[dict] = []
        self.checkpoint_dir = checkpoint_dir
        if checkpoint_dir is not None and self.has_checkpoint(checkpoint_dir):
            self.load_checkpoint(checkpoint_dir)

    # ---- data ---------------------------------------------------------------------------
    def problems_for(self, step: int) -> list[Problem]:
        """The ``P`` problems of RL step ``step``: a seeded permutation per pass of the pool."""
        n, P = len(self.problems), self.config.prompts_per_step
        out = []
        for j in range(step * P, (step + 1) * P):
            epoch, i = divmod(j, n)
            g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
            out.append(self.problems[int(torch.randperm(n, generator=g)[i])])
        return out

    def rollout_config(self, step: int, **overrides) -> RolloutConfig:
        c = self.config
        fields = dict(max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                      seed=c.seed, samples_per_prompt=c.samples_per_prompt, rl_step=step,
                      workers=c.workers, max_batch_size=c.max_batch_size,
                      spec_mode=c.spec_mode)
        return RolloutConfig(**{**fields, **overrides})

    # ---- one step -----------------------------------------------------------------------
    def rollout(self, schedule=None, drafter=None, harvest: bool = False) -> RLStep:
        """Sample this step's groups and score them (the policy is not changed)."""
        problems = self.problems_for(self.rl_step)
        result = self.engine.rollout([p.prompt for p in problems],
                                     self.rollout_config(self.rl_step, harvest=harvest),
                                     progress=False, drafter=drafter, schedule=schedule)
        rewards = score_rollout(result, problems, self.reward)
        return RLStep(self.rl_step, result, problems, rewards, {})

    def update(self, rl: RLStep, extra: dict | None = None) -> dict:
        """Update the policy on ``rl``'s groups; returns (and records) the step's metrics."""
        t0 = time.perf_counter()
        c = self.config
        reqs = rl.result.requests
        self._prompts = [r.prompt_ids for r in reqs]
        self._responses = [r.tokens for r in reqs]
        device = self.model.get_input_embeddings().weight.device  # the logprobs' device
        self._adv = group_advantages(rl.rewards, c.samples_per_prompt,
                                     c.scale_rewards).to(device)
        on_policy = c.epochs == 1 and c.minibatches == 1
        self._old = None if on_policy else self._response_logprobs(self.model, len(reqs))
        n = len(reqs) if c.kl_coef else min(c.kl_sample, len(reqs))
        self._ref = self._response_logprobs(self.reference, n)
        self._seen_logp = [None] * len(reqs)
        base = self.trainer.step
        plan = self._minibatch_plan(rl.step, len(reqs))
        self.trainer.batches = lambda s: plan[s - base]
        hist = self.trainer.run(steps=len(plan))
        update_s = time.perf_counter() - t0
        old = self._old if self._old is not None else self._seen_logp
        row = self._metrics(rl, hist.iloc[-len(plan):], old, update_s)
        row.update(extra or {})
        self.rows.append(row)
        self.rl_step += 1
        return row

    def step(self, schedule=None, drafter=None) -> dict:
        """One RL step: rollout, rewards, update. Returns the step's metrics row."""
        return self.update(self.rollout(schedule, drafter))

    def run(self, steps: int, progress: bool = True, on_step=None) -> pd.DataFrame:
        """``steps`` more RL steps (checkpointing after each when ``checkpoint_dir`` is set)."""
        from ..progress import tqdm
        for _ in tqdm(range(steps), desc="GRPO", disable=not progress):
            self.step()
            if self.checkpoint_dir is not None:
                self.save_checkpoint()
            if on_step is not None:
                on_step(self)
        return self.history

    @property
    def history(self) -> pd.DataFrame:
        """One row per RL step: reward, accuracy, ``groups_with_signal`` (the share of groups
        whose rewards differ: the others get advantage 0 and teach nothing), lengths, KL to
        the start, loss, timings."""
        return pd.DataFrame(self.rows)

    # ---- the loss -----------------------------------------------------------------------
    def _minibatch_plan(self, step: int, n: int) -> list[list[int]]:
        c = self.config
        plan = []
        for epoch in range(c.epochs):
            g = torch.Generator().manual_seed((c.seed * 1_000_003 + step) * 101 + epoch)
            perm = torch.randperm(n, generator=g).tolist() if c.minibatches > 1 else list(range(n))
            plan.extend(perm[m::c.minibatches] for m in range(c.minibatches))
        return plan

    def _batch(self, index: list[int]) -> SequenceBatch:
        device = self.model.get_input_embeddings().weight.device
        return SequenceBatch.of([self._prompts[i] for i in index],
                                [self._responses[i] for i in index], index, self.pad_id, device)

    def _micro(self, index: list[int]) -> list[SequenceBatch]:
        lengths = [len(self._prompts[i]) + len(self._responses[i]) for i in index]
        return [self._batch([index[j] for j in g])
                for g in micro_batches(lengths, self.config.micro_tokens)]

    @torch.no_grad()
    def _response_logprobs(self, model, n: int) -> list[torch.Tensor | None]:
        """The first ``n`` sequences' response-token log-probabilities under ``model`` (no
        grad); ``None`` for the rest."""
        out = [None] * len(self._prompts)
        for mb in self._micro(list(range(n))):
            logp = sequence_logprobs(model, mb, self.config.temperature)
            for row, i in enumerate(mb.index):
                out[i] = self._response_part(mb, row, logp)
        return out

    def _response_part(self, mb: SequenceBatch, row: int, values: torch.Tensor):
        start = len(self._prompts[mb.index[row]]) - 1
        return values[row, start:start + len(self._responses[mb.index[row]])]

    def _padded(self, mb: SequenceBatch, per_seq: list[torch.Tensor], like: torch.Tensor):
        out = torch.zeros_like(like)
        for row, i in enumerate(mb.index):
            start = len(self._prompts[i]) - 1
            out[row, start:start + len(per_seq[i])] = per_seq[i]
        return out

    def _loss(self, index: list[int], generator):
        c = self.config
        sums, counts, clipped = [], [], 0.0
        for mb in self._micro(index):
            logp = sequence_logprobs(self.model, mb, c.temperature)
            for row, i in enumerate(mb.index):
                self._seen_logp[i] = self._response_part(mb, row, logp.detach())
            old = logp.detach() if self._old is None else self._padded(mb, self._old, logp)
            ref = self._padded(mb, self._ref, logp) if c.kl_coef else None
            per_token, clip = token_terms(logp, old, self._adv[mb.index], c.clip_eps, ref,
                                          c.kl_coef)
            sums.append((per_token * mb.response).sum(1))
            counts.append(mb.response.sum(1))
            clipped += float((clip * mb.response).sum())
        counts = torch.cat(counts)
        loss = aggregate_sums(torch.cat(sums), counts, c.loss_aggregation)
        return loss, {"clip_fraction": clipped / max(1.0, float(counts.sum())),
                      "tokens": int(counts.sum())}

    def _metrics(self, rl: RLStep, hist: pd.DataFrame, old, update_s: float) -> dict:
        from ..tasks import extract_final_answer
        reqs = rl.result.requests
        lengths = [len(r.tokens) for r in reqs]
        correct = [extract_final_answer(r.text) == str(rl.problems[r.prompt_id].answer).strip()
                   for r in reqs]
        drift = torch.cat([k3(ref - o) for ref, o in zip(self._ref, old)
                           if ref is not None]).mean()
        tl = rl.result.timeline
        n = self.config.workers
        rollout_s = float(tl.steps.loc[tl.steps["kind"].isin(ROLLOUT_KINDS), "end_s"].max())
        groups = torch.tensor(rl.rewards).view(-1, self.config.samples_per_prompt)
        signal = (groups != groups[:, :1]).any(dim=1).float().mean()
        return {"step": rl.step, "reward": sum(rl.rewards) / len(rl.rewards),
                "groups_with_signal": float(signal),
                "accuracy": sum(correct) / len(correct),
                "response_len": sum(lengths) / len(lengths), "response_len_max": max(lengths),
                "kl_start": float(drift), "loss": float(hist["loss"].mean()),
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
                "reference": self.reference.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.trainer.load_state_dict(state["trainer"])
        self.reference.load_state_dict(state["reference"])
        self.rl_step, self.rows = int(state["rl_step"]), list(state["rows"])

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Write the RL state atomically: an interruption leaves the previous checkpoint."""
        return save_state(path if path is not None else self.checkpoint_dir, STATE_FILE,
                          self.state_dict())

    @staticmethod
    def has_checkpoint(path) -> bool:
        return has_state(path, STATE_FILE)

    def load_checkpoint(self, path) -> None:
        self.load_state_dict(load_state(path, STATE_FILE))
