"""The batched rollout engine: prompts in, responses + logprobs + timeline (+ harvest) out.

One :class:`RolloutEngine` call is one synchronous rollout step of RL: the requests (each
prompt x ``samples_per_prompt``) are sharded over N workers; each worker decodes its shard
with a KV cache, sampling with coupled draws so that a request's tokens do not depend on its
batch-mates, and finished rows leave the batch. Every engine call on a worker becomes a row
of the timeline's *steps* table, every request a row of its *requests* table.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from tqdm.auto import tqdm

from .batch import PolicyForward
from .decoder import WaveDecoder
from .sampling import SamplingParams, make_uid
from .timeline import Timeline
from .workers import Backend, LocalBackend

__all__ = ["RolloutConfig", "RequestOutput", "RolloutResult", "RolloutEngine", "StepRecorder"]

SPEC_MODES = ("coupled", "speculative")


@dataclass(frozen=True)
class RolloutConfig:
    """Arguments of one rollout step.

    Args:
        max_new_tokens: response length cap per request (finish = "length" when reached).
        temperature, top_p, seed: sampling (temperature 0 = greedy); see SamplingParams.
        samples_per_prompt: responses per prompt (a GRPO group).
        rl_step: RL step number; part of every request's uid, hence of its coupled draws.
        workers: N workers the requests are sharded over (the GPUs of a synchronous step).
        max_batch_size: rows decoded together on a worker; None = the whole shard at once.
        harvest: keep the policy's pre-norm last hidden state at every fed position (drafter
            training data) in ``RequestOutput.hidden``.
        spec_k: draft tokens per speculative step (used when a drafter is given).
        spec_mode: verification when sampling (temperature > 0): "coupled" (output token-
            identical to the plain coupled rollout) or "speculative" (the rejection-sampling
            rule of Leviathan et al.; same distribution, different draws). Greedy verifies by
            exact match.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    samples_per_prompt: int = 1
    rl_step: int = 0
    workers: int = 1
    max_batch_size: int | None = None
    harvest: bool = False
    spec_k: int = 4
    spec_mode: str = "coupled"

    def __post_init__(self):
        if self.spec_mode not in SPEC_MODES:
            raise ValueError(f"spec_mode must be one of {SPEC_MODES}, got {self.spec_mode!r}")
        checks = [("workers", self.workers, 1), ("max_new_tokens", self.max_new_tokens, 1),
                  ("spec_k", self.spec_k, 1),
                  ("samples_per_prompt", self.samples_per_prompt, 1), ("rl_step", self.rl_step, 0)]
        for name, value, low in checks:
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.max_batch_size is not None and (not isinstance(self.max_batch_size, int)
                                                or self.max_batch_size < 1):
            raise ValueError(f"max_batch_size must be None or an integer >= 1, got "
                             f"{self.max_batch_size!r}")
        self.sampling  # validates temperature and top_p

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.seed)


@dataclass
class RequestOutput:
    """One request's result. ``tokens`` is the response (EOS included when emitted)."""

    uid: int
    prompt_id: int
    sample_idx: int
    prompt_ids: list[int]
    worker: int = -1
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""
    start_s: float = 0.0
    end_s: float = 0.0
    text: str = ""
    accepted_per_step: list[int] = field(default_factory=list)  # drafts accepted per verify
    emitted_per_step: list[int] = field(default_factory=list)   # tokens emitted per verify
    drafted: int = 0
    hidden: torch.Tensor | None = None

    def record(self) -> dict:
        """This request's row of the timeline's requests table."""
        return {"worker": self.worker, "uid": self.uid, "prompt_id": self.prompt_id,
                "sample_idx": self.sample_idx, "start_s": self.start_s, "end_s": self.end_s,
                "prompt_tokens": len(self.prompt_ids), "response_tokens": len(self.tokens),
                "finish": self.finish, "verify_steps": len(self.emitted_per_step),
                "drafted": self.drafted, "accepted": sum(self.accepted_per_step),
                "emitted": sum(self.emitted_per_step),
                "reward": float("nan")}


@dataclass
class RolloutResult:
    """Requests in (prompt_id, sample_idx) order, and the step's timeline."""

    requests: list[RequestOutput]
    timeline: Timeline
    config: RolloutConfig

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.requests]

    @property
    def tokens(self) -> list[list[int]]:
        return [r.tokens for r in self.requests]

    @property
    def logprobs(self) -> list[list[float]]:
        return [r.logprobs for r in self.requests]

    def set_rewards(self, rewards) -> None:
        """Store one reward per request (same order) in the requests table."""
        rewards = [float(x) for x in rewards]
        if len(rewards) != len(self.requests):
            raise ValueError(f"got {len(rewards)} rewards for {len(self.requests)} requests")
        by_uid = dict(zip((r.uid for r in self.requests), rewards))
        t = self.timeline.requests
        t["reward"] = t["uid"].map(by_uid).astype(float)


class StepRecorder:
    """A worker's clock and its steps table rows; each step starts where the last one ended."""

    def __init__(self, worker: int, clock: str):
        self.worker, self.clock = worker, clock
        self.t0 = time.perf_counter()
        self.rows: list[dict] = []
        self.mark = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def begin(self) -> float:
        """Start of the next step: the end of the previous one (0 for the first)."""
        return self.mark

    def end(self, kind: str, batch_size: int, tokens: int, forward_s: float) -> float:
        end = self.now()
        self.rows.append({"worker": self.worker, "step": len(self.rows), "kind": kind,
                          "start_s": self.mark, "end_s": end, "batch_size": batch_size,
                          "tokens": tokens, "forward_s": forward_s, "clock": self.clock})
        self.mark = end
        return end


class RolloutEngine:
    """Batched generation over N workers with per-request timelines.

    ``engine.rollout(prompts, RolloutConfig(...))`` returns a :class:`RolloutResult`. The model
    runs on its own device and dtype (CPU float32 by default; CUDA and bfloat16 when loaded so).
    """

    def __init__(self, model, tokenizer, backend: Backend | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.policy = PolicyForward.of(model)
        self.backend = backend or LocalBackend()
        self.eos_id = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_id

    @classmethod
    def from_pretrained(cls, name_or_path="default", device=None, dtype=torch.float32, **kw):
        from ..models import load_model
        model, tokenizer = load_model(name_or_path, device=device, dtype=dtype)
        return cls(model, tokenizer, **kw)

    # ---- requests -----------------------------------------------------------------------
    def encode(self, prompts) -> list[list[int]]:
        """Token ids of each prompt (strings go through the tokenizer, id lists pass as is),
        checked against the model's context before anything runs."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings or token-id lists, got one string")
        ids = [list(p) if not isinstance(p, str) else self.tokenizer(p)["input_ids"]
               for p in prompts]
        for i, p in enumerate(ids):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
            if len(p) >= self.policy.context:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens, but the model's context is "
                    f"{self.policy.context} (max_position_embeddings); prompts must be shorter "
                    "than the context to leave room for a response")
        return ids

    def make_requests(self, prompt_ids, config: RolloutConfig) -> list[RequestOutput]:
        return [RequestOutput(uid=make_uid(p, s, config.rl_step), prompt_id=p, sample_idx=s,
                              prompt_ids=ids)
                for p, ids in enumerate(prompt_ids) for s in range(config.samples_per_prompt)]

    # ---- the rollout step ---------------------------------------------------------------
    def rollout(self, prompts, config: RolloutConfig | None = None, progress: bool = True,
                drafter=None, **overrides) -> RolloutResult:
        """Generate responses for ``prompts`` (strings or token-id lists).

        Keyword overrides replace fields of ``config``, e.g. ``rollout(p, temperature=1.0)``.
        With a ``drafter`` (see ``workbench.speculative``) every step is speculative: the output is
        lossless (greedy: identical tokens; coupled: identical to the plain coupled rollout;
        speculative: the policy's distribution).
        """
        config = replace(config or RolloutConfig(), **overrides)
        if drafter is not None:
            drafter.check_compatible(self.model, self.tokenizer)
        requests = self.make_requests(self.encode(prompts), config)
        shards = [requests[w::config.workers] for w in range(config.workers)]
        bar = tqdm(total=len(requests), desc="rollout", unit="req", disable=not progress,
                   leave=False)
        step_rows = self.backend.map(
            lambda w, shard: self.run_worker(w, shard, config, bar.update, drafter), shards)
        bar.close()
        for r in requests:
            r.text = self.tokenizer.decode(r.tokens, skip_special_tokens=True)
        timeline = Timeline.from_records([row for rows in step_rows for row in rows],
                                         [r.record() for r in requests], config.workers,
                                         self.backend.clock)
        return RolloutResult(requests, timeline, config)

    def run_worker(self, worker: int, shard: list[RequestOutput], config: RolloutConfig,
                   on_finish=lambda n: None, drafter=None) -> list[dict]:
        """Decode one worker's shard in batches of ``max_batch_size``; its steps-table rows."""
        rec = StepRecorder(worker, self.backend.clock)
        size = config.max_batch_size or max(1, len(shard))
        for s in range(0, len(shard), size):
            wave = shard[s:s + size]
            for r in wave:
                r.worker = worker
            self.decode_wave(wave, config, rec, on_finish, drafter)
        return rec.rows

    @torch.no_grad()
    def decode_wave(self, reqs: list[RequestOutput], config: RolloutConfig, rec: StepRecorder,
                    on_finish=lambda n: None, drafter=None) -> None:
        """Decode ``reqs`` as one batch until every row finishes: plain steps, or speculative
        steps of ``config.spec_k`` drafts when a drafter is given."""
        dec = WaveDecoder(self.policy, reqs, config, rec, self.eos_id, self.pad_id, on_finish,
                          drafter=drafter)
        if drafter is not None:
            drafter.begin()
        dec.prefill()
        while not dec.done:
            if drafter is None:
                dec.plain_step()
            else:
                dec.spec_step(config.spec_k)
        dec.finish()
