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

from .batch import DecodeBatch, PolicyForward
from .sampling import SamplingParams, adjusted_logprobs, choose_tokens, coupled_uniforms, make_uid
from .timeline import Timeline
from .workers import Backend, LocalBackend

__all__ = ["RolloutConfig", "RequestOutput", "RolloutResult", "RolloutEngine", "StepRecorder"]


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

    def __post_init__(self):
        checks = [("workers", self.workers, 1), ("max_new_tokens", self.max_new_tokens, 1),
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
    accepted_per_step: list[int] = field(default_factory=list)  # speculative decoding
    drafted: int = 0
    hidden: torch.Tensor | None = None
    _hidden_chunks: list = field(default_factory=list, repr=False)

    def record(self) -> dict:
        """This request's row of the timeline's requests table."""
        return {"worker": self.worker, "uid": self.uid, "prompt_id": self.prompt_id,
                "sample_idx": self.sample_idx, "start_s": self.start_s, "end_s": self.end_s,
                "prompt_tokens": len(self.prompt_ids), "response_tokens": len(self.tokens),
                "finish": self.finish, "verify_steps": len(self.accepted_per_step),
                "drafted": self.drafted, "accepted": sum(self.accepted_per_step),
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


def _timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


class RolloutEngine:
    """Batched generation over N workers with per-request timelines.

    ``engine.rollout(prompts, RolloutConfig(...))`` returns a :class:`RolloutResult`. The model
    runs on its own device and dtype (CPU float32 by default; CUDA and bfloat16 when loaded so).
    """

    def __init__(self, model, tokenizer, backend: Backend | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.policy = PolicyForward(model)
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
                **overrides) -> RolloutResult:
        """Generate responses for ``prompts`` (strings or token-id lists).

        Keyword overrides replace fields of ``config``, e.g. ``rollout(p, temperature=1.0)``.
        """
        config = replace(config or RolloutConfig(), **overrides)
        requests = self.make_requests(self.encode(prompts), config)
        shards = [requests[w::config.workers] for w in range(config.workers)]
        bar = tqdm(total=len(requests), desc="rollout", unit="req", disable=not progress,
                   leave=False)
        step_rows = self.backend.map(
            lambda w, shard: self.run_worker(w, shard, config, bar.update), shards)
        bar.close()
        for r in requests:
            r.text = self.tokenizer.decode(r.tokens, skip_special_tokens=True)
        timeline = Timeline.from_records([row for rows in step_rows for row in rows],
                                         [r.record() for r in requests], config.workers,
                                         self.backend.clock)
        return RolloutResult(requests, timeline, config)

    def run_worker(self, worker: int, shard: list[RequestOutput], config: RolloutConfig,
                   on_finish=lambda n: None) -> list[dict]:
        """Decode one worker's shard in batches of ``max_batch_size``; its steps-table rows."""
        rec = StepRecorder(worker, self.backend.clock)
        size = config.max_batch_size or max(1, len(shard))
        for s in range(0, len(shard), size):
            wave = shard[s:s + size]
            for r in wave:
                r.worker = worker
            self.decode_wave(wave, config, rec, on_finish)
        return rec.rows

    @torch.no_grad()
    def decode_wave(self, reqs: list[RequestOutput], config: RolloutConfig, rec: StepRecorder,
                    on_finish=lambda n: None) -> None:
        """Plain autoregressive decoding of ``reqs`` as one batch until every row finishes."""
        params = config.sampling
        start = rec.begin()
        batch, ids, pos = DecodeBatch.from_prompts([r.prompt_ids for r in reqs],
                                                   range(len(reqs)), self.pad_id,
                                                   self.policy.device)
        for r in reqs:
            r.start_s = start
        (logits, hidden), fwd_s = _timed(self.policy, ids, batch.mask, pos, batch.cache)
        if config.harvest:
            for row, r in enumerate(reqs):
                r._hidden_chunks.append(hidden[row, -len(r.prompt_ids):].cpu())
        kind = "prefill"
        while True:
            tok, lp = self.sample(logits[:, -1], params, [reqs[i] for i in batch.request_ids])
            finished = self.emit(batch, reqs, tok.tolist(), lp.tolist(), config)
            end = rec.end(kind, batch.size, batch.size, fwd_s)
            for row in finished:
                reqs[batch.request_ids[row]].end_s = end
            on_finish(len(finished))
            if finished:
                done = set(finished)
                keep = [r for r in range(batch.size) if r not in done]
                if not keep:
                    break
                tok = tok[keep]
                batch.keep_rows(keep)
            batch.last_token = tok
            batch.append_columns(1)
            (logits, hidden), fwd_s = _timed(self.policy, tok[:, None], batch.mask,
                                             batch.next_pos[:, None], batch.cache)
            batch.next_pos += 1
            if config.harvest:
                for row, i in enumerate(batch.request_ids):
                    reqs[i]._hidden_chunks.append(hidden[row, -1:].cpu())
            kind = "decode"
        if config.harvest:
            for r in reqs:
                r.hidden = torch.cat(r._hidden_chunks)
                r._hidden_chunks = []

    def sample(self, logits: torch.Tensor, params: SamplingParams, rows: list[RequestOutput],
               offset: int = 0):
        """Tokens and their adjusted logprobs for each row's next position (coupled draws)."""
        logp = adjusted_logprobs(logits, params)
        u = None if params.greedy else coupled_uniforms(
            params.seed, [r.uid for r in rows], [len(r.tokens) + offset for r in rows])
        tok = choose_tokens(logp, params, u)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    def emit(self, batch: DecodeBatch, reqs: list[RequestOutput], tokens: list[int],
             logprobs: list[float], config: RolloutConfig) -> list[int]:
        """Append one token per row; the rows that finished (EOS, length or context)."""
        finished = []
        room = (self.policy.context - 1 - batch.next_pos).tolist()
        for row, (t, lp) in enumerate(zip(tokens, logprobs)):
            r = reqs[batch.request_ids[row]]
            r.tokens.append(t)
            r.logprobs.append(lp)
            if t == self.eos_id:
                r.finish = "eos"
            elif len(r.tokens) >= config.max_new_tokens or room[row] <= 0:
                r.finish = "length"
            else:
                continue
            finished.append(row)
        return finished
