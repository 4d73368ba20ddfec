"""One wave of requests decoded together on one worker, one engine call (step) at a time.

Between steps every live row has exactly one token that it emitted but has not fed yet
(``batch.last_token``). A *plain* step feeds it and samples the next token; a *speculative*
step drafts ``k`` tokens, feeds ``[last_token, drafts]`` to the policy in one forward, keeps
each row's accepted prefix plus one token of the policy's own, and turns the rejected cache
columns into holes. Both end the same way (emit, finish, drop finished rows), so an adaptive
engine can switch between them at any step of the same batch.
"""
from __future__ import annotations

import time

import torch

from .batch import DecodeBatch, PolicyForward
from .sampling import SamplingParams, adjusted_logprobs, choose_tokens, coupled_uniforms

__all__ = ["WaveDecoder", "DraftContext"]


def _timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


class DraftContext:
    """What a drafter sees each round: the live rows' full sequences so far, and the policy's
    pre-norm hidden states it has not consumed yet.

    ``sequences[r]`` is prompt + response of row ``r``; ``pending_hidden[r]`` holds one state
    per committed token the drafter has not seen, the state that predicted that token
    (``h_t`` for token ``x_{t+1}``). ``choose(logits, depth)`` picks draft tokens the way the
    verification mode needs and returns ``(tokens, adjusted logprobs)``.
    """

    def __init__(self, decoder: "WaveDecoder"):
        self.decoder = decoder

    @property
    def sequences(self) -> list[list[int]]:
        d = self.decoder
        return [d.reqs[i].prompt_ids + d.reqs[i].tokens for i in d.batch.request_ids]

    @property
    def response_lengths(self) -> list[int]:
        d = self.decoder
        return [len(d.reqs[i].tokens) for i in d.batch.request_ids]

    @property
    def uids(self) -> list[int]:
        d = self.decoder
        return [d.reqs[i].uid for i in d.batch.request_ids]

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

    def choose(self, logits: torch.Tensor, depth: int):
        return self.decoder.choose_draft(logits, depth)


class WaveDecoder:
    """Decode ``reqs`` as one batch; the engine calls ``prefill`` then steps until ``done``."""

    def __init__(self, policy: PolicyForward, reqs, config, rec, eos_id, pad_id,
                 on_finish=lambda n: None, drafter=None):
        self.policy, self.reqs, self.config, self.rec = policy, reqs, config, rec
        self.drafter = drafter
        self.params: SamplingParams = config.sampling
        self.eos_id, self.pad_id, self.on_finish = eos_id, pad_id, on_finish
        self.draft_hidden = bool(getattr(drafter, "needs_hidden", False))
        self.pending_hidden: list[list[torch.Tensor]] = [[] for _ in reqs]  # for the drafter
        self.harvest: list[list[torch.Tensor]] = [[] for _ in reqs]         # for the caller
        self.batch: DecodeBatch | None = None
        self.mode = "greedy" if self.params.greedy else config.spec_mode

    @property
    def done(self) -> bool:
        return self.batch is not None and self.batch.size == 0

    # ---- sampling -----------------------------------------------------------------------
    def _uniform_grid(self, width: int, stream: int = 0, offset: int = 0):
        """Coupled uniforms ``[B, width]`` at each row's response positions
        ``len(tokens) + offset + 0..width-1``."""
        rows = [self.reqs[i] for i in self.batch.request_ids]
        uids = [[r.uid] * width for r in rows]
        pos = [[len(r.tokens) + offset + j for j in range(width)] for r in rows]
        return coupled_uniforms(self.params.seed, uids, pos, stream)

    def _uniforms(self, offset: int, stream: int = 0):
        """Coupled uniforms ``[B]`` at each row's response position ``len(tokens) + offset``."""
        return self._uniform_grid(1, stream, offset)[:, 0]

    def sample_next(self, logits: torch.Tensor):
        """Each row's next token and its adjusted logprob (coupled draw at its position)."""
        logp = adjusted_logprobs(logits, self.params)
        u = None if self.params.greedy else self._uniforms(0)
        tok = choose_tokens(logp, self.params, u)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    def choose_draft(self, logits: torch.Tensor, depth: int):
        """Draft tokens at ``depth`` (0 = the first draft) and the drafter's adjusted logprobs.

        Greedy: argmax. Coupled: the same coupled uniform the policy will use at that position,
        so a drafter close to the policy lands on the same token. Speculative: an independent
        draw (stream 2) from the drafter's adjusted distribution, as Leviathan et al. require.
        The logprobs are ``None`` except in speculative mode, the only one that reads them.
        """
        if self.mode == "greedy":
            return logits.argmax(-1), None
        logq = adjusted_logprobs(logits, self.params)
        if self.mode == "coupled":
            return choose_tokens(logq, self.params, self._uniforms(depth, 0)), None
        return choose_tokens(logq, self.params, self._uniforms(depth, 2)), logq

    # ---- steps --------------------------------------------------------------------------
    def prefill(self) -> None:
        start = self.rec.begin()
        batch, ids, pos = DecodeBatch.from_prompts([r.prompt_ids for r in self.reqs],
                                                   range(len(self.reqs)), self.pad_id,
                                                   self.policy.device)
        self.batch = batch
        for r in self.reqs:
            r.start_s = start
        (logits, hidden), fwd_s = _timed(self.policy, ids, batch.mask, pos, batch.cache)
        for row, r in enumerate(self.reqs):
            self._keep_hidden(row, hidden[row, -len(r.prompt_ids):])
        tok, lp = self.sample_next(logits[:, -1])
        self._finish_step("prefill", [[t] for t in tok.tolist()], [[x] for x in lp.tolist()],
                          fwd_s)

    def plain_step(self) -> None:
        b = self.batch
        b.append_columns(1)
        (logits, hidden), fwd_s = _timed(self.policy, b.last_token[:, None], b.mask,
                                         b.next_pos[:, None], b.cache)
        b.next_pos += 1
        for row, i in enumerate(b.request_ids):
            self._keep_hidden(i, hidden[row, -1:])
        tok, lp = self.sample_next(logits[:, -1])
        self._finish_step("decode", [[t] for t in tok.tolist()], [[x] for x in lp.tolist()],
                          fwd_s)

    def spec_step(self, k: int) -> None:
        """Draft ``k`` tokens per row, verify them in one policy forward, accept per row.

        ``k`` shrinks near the context's end so that every fed and emitted position fits; a row
        with no room for a draft gets a plain step instead.
        """
        from .verify import accept_by_target, speculative_accept
        b = self.batch
        k = min(k, int((self.policy.context - 2 - b.next_pos).min()))
        if k < 1:
            return self.plain_step()
        (draft, logq), draft_s = _timed(self.drafter.draft, DraftContext(self), k)
        self.rec.end("draft", b.size, 0, draft_s)
        width = b.mask.shape[1]
        b.append_columns(k + 1)
        fed = torch.cat([b.last_token[:, None], draft], dim=1)
        pos = b.next_pos[:, None] + torch.arange(k + 1, device=fed.device)
        (logits, hidden), fwd_s = _timed(self.policy, fed, b.mask, pos, b.cache, logits_from=0)
        logp = adjusted_logprobs(logits, self.params)                    # [B, k+1, V]
        if self.mode == "speculative":
            accepted, last = speculative_accept(draft, logp, logq, self._uniform_grid(k, 1),
                                                self._uniform_grid(k + 1, 0))
        else:
            if self.mode == "greedy":
                target = logp.argmax(-1)
            else:
                target = choose_tokens(logp, self.params, self._uniform_grid(k + 1, 0))
            accepted = accept_by_target(draft, target)
            last = target.gather(1, accepted[:, None]).squeeze(1)
        emitted = torch.cat([draft, last[:, None]], dim=1)
        emitted.scatter_(1, accepted[:, None], last[:, None])             # drafts[:n] + last
        emitted_lp = logp.gather(-1, emitted[..., None]).squeeze(-1)
        # rejected drafts' columns become holes; the fed last_token and accepted drafts stay
        cols = torch.arange(k + 1, device=fed.device)[None, :]
        b.mask[:, width:] = (cols <= accepted[:, None]).to(b.mask.dtype)
        b.trim_right()
        b.next_pos += accepted + 1
        acc, em, em_lp = accepted.tolist(), emitted.tolist(), emitted_lp.tolist()
        for row, i in enumerate(b.request_ids):
            self._keep_hidden(i, hidden[row, :acc[row] + 1])
        for row, i in enumerate(b.request_ids):
            self.reqs[i].accepted_per_step.append(acc[row])
            self.reqs[i].drafted += k
        self._finish_step("verify", [em[r][:acc[r] + 1] for r in range(b.size)],
                          [em_lp[r][:acc[r] + 1] for r in range(b.size)], fwd_s)

    # ---- bookkeeping --------------------------------------------------------------------
    def _keep_hidden(self, i: int, h: torch.Tensor) -> None:
        """Policy states of request ``i``'s newly fed positions, for the drafter and harvest."""
        if self.draft_hidden:
            self.pending_hidden[i].append(h)
        if self.config.harvest:
            self.harvest[i].append(h.cpu())

    def _finish_step(self, kind, tokens, logprobs, fwd_s) -> None:
        """Emit each row's new tokens (cut at EOS, the length cap or the context), record the
        step, and drop the rows that finished (from the drafter's batch too)."""
        b, cfg = self.batch, self.config
        finished, n_emitted = [], 0
        room = (self.policy.context - 1 - b.next_pos).tolist()  # positions after the last token
        for row, (toks, lps) in enumerate(zip(tokens, logprobs)):
            r = self.reqs[b.request_ids[row]]
            before = len(r.tokens)
            for t, lp in zip(toks, lps):
                r.tokens.append(t)
                r.logprobs.append(lp)
                if t == self.eos_id:
                    r.finish = "eos"
                    break
                if len(r.tokens) >= cfg.max_new_tokens:
                    r.finish = "length"
                    break
            if not r.finish and room[row] <= 0:
                r.finish = "length"
            n_emitted += len(r.tokens) - before
            if kind == "verify":
                r.emitted_per_step.append(len(r.tokens) - before)
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
            if self.drafter is not None:
                self.drafter.keep_rows(keep)
        b.compact()

    def finish(self) -> None:
        """After the last step: assemble harvested hidden states per request."""
        if self.config.harvest:
            for i, r in enumerate(self.reqs):
                r.hidden = torch.cat(self.harvest[i])
                self.harvest[i] = []
