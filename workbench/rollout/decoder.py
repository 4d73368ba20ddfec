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

import numpy as np
import torch

from .batch import DecodeBatch
from .drafts import propose, serving_drafter
from .forward import Forward
from .sampling import SamplingParams, Stream, adjusted_logprobs, choose_tokens, coupled_uniforms
from .schedule import StepPlan, StepReport

__all__ = ["BatchDecoder", "DraftContext", "prefill_groups"]


class DraftContext:
    """What a drafter sees each round: the live rows' full sequences so far, the policy's
    pre-norm hidden states it has not consumed yet, and the device to draft on.

    ``sequences[r]`` is prompt + response of row ``r``; ``pending_hidden[r]`` holds one state
    per committed token the drafter has not seen, the state that predicted that token
    (``h_t`` for token ``x_{t+1}``). ``choose(logits, depth)`` picks draft tokens the way the
    verification mode needs and returns ``(tokens, adjusted logprobs)``.
    """

    def __init__(self, decoder: "BatchDecoder"):
        self.decoder = decoder
        self.device = decoder.forward.device

    def _rows(self):
        d = self.decoder
        return [d.reqs[i] for i in d.batch.request_ids]

    @property
    def sequences(self) -> list[list[int]]:
        return [r.prompt_ids + r.tokens for r in self._rows()]

    @property
    def response_lengths(self) -> list[int]:
        return [len(r.tokens) for r in self._rows()]

    @property
    def uids(self) -> list[int]:
        return [r.uid for r in self._rows()]

    @property
    def admitted(self) -> list:
        """Every request admitted to this worker's rollout so far, live or finished, in
        admission order (``RequestOutput``: ``prompt_ids``, ``tokens`` and ``finish`` grow as
        it decodes; read, never write): what a drafter that drafts from other rows reads."""
        return self.decoder.reqs

    @property
    def request_ids(self) -> list[int]:
        """Each live row's index in :attr:`admitted` (read, never write)."""
        return self.decoder.batch.request_ids

    def pending_hidden(self) -> list[torch.Tensor]:
        """Pop the unconsumed policy states of every row (a list of ``[n_r, H]`` tensors)."""
        d = self.decoder
        out = [torch.cat(d.pending_hidden[i]) if d.pending_hidden[i] else None
               for i in d.batch.request_ids]
        for i in d.batch.request_ids:
            d.pending_hidden[i] = []
        return out

    @property
    def needs_logq(self) -> bool:
        """Whether verification reads the drafter's distribution (speculative sampling)."""
        return self.decoder.mode == "speculative"

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass on the worker's clock without work (``StepRecorder.wait``)."""
        self.decoder.rec.wait(seconds)

    def choose(self, logits: torch.Tensor, depth: int):
        return self.decoder.choose_draft(logits, depth)

    def tree_logprobs(self, logits: torch.Tensor, depth: int) -> torch.Tensor:
        """What a tree's candidates at ``depth`` (0 = the first level) are ranked by
        (``rollout.tree``): the drafter's adjusted log-probabilities ``[B, f, V]``. Coupled
        mode ranks each node's coupled draw first (logprob set to 0): the policy emits it
        wherever the two distributions agree at that uniform, so the tree holds the chain."""
        d = self.decoder
        logq = adjusted_logprobs(logits, d.params)
        if d.mode != "coupled":
            return logq
        u = d.uniform_grid(d.batch, 1, Stream.TOKEN, depth)             # [B, 1]
        draw = choose_tokens(logq, d.params, np.repeat(u, logq.shape[1], axis=1))
        return logq.scatter(-1, draw[..., None], 0.0)


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
    """One worker's live batch: ``admit`` requests, then ``step`` until ``size == 0``."""

    def __init__(self, forward: Forward, config, rec, eos_id, pad_id, drafter=None,
                 on_finish=lambda n: None):
        self.forward, self.config, self.rec = forward, config, rec
        self.drafter = drafter
        self.params: SamplingParams = config.sampling
        self.eos_id, self.pad_id, self.on_finish = eos_id, pad_id, on_finish
        self.draft_hidden = drafter is not None and bool(drafter.needs_hidden)
        self.reqs = []                                   # every request admitted, in order
        self.pending_hidden: list[list[torch.Tensor]] = []  # per request, for the drafter
        self.harvest: list[list[torch.Tensor]] = []         # per request, for the caller
        self.batch = DecodeBatch.empty(0, forward.device)
        self.mode = "greedy" if self.params.greedy else config.spec_mode
        if drafter is not None:
            drafter.begin()

    @property
    def size(self) -> int:
        return self.batch.size

    # ---- sampling -----------------------------------------------------------------------
    def uniform_grid(self, batch, width: int, stream: Stream = Stream.TOKEN, offset: int = 0):
        """Coupled uniforms ``[B, width]`` at each row's response positions
        ``len(tokens) + offset + 0..width-1``."""
        rows = [self.reqs[i] for i in batch.request_ids]
        uids = [[r.uid] * width for r in rows]
        pos = [[len(r.tokens) + offset + j for j in range(width)] for r in rows]
        return coupled_uniforms(self.params.seed, uids, pos, stream)

    def sample_next(self, batch, logits: torch.Tensor):
        """Each row's next token and its adjusted logprob (coupled draw at its position)."""
        logp = adjusted_logprobs(logits, self.params)
        u = None if self.params.greedy else self.uniform_grid(batch, 1)[:, 0]
        tok = choose_tokens(logp, self.params, u)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    def choose_draft(self, logits: torch.Tensor, depth: int):
        """Draft tokens at ``depth`` (0 = the first draft) and the drafter's adjusted logprobs.

        Greedy: argmax. Coupled: the same coupled uniform the policy will use at that position,
        so a drafter close to the policy lands on the same token. Speculative: an independent
        draw (``Stream.DRAFT``) from the drafter's adjusted distribution, as Leviathan et al.
        require. The logprobs are ``None`` except in speculative mode, the only one that reads
        them.
        """
        if self.mode == "greedy":
            return logits.argmax(-1), None
        logq = adjusted_logprobs(logits, self.params)
        stream = Stream.TOKEN if self.mode == "coupled" else Stream.DRAFT
        tok = choose_tokens(logq, self.params, self.uniform_grid(self.batch, 1, stream, depth)[:, 0])
        return tok, logq if self.mode == "speculative" else None

    # ---- steps --------------------------------------------------------------------------
    def admit(self, reqs) -> None:
        """Prefill ``reqs`` and join them to the running batch: one ``prefill`` step per group
        of similar prompt lengths (:func:`prefill_groups`), so that short prompts are not
        padded to the longest one."""
        for group in prefill_groups([len(r.prompt_ids) for r in reqs]):
            self._admit_group([reqs[i] for i in group])

    def _admit_group(self, reqs) -> None:
        start = self.rec.begin()
        first = len(self.reqs)
        self.reqs.extend(reqs)
        self.pending_hidden.extend([] for _ in reqs)
        self.harvest.extend([] for _ in reqs)
        new, ids, pos = DecodeBatch.from_prompts([r.prompt_ids for r in reqs],
                                                 range(first, first + len(reqs)), self.pad_id,
                                                 self.forward.device)
        for r in reqs:
            r.start_s = start
        (logits, hidden), fwd_s = self._timed(self.forward, ids, pos, new.mask, new.col_pos,
                                              new.cache)
        tok, lp = self.sample_next(new, logits[:, -1])
        states = [hidden[row, -len(r.prompt_ids):] for row, r in enumerate(reqs)]
        self._finish_step(new, "prefill", [[t] for t in tok.tolist()],
                          [[x] for x in lp.tolist()], states, fwd_s)
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
        if plan.speculative:
            n, drafted, accepted, draft_s, fwd_s, name = self.spec_step(plan)
        else:
            (n, fwd_s), drafted, accepted, draft_s, name = self.plain_step(), 0, 0, 0.0, None
        return StepReport(worker, plan, rows, n, drafted, accepted, draft_s, fwd_s,
                          self.rec.mark - start, name)

    def plain_step(self) -> tuple[int, float]:
        """Feed every row's last token, sample the next; ``(tokens emitted, forward s)``."""
        b = self.batch
        pos = b.append_columns(1)
        (logits, hidden), fwd_s = self._timed(self.forward, b.last_token[:, None], pos,
                                              b.mask, b.col_pos, b.cache)
        b.next_pos += 1
        tok, lp = self.sample_next(b, logits[:, -1])
        n = self._finish_step(b, "decode", [[t] for t in tok.tolist()],
                              [[x] for x in lp.tolist()], hidden[:, -1:].unbind(0), fwd_s)
        return n, fwd_s

    def spec_step(self, plan: StepPlan):
        """One speculative step of ``plan``, a chain or a tree (``rollout.drafts``):

        1. clip the depth so that every fed and emitted position fits the context (no room
           for a draft: the step is plain);
        2. draft with the drafter that serves the plan (``drafts.serving_drafter``: the
           member of a drafter set the plan names), timed as a ``draft`` row of its own;
        3. feed ``[last_token] + drafts`` at their positions in one policy forward;
        4. the policy's verdict: per row the fed columns it keeps and the tokens it emits;
        5. rejected columns become holes, positions move past the kept ones;
        6. count drafted and accepted per request, then emit and finish as every step does.

        Returns ``(tokens emitted, drafted, accepted, draft s, forward s, the drafter's
        name)`` (no name for a step that ran plain).
        """
        b = self.batch
        name, drafter = serving_drafter(self.drafter, plan.drafter)
        k = min(plan.k, int((self.forward.context - 2 - b.next_pos).min()))
        if k < 1:
            n, fwd_s = self.plain_step()
            return n, 0, 0, 0.0, fwd_s, None
        draft, draft_s = self._timed(propose, drafter, DraftContext(self), plan, k)
        self.rec.end("draft", b.size, 0, draft_s)
        width = b.width
        fed = torch.cat([b.last_token[:, None], draft.tokens], dim=1)
        pos = b.append_columns(fed.shape[1], positions=draft.positions(b.next_pos))
        (logits, hidden), fwd_s = self._timed(self.forward, fed, pos, b.mask, b.col_pos,
                                              b.cache, logits_from=0, tree=draft.visible)
        verdict = draft.accept(self, fed, logits, hidden)
        b.mask[:, width:] = verdict.keep.to(b.mask.dtype)
        b.trim_right()
        b.next_pos += verdict.keep.sum(1)
        for row, i in enumerate(b.request_ids):
            self.reqs[i].accepted_per_step.append(verdict.accepted[row])
            self.reqs[i].drafted += draft.size
        rows = b.size
        n = self._finish_step(b, "verify", verdict.tokens, verdict.logprobs, verdict.states,
                              fwd_s)
        return n, draft.size * rows, sum(verdict.accepted), draft_s, fwd_s, name

    # ---- bookkeeping --------------------------------------------------------------------
    def _timed(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` and the seconds it took on the worker's clock (a wait
        charged inside it included: ``StepRecorder.wait``)."""
        start = self.rec.now()
        out = fn(*args, **kwargs)
        return out, self.rec.now() - start

    def _keep_hidden(self, i: int, h: torch.Tensor) -> None:
        """Policy states of request ``i``'s newly fed positions, for the drafter and harvest."""
        if self.draft_hidden:
            self.pending_hidden[i].append(h)
        if self.config.harvest:
            self.harvest[i].append(h.cpu())

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

    def _finish_step(self, b, kind, tokens, logprobs, states, fwd_s) -> int:
        """Emit each row's new tokens (cut at EOS, the length cap or the context), keep the
        policy states of the tokens that stayed, record the step, and drop finished rows
        (from the drafter's batch too). Returns the tokens emitted over all rows."""
        finished, n_emitted = [], 0
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
            if r.finish:
                finished.append(row)
        end = self.rec.end(kind, b.size, n_emitted, fwd_s)
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
        b.compact()
        return n_emitted

    def finish(self) -> None:
        """After the last step: assemble harvested hidden states per request."""
        if self.config.harvest:
            for i, r in enumerate(self.reqs):
                r.hidden = torch.cat(self.harvest[i])
                self.harvest[i] = []
