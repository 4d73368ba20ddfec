"""The live batch of one worker, advanced one engine call (step) at a time.

Between steps every live row has exactly one token that it emitted but has not fed yet
(``batch.last_token``). A *plain* step feeds it and samples the next token; a *speculative*
step drafts ``k`` tokens per row (a chain, or a tree: ``rollout.drafts``), feeds
``[last_token] + drafts`` to the policy in one forward, keeps each row's accepted path plus
one token of the policy's own, and turns the rejected cache columns into holes. All end the
same way (emit, finish, drop finished rows), so a schedule can switch between them at any
step. ``admit`` prefills waiting requests and joins them to the running batch (continuous
batching); coupled draws depend on ``(seed, uid, position)`` only, so a request's tokens do
not depend on when it joined or with whom.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import DecodeBatch
from .drafts import DraftCompile, DraftInput
from .compiled import compiled_decode_for, prepared
from .forward import Forward
from .plan import StepPlan, propose, serving_drafter
from .sampling import SamplingParams
from .sampling_mode import SamplingMode
from .schedule import StepReport
from .static_cache import StaticKVCache, round_up

__all__ = ["BatchDecoder", "StepOutcome", "prefill_groups"]


@dataclass(frozen=True)
class StepOutcome:
    """What one decode step did before the clock is read (``BatchDecoder.step`` adds the
    worker, the plan, the rows and the elapsed time to make its ``StepReport``).

    ``tokens``: response tokens emitted over all rows; ``forward_s``: the policy forward's
    seconds; ``drafted``/``accepted``: draft tokens proposed and kept over all rows;
    ``draft_s``: the drafter's seconds; ``drafter``: the name of the drafter that drafted.
    A plain step (or a speculative one with no room left to draft) drafts nothing: 0, 0,
    0.0 and ``None``.
    """

    tokens: int
    forward_s: float
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    drafter: str | None = None


def prefill_groups(lengths: list[int], max_padding: float = 0.25) -> list[list[int]]:
    """Indices of ``lengths`` in groups to prefill together: longest first, a group growing
    while at most ``max_padding`` of its left-padded block is padding. A prefill is
    compute-bound, so padding costs what real tokens cost; one more forward costs little."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        if g is not None:
            longest = lengths[g[0]]
            real = sum(lengths[j] for j in g) + lengths[i]
            if real >= (1 - max_padding) * longest * (len(g) + 1):
                g.append(i)
                continue
        groups.append([i])
    return groups


class BatchDecoder:
    """One worker's live batch: ``admit`` requests, then ``step`` until ``size == 0``;
    ``harvest``: keep every request's policy states (``RequestOutput.hidden`` at ``finish``);
    ``request_steps``: keep a row per live row per step (``request_rows``, in the order of
    ``rollout.request_steps.REQUEST_STEP_COLUMNS``)."""

    def __init__(self, forward: Forward, config, rec, eos_id, pad_id, drafter=None,
                 on_finish=lambda n: None, harvest: bool = False, request_steps: bool = False):
        self.forward, self.config, self.rec = forward, config, rec
        self.harvest = harvest
        self.request_rows: list[tuple] | None = [] if request_steps else None
        self.drafter = drafter
        self.params: SamplingParams = config.sampling
        self.eos_id, self.pad_id, self.on_finish = eos_id, pad_id, on_finish
        self.draft_hidden = drafter is not None and bool(drafter.needs_hidden)
        self.reqs = []                                   # every request admitted, in order
        self.pending_hidden: list[list[torch.Tensor]] = []  # per request, for the drafter
        self.harvested: list[list[torch.Tensor]] = []       # per request, for the caller
        self.released: set[int] = set()  # requests moved to another worker (``release``)
        self.batch = DecodeBatch.empty(0, forward.device)
        self.mode = SamplingMode.of(self.params, config.spec_mode)  # keyed to rows per step
        # the compiled plain step (``rollout.compiled``), None for RolloutConfig.compile=False
        self.compiled = compiled_decode_for(forward, config.compile)
        if drafter is not None:
            drafter.begin()

    @property
    def size(self) -> int:
        return self.batch.size

    # ---- steps --------------------------------------------------------------------------
    def admit(self, reqs, moved: dict | None = None) -> None:
        """Prefill ``reqs`` and join them to the running batch: one ``prefill`` step per group
        of similar context lengths (:func:`prefill_groups`), so that short prompts are not
        padded to the longest one. A request that already has tokens is a *moved* one
        (another worker's, :meth:`release`): its prefill re-feeds its prompt and every token
        it has, and samples its next token at its own position, so that coupled draws give
        the tokens it would have had where it was; ``moved``: ``{uid: (the worker it came
        from, its harvested states there)}``; the prefill's row names that worker
        (``moved_from``)."""
        moved = moved or {}
        lengths = [len(r.prompt_ids) + len(r.tokens) for r in reqs]
        for group in prefill_groups(lengths):
            self._admit_group([reqs[i] for i in group], moved)

    def _admit_group(self, reqs, moved: dict) -> None:
        start = self.rec.begin()
        first = len(self.reqs)
        self.reqs.extend(reqs)
        self.pending_hidden.extend([] for _ in reqs)
        self.harvested.extend([] for _ in reqs)
        contexts = [list(r.prompt_ids) + list(r.tokens) for r in reqs]
        new, ids, pos = DecodeBatch.from_prompts(contexts, range(first, first + len(reqs)),
                                                 self.pad_id, self.forward.device,
                                                 self._new_cache(contexts))
        for r in reqs:
            if r.uid not in moved:  # a moved request keeps the start it had
                r.start_s = start
        (logits, hidden), fwd_s = self._timed(self.forward, ids, pos, new.mask, new.col_pos,
                                              new.cache)
        tok, lp = self.mode.at(self.reqs, new.request_ids).sample(logits[:, -1])
        states = [hidden[row, -len(c):] for row, c in enumerate(contexts)]
        self._finish_step(new, "prefill", [[t] for t in tok.tolist()],
                          [[x] for x in lp.tolist()], states, fwd_s)
        sources = {moved[r.uid][0] for r in reqs if r.uid in moved}
        if sources:
            self.rec.rows[-1]["moved_from"] = min(sources)
        for i, r in enumerate(reqs, first):
            if r.uid in moved and self.harvest:  # the states fed there, then the one new here
                self.harvested[i] = list(moved[r.uid][1]) + [h[-1:] for h in self.harvested[i]]
        if new.size == 0:
            return
        if self.drafter is not None:
            self.drafter.add_rows(new.size)
        if self.batch.size == 0:
            self.batch = new
        else:
            self.batch.concat(new)

    def step(self, plan: StepPlan, worker: int) -> StepReport:
        """One decode step as ``plan`` says; what it did, for the schedule."""
        start, rows = self.rec.begin(), self.size
        out = self.spec_step(plan) if plan.speculative else self.plain_step()
        return StepReport(worker, plan, rows, out.tokens, out.drafted, out.accepted,
                          out.draft_s, out.forward_s, self.rec.mark - start, out.drafter)

    def plain_step(self) -> StepOutcome:
        """Feed every row's last token, sample the next."""
        b = self.batch
        pos = b.append_columns(1)
        (logits, hidden), fwd_s = self._step_forward(b, pos)
        b.next_pos += 1
        tok, lp = self.mode.at(self.reqs, b.request_ids).sample(logits[:, -1])
        n = self._finish_step(b, "decode", [[t] for t in tok.tolist()],
                              [[x] for x in lp.tolist()], hidden[:, -1:].unbind(0), fwd_s)
        return StepOutcome(n, fwd_s)

    def _new_cache(self, contexts):
        """A prefill's cache: preallocated to the rollout's length for the compiled step
        (``rollout.compiled``) when it becomes the batch's; ``None`` (the default growing
        one) otherwise, and for requests joining a running batch (``concat`` copies their
        columns into the batch's buffers)."""
        if self.compiled is None or self.batch.size:
            return None
        length = min(round_up(max(map(len, contexts)) + self.config.max_new_tokens + 1, 64),
                     round_up(self.forward.context, 64))
        return StaticKVCache(length, self.config.max_batch_size or len(contexts))

    def _step_forward(self, b, pos, fed=None, tree=None):
        """The step's forward, eager or compiled (``RolloutConfig.compile``): a plain step
        (``fed`` None: each row's last token) or a verify pass of ``fed [B, 1 + n]`` (and
        a draft tree's ``tree``); ``((logits, states), seconds)``. A graph compiled first is
        a ``compile`` row of its own (:meth:`_compile`, through ``compiled.prepared``)."""
        c = self.compiled
        ids, more = (b.last_token[:, None], {}) if fed is None else (
            fed, {"logits_from": 0, "tree": tree})
        if c is None or not c.covers(b):
            return self._timed(self.forward, ids, pos, b.mask, b.col_pos, b.cache, **more)
        path = "compiled" if c.wants_compiled(b.size, ids.shape[1]) else "eager"
        if path == "compiled":
            call = prepared(c, self._compile, b.size, b, pos, fed, tree)
            start, t0 = self.rec.now(), c.timer()
            out = c.run(call)
        else:
            start, t0 = self.rec.now(), c.timer()
            out = self.forward(ids, pos, b.mask, b.col_pos, b.cache, **more)
        c.observe(b.size, ids.shape[1], path, c.timer() - t0)
        c.steps[path] += 1
        return out, self.rec.now() - start

    def _draft_compile(self) -> DraftCompile | None:
        """How a drafter runs its compiled step (``RolloutConfig.compile=True`` only): its
        cache preallocated as long as the policy's, its compiles rows of their own."""
        c, cache = self.compiled, self.batch.cache
        if c is None or c.mode is not True or not isinstance(cache, StaticKVCache):
            return None
        return DraftCompile(max(layer.length for layer in cache.layers), self._compile)

    def _compile(self, work, rows: int):
        """``work()`` (a graph's compile, ``compiled.prepared``'s) as a ``compile`` row
        (``rollout.timeline``), its value: on the wall clock the row lasts what it took; on
        the sim clock its seconds are taken off the worker's clock (wall time, partly in
        inductor's processes: no step's), so the row is empty."""
        rec = self.rec
        start = rec.now()
        out = work()
        took = rec.now() - start
        if rec.clock != "sim":
            rec.end("compile", rows, 0, took)
            return out
        prep = start - rec.mark  # the step's own work so far: its row's, not the compile's
        rec.end("compile", rows, 0, 0.0)
        row = rec.rows[-1]
        row["end_s"] = rec.mark = row["start_s"]  # empty, where the step starts
        rec.t0 = rec.read() - (rec.mark + prep)  # the clock resumes after the step's prep
        return out

    def spec_step(self, plan: StepPlan) -> StepOutcome:
        """One speculative step of ``plan``, a chain or a tree (``rollout.drafts``), over the
        batch's ``B`` rows; ``n`` fed drafts a row (``k`` for a chain):

        1. clip the depth so that every fed and emitted position fits the context (no room
           for a draft: the step is plain);
        2. build the step's input once: the sampling mode keyed to the rows, and the
           :class:`~workbench.rollout.drafts.DraftInput` (the unconsumed policy states taken
           here, for a drafter that reads them);
        3. draft with the drafter that serves the plan (``plan.serving_drafter``: the
           member of a drafter set the plan names), timed as a ``draft`` row of its own;
        4. feed ``[last_token] + drafts`` ``[B, 1 + n]`` at their positions in one policy
           forward: logits ``[B, 1 + n, V]``, states ``[B, 1 + n, H]``;
        5. the policy's verdict (``rollout.verify``, from tensors and the mode): per row the
           fed columns it keeps and the tokens it emits;
        6. rejected columns become holes, positions move past the kept ones;
        7. count drafted and accepted per request, then emit and finish as every step does.
        """
        b = self.batch
        assert plan.speculative and self.drafter is not None and b.size > 0, \
            (plan, self.drafter, b.size)
        name, drafter = serving_drafter(self.drafter, plan.drafter)
        k = min(plan.k, int((self.forward.context - 2 - b.next_pos).min()))
        if k < 1:
            return self.plain_step()
        mode = self.mode.at(self.reqs, b.request_ids)
        ctx = DraftInput(self.reqs, b.request_ids, self._take_hidden(drafter), mode,
                         self.forward.device, self.rec.wait, self._draft_compile())
        draft, draft_s = self._timed(propose, drafter, ctx, plan, k)
        # a drafter's graph compiled first is a compile row before this one (not its time)
        self.rec.end("draft", b.size, 0, min(draft_s, self.rec.now() - self.rec.mark))
        width = b.width
        fed = torch.cat([b.last_token[:, None], draft.tokens], dim=1)     # [B, 1 + n]
        pos = b.append_columns(fed.shape[1], positions=draft.positions(b.next_pos))
        (logits, hidden), fwd_s = self._step_forward(b, pos, fed, draft.visible)
        verdict = draft.verify(logits, hidden, mode)
        b.mask[:, width:] = verdict.keep.to(b.mask.dtype)
        b.trim_right()
        b.next_pos += verdict.keep.sum(1)
        for row, i in enumerate(b.request_ids):
            self.reqs[i].accepted_per_step.append(verdict.accepted[row])
            self.reqs[i].drafted += draft.size
        rows = b.size
        n = self._finish_step(b, "verify", verdict.tokens, verdict.logprobs, verdict.states,
                              fwd_s, draft.size)
        return StepOutcome(n, fwd_s, draft.size * rows, sum(verdict.accepted), draft_s, name)

    # ---- bookkeeping --------------------------------------------------------------------
    def _timed(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` and the seconds it took on the worker's clock (a wait
        charged inside it included: ``StepRecorder.wait``)."""
        start = self.rec.now()
        out = fn(*args, **kwargs)
        return out, self.rec.now() - start

    def _take_hidden(self, drafter) -> list[torch.Tensor | None] | None:
        """For a drafter that reads them (``needs_hidden``): each live row's unconsumed
        policy states ``[n_r, H]`` (``None`` for a row with none), forgotten here, since the
        drafter consumes them. ``None`` for any other drafter: a drafter set's other members
        draft from sequences, and the states wait for the member that reads them."""
        if not drafter.needs_hidden:
            return None
        ids = self.batch.request_ids
        out = [torch.cat(self.pending_hidden[i]) if self.pending_hidden[i] else None
               for i in ids]
        for i in ids:
            self.pending_hidden[i] = []
        return out

    def _keep_hidden(self, i: int, h: torch.Tensor) -> None:
        """Policy states of request ``i``'s newly fed positions, for the drafter and harvest."""
        if self.draft_hidden:
            self.pending_hidden[i].append(h)
        if self.harvest:
            self.harvested[i].append(h.cpu())

    def _emit(self, r, toks, lps) -> int:
        """Append ``toks`` to request ``r`` up to EOS or the length cap; how many it took."""
        before = len(r.tokens)
        cap = r.max_new_tokens or self.config.max_new_tokens
        for t, lp in zip(toks, lps):
            r.tokens.append(t)
            r.logprobs.append(lp)
            if t == self.eos_id:
                r.finish = "eos"
                break
            if len(r.tokens) >= cap:
                r.finish = "length"
                break
        return len(r.tokens) - before

    def _finish_step(self, b, kind, tokens, logprobs, states, fwd_s, drafted: int = 0) -> int:
        """Emit each row's new tokens (cut at EOS, the length cap or the context), keep the
        policy states of the tokens that stayed, record the step (and each row's part in it,
        ``drafted`` draft tokens fed per row, when ``request_rows`` are kept), and drop
        finished rows (from the drafter's batch too). Returns the tokens emitted over all rows."""
        finished, n_emitted = [], 0
        detail = None if self.request_rows is None else []  # (uid, tokens, accepted) per row
        room = (self.forward.context - 1 - b.next_pos).tolist()  # positions after the last
        for row, (toks, lps, h) in enumerate(zip(tokens, logprobs, states)):
            i = b.request_ids[row]
            r = self.reqs[i]
            took = self._emit(r, toks, lps)
            # a state is kept for each fed token whose successor was committed
            self._keep_hidden(i, h[:len(h) - (len(toks) - took)])
            if not r.finish and room[row] <= 0:
                r.finish = "length"
            n_emitted += took
            if kind == "verify":
                r.emitted_per_step.append(took)
            if detail is not None:
                detail.append((r.uid, took, r.accepted_per_step[-1] if kind == "verify" else 0))
            if r.finish:
                finished.append(row)
        end = self.rec.end(kind, b.size, n_emitted, fwd_s)
        if detail is not None:
            at = (self.rec.worker, self.rec.rows[-1]["step"])
            self.request_rows += [(*at, uid, kind, took, drafted, accepted)
                                  for uid, took, accepted in detail]
        for row in finished:
            self.reqs[b.request_ids[row]].end_s = end
        self.on_finish(len(finished))
        b.last_token = torch.tensor([self.reqs[i].tokens[-1] for i in b.request_ids],
                                    dtype=torch.long, device=b.mask.device)
        if finished:
            done = set(finished)
            keep = [r for r in range(b.size) if r not in done]
            b.keep_rows(keep)
            if self.drafter is not None and b is self.batch:
                self.drafter.keep_rows(keep)
        # a plain step keeping its rows adds no hole, nor do rows joining (their longest row
        # sees all its columns): a batch compact enough after the step before stays so
        if finished or kind != "decode":
            b.compact()
        return n_emitted

    def release(self, uids) -> list[tuple]:
        """Take the live requests ``uids`` out of the batch (to move them to another worker,
        whose :meth:`admit` re-prefills them): ``[(request, its harvested states here)]``.
        Between steps a row has one emitted token not fed yet, which the re-prefill feeds."""
        uids = set(uids)
        b = self.batch
        gone = [row for row, i in enumerate(b.request_ids) if self.reqs[i].uid in uids]
        out = []
        for row in gone:
            i = b.request_ids[row]
            out.append((self.reqs[i], self.harvested[i]))
            self.harvested[i], self.pending_hidden[i] = [], []
            self.released.add(i)
        if gone:
            keep = [row for row in range(b.size) if row not in set(gone)]
            b.keep_rows(keep)
            if self.drafter is not None:
                self.drafter.keep_rows(keep)
            b.compact()
        return out

    def finish(self) -> None:
        """After the last step: assemble harvested hidden states per request (not those
        released to another worker, whose decoder assembles them)."""
        if self.harvest:
            for i, r in enumerate(self.reqs):
                if i not in self.released:
                    r.hidden = torch.cat(self.harvested[i])
                    self.harvested[i] = []
