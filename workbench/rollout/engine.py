"""The batched rollout engine: prompts in, responses + logprobs + timeline (+ harvest) out.

One :class:`RolloutEngine` call is one synchronous rollout step of RL: the requests (each
prompt x ``samples_per_prompt``) are sharded over N workers; each worker decodes its shard
with a KV cache, sampling with coupled draws so that a request's tokens do not depend on its
batch-mates, and finished rows leave the batch. Every engine call on a worker becomes a row
of the timeline's *steps* table, every request a row of its *requests* table. A worker lost
mid-step has its shard re-run on a survivor (``rollout.recovery``), so the step's result is
complete, and the timeline marks the failure and the re-run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import torch
from ..checks import check_bool, check_int
from ..progress import tqdm

from .backend import Backend, LocalBackend
from .compiled import compile_choices
from .idle import IdleRun, TailJobs
from .config import RolloutConfig
from .dispatch import Dispatch, drafter_view
from .recovery import Shards, run_shards, run_steps
from .request import Request, RequestOutput
from .sampling import make_uid
from .schedule import PlainSchedule, Schedule, StaticSchedule, check_schedule
from .timeline import Timeline
from .worker import WorkerTask

__all__ = ["RolloutConfig", "RequestOutput", "RolloutResult", "RolloutEngine"]

@dataclass
class RolloutResult:
    """Requests in (prompt_id, sample_idx) order, the step's timeline (the idle jobs' rows
    included), what the idle jobs of a rollout with a ``tail`` handed back, and
    ``compile_choices``: with ``RolloutConfig.compile="auto"``, the path each bucket decodes
    on since its timing (``rollout.compiled.compile_choices``: ``{bucket: "compiled" |
    "eager"}``, this rollout's and earlier ones' on the same model), which a run records to
    resume on (``GRPO.state_dict``); ``{}`` otherwise, and where the workers decode on copies
    of the model (Ray actors: each times its own)."""

    requests: list[RequestOutput]
    timeline: Timeline
    config: RolloutConfig
    idle: IdleRun = field(default_factory=IdleRun)
    compile_choices: dict = field(default_factory=dict)

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


class RolloutEngine:
    """Batched generation over N workers with per-request timelines.

    ``engine.rollout(prompts, RolloutConfig(...))`` returns a :class:`RolloutResult`. The model
    runs on its own device and dtype (CPU float32 by default; CUDA and bfloat16 when loaded so).
    Workers come from the backend (the local one by default, all sharing ``model``); call
    :meth:`start` to give each its own policy copy or drafter, :meth:`update_weights` after a
    drafter update, and :meth:`policy_changed` after changing ``model`` in place (workers with
    a copy of their own get its weights). A worker that fails mid-rollout has its requests
    re-run on a surviving worker (``rollout.recovery``); a second failure in that re-run, or a
    step with no survivor, raises the backend's ``WorkerFailed`` (the worker's index, the
    cause, the requests it held); bad input, a ValueError.
    """

    def __init__(self, model, tokenizer, backend: Backend | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.backend = backend or LocalBackend()
        self.eos_id = tokenizer.eos_token_id
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_id
        self.context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self._default_workers = False  # the engine started the backend with its own model
        self._shares_model = False  # every worker holds this very model (not a copy of it)
        # Workers of processes (Ray actors) that are already running hold whatever their
        # starter gave them: an engine that finds them sends its model before its first rollout
        self._behind = bool(self.backend.runs_copies and self.backend.num_workers)

    @classmethod
    def from_pretrained(cls, name_or_path="default", device=None, dtype=torch.float32, **kw):
        from ..models import load_model
        model, tokenizer = load_model(name_or_path, device=device, dtype=dtype)
        return cls(model, tokenizer, **kw)

    # ---- workers ------------------------------------------------------------------------
    def start(self, workers: int = 1, policy_factory=None, drafter_factory=None) -> None:
        """Start ``workers`` workers: worker ``w`` decodes with ``policy_factory(w)`` (default:
        this engine's model: shared by workers in this process; a backend of processes ships
        it once, and each of its workers holds a copy) and drafts with ``drafter_factory(w,
        policy)`` (its own drafter; default none). Each drafter is checked against its policy
        and tokenizer."""
        model, tokenizer = self.model, self.tokenizer  # what the closures ship, not the engine
        self.backend.start(policy_factory or (lambda w: model), drafter_factory, workers)
        self._default_workers = policy_factory is None and drafter_factory is None
        here = (os.getpid(), id(model))

        def check(worker, _):
            if worker.drafter is not None:
                worker.drafter.check_compatible(worker.model, tokenizer)
            return (os.getpid(), id(worker.model)) == here  # this very model, not a copy
        self._shares_model = all(self.backend.map(check, [None] * workers))
        self._behind = False  # the workers were just built from the model as it is

    def policy_changed(self) -> None:
        """Say that this engine's model changed in place (a policy update, a checkpoint
        loaded, or another run's weights on workers several engines take turns on): workers
        that hold a copy of their own (Ray actors, or workers of a ``policy_factory``) get
        its weights before the next rollout, once (or at :meth:`sync_policy`); workers
        sharing the model already see it."""
        self._behind = True

    @property
    def workers_behind_model(self) -> bool:
        """Whether the workers may hold older weights than this engine's model: it changed
        (:meth:`policy_changed`), or the engine found workers of processes already running,
        since they last got its weights (:meth:`start`, :meth:`sync_policy`, or the start of
        a rollout, which syncs first). The engine's own bookkeeping of what it owes the
        workers, read by nothing else it calls; public so that a caller can tell whether the
        next rollout begins with a weights push (workers sharing the model skip the push)."""
        return self._behind

    def sync_policy(self) -> None:
        """Send the changed model's weights (:meth:`policy_changed`) to the workers now,
        rather than at the start of the next rollout (to time it apart); nothing to send
        when the model did not change or the workers share it."""
        if self._behind and not self._shares_model and self.backend.num_workers:
            self.backend.update_weights(policy=self.model.state_dict())
        self._behind = False

    def update_weights(self, policy: dict | None = None, drafter: dict | None = None) -> None:
        """Load a new policy and/or drafter state dict into every worker."""
        self.backend.update_weights(policy, drafter)

    def _ensure_workers(self, n: int) -> None:
        if self.backend.num_workers == 0 or (self._default_workers
                                             and self.backend.num_workers != n):
            self.start(n)
        elif self.backend.num_workers != n:
            raise ValueError(f"config.workers is {n}, but the backend was started with "
                             f"{self.backend.num_workers} workers; start it again with {n}")
        self.sync_policy()

    # ---- requests -----------------------------------------------------------------------
    def encode(self, prompts) -> list[list[int]]:
        """Token ids of each prompt (strings go through the tokenizer, id lists pass as is),
        checked against the model's vocabulary and context before anything runs."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings or token-id lists, got one string")
        ids = [list(p) if not isinstance(p, str) else self.tokenizer(p)["input_ids"]
               for p in prompts]
        for i, p in enumerate(ids):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
            bad = [t for t in p if isinstance(t, bool) or not isinstance(t, int)
                   or not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt {i} has token id(s) {bad[:5]} outside the model's "
                                 f"vocabulary; accepted: integers in [0, {self.vocab_size})")
            if len(p) >= self.context:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens, but the model's context is "
                    f"{self.context} (max_position_embeddings); prompts must be shorter "
                    "than the context to leave room for a response")
        return ids

    def make_requests(self, prompt_ids, config: RolloutConfig, caps: list[int] | None = None,
                      rl_step: int = 0) -> list[Request]:
        """Every prompt x ``samples_per_prompt`` requests of RL step ``rl_step`` (in every
        uid, hence in the coupled draws); ``caps[p]``: prompt ``p``'s own length cap
        (checked: an integer in [1, ``config.max_new_tokens``])."""
        if caps is not None:
            if len(caps) != len(prompt_ids):
                raise ValueError(f"caps has {len(caps)} entries for {len(prompt_ids)} prompts; "
                                 "accepted: one length cap per prompt, or None")
            caps = [check_int(f"caps[{p}]", c, 1, config.max_new_tokens)
                    for p, c in enumerate(caps)]
        return [Request(make_uid(p, s, rl_step), p, s, tuple(ids),
                        None if caps is None else caps[p])
                for p, ids in enumerate(prompt_ids) for s in range(config.samples_per_prompt)]

    # ---- the rollout step ---------------------------------------------------------------
    def rollout(self, prompts, config: RolloutConfig | None = None, progress: bool = True,
                drafter=None, schedule: Schedule | None = None, tail: TailJobs | None = None,
                caps: list[int] | None = None, rl_step: int = 0, harvest: bool = False,
                dispatch: Dispatch | None = None, request_steps: bool = False,
                **overrides) -> RolloutResult:
        """Generate responses for ``prompts`` (strings or token-id lists) at RL step
        ``rl_step`` (part of every request's uid, hence of its coupled draws: the same
        prompts at the same step make the same requests).

        Keyword overrides replace fields of ``config``, e.g. ``rollout(p, temperature=1.0)``.
        ``caps``: each prompt's own response length cap, at most ``config.max_new_tokens``
        (a response continued from where an earlier RL step cut it has only the rest of its
        budget; ``rl.remedies``); None: ``config.max_new_tokens`` for every prompt.
        ``schedule`` decides each decode step (``rollout.schedule``); by default every step is
        plain, or speculative with ``config.spec_k`` drafts when a ``drafter`` is given. The
        drafter serves every worker in turn; without one, speculative steps use each worker's
        own (``start(drafter_factory=...)``). SD is lossless: greedy gives identical tokens,
        coupled sampling the plain coupled rollout's, speculative sampling the policy's
        distribution. ``tail``: jobs that each worker runs in its idle window once its shard
        is done, until the last shard is (``Backend.map_tail``); their rows join the
        timeline and their outcomes come back in ``RolloutResult.idle``. ``harvest``: keep
        the policy's pre-norm last hidden state at every fed position (drafter training
        data) in each ``RequestOutput.hidden``. ``dispatch``: the workers advance together
        and it moves work between them (``rollout.dispatch``, ``Backend.map_steps``: local,
        in sim-time order; Ray, in rounds); the requests' uids and tokens are unchanged.
        ``request_steps``: record ``Timeline.request_steps`` too (``rollout.request_steps``).
        """
        # 1. the settings: the config with its overrides, the schedule, the drafter checked
        config = replace(config or RolloutConfig(), **overrides)
        if schedule is None:
            schedule = StaticSchedule(config.spec_k) if drafter is not None else PlainSchedule()
        check_schedule(schedule)
        if drafter is not None:
            drafter.check_compatible(self.model, self.tokenizer)
        harvest = check_bool("harvest", harvest)
        request_steps = check_bool("request_steps", request_steps)
        # 2. the requests, a shard per worker (the workers started or synced first)
        requests = self.make_requests(self.encode(prompts), config, caps, rl_step)
        self._ensure_workers(config.workers)
        n = config.workers
        eos = None if config.ignore_eos else self.eos_id
        tasks = [WorkerTask(w, requests[w::n], config, eos, self.pad_id, harvest=harvest,
                            request_steps=request_steps) for w in range(n)]
        # 3. the workers decode their shards
        shards = self._decode(tasks, schedule, drafter, dispatch, tail, progress)
        # 4. the outputs in request order, with their text
        by_uid = {r.uid: r for res in shards.results for r in res.requests}
        outputs = [by_uid[q.uid] for q in requests]
        for r in outputs:
            r.text = self.tokenizer.decode(r.tokens, skip_special_tokens=True)
        # 5. the timeline; the schedule learns what the workers' copies of it learned
        timeline = self._timeline(shards, outputs, n, request_steps)
        if self.backend.runs_copies:
            schedule.absorb(timeline.steps)
        return RolloutResult(outputs, shards.idle.on(timeline), config, shards.idle,
                             self._compile_choices(config))

    def _compile_choices(self, config: RolloutConfig) -> dict:
        """``"auto"``'s choices for this engine's model (``RolloutResult.compile_choices``):
        ``{}`` unless ``config.compile`` is ``"auto"`` and the workers decode on it."""
        if not (isinstance(config.compile, str) and config.compile == "auto") or (
                self.backend.runs_copies):
            return {}
        return compile_choices(self.model)

    def _decode(self, tasks: list[WorkerTask], schedule: Schedule, drafter,
                dispatch: Dispatch | None, tail: TailJobs | None, progress: bool) -> Shards:
        """The workers' shards decoded behind a progress bar of the requests: each worker to
        its end, a lost one's shard re-run on a survivor (``run_shards``; the bar stays here:
        the backend reports progress); with a ``dispatch``, the workers together in sim-time
        order (``Backend.map_steps``), each drafting with a view of the shared drafter of its
        own (``drafter_view``)."""
        bar = tqdm(total=sum(len(t.requests) for t in tasks), desc="rollout", unit="req",
                   disable=not progress, leave=False)
        try:
            if dispatch is None:
                return run_shards(
                    self.backend, lambda worker, task: worker.rollout(task, schedule, drafter),
                    tasks, bar.update, tail)
            return run_steps(
                self.backend,
                lambda worker, task: worker.begin(task, schedule, drafter_view(drafter)),
                tasks, dispatch, bar.update, tail)
        finally:
            bar.close()

    def _timeline(self, shards: Shards, outputs: list[RequestOutput], n: int,
                  request_steps: bool) -> Timeline:
        """The step's timeline from what the workers gave back (its failed rows and re-runs
        included), with the request-steps table when asked, and the wall time that is 0 on
        its clock where every worker had the same (a backend of processes: Ray)."""
        steps = [row for res in shards.results for row in res.steps] + shards.failed_rows
        records = [{**r.record(), "failed_worker": shards.failed_worker.get(r.uid)}
                   for r in outputs]
        detail = ([row for res in shards.results for row in res.request_steps]
                  if request_steps else None)
        origins = {res.origin_s for res in shards.results} - {None}
        return Timeline.from_records(steps, records, n, self.backend.clock, detail,
                                     origins.pop() if len(origins) == 1 else None)
