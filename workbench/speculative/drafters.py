"""The built-in drafters: model-free prompt lookup (:class:`NGramDrafter`), a small LM
(:class:`LMDrafter`), an EAGLE head (:class:`EagleDrafter`), and a drafter slowed on purpose
(:class:`SlowedDrafter`, ``speculative.slowed``). The protocol they implement and the
registry of named drafters are ``speculative.drafter_protocol``'s (``Drafter``,
``DRAFTERS``), importable from here too.

Drafters with a KV cache (:class:`CachedDrafter`) keep it in a
:class:`~workbench.rollout.batch.DecodeBatch`: each round first drops the speculative tail it
fed while chaining (the last ``k - 1`` columns), then feeds every committed token it has not
seen in one ragged block, then chains ``k`` drafts (or grows a tree level by level: a level's
nodes share a position and see only their own ancestors among the speculative columns, through
the ``tree`` argument of ``rollout.forward.attention_mask``). The chain and tree loops are
written once, in :class:`CachedDrafter`; a drafter says only how it catches up, what its
logits are, and how it advances by one level. On the compiled path an EAGLE head's chain round
is one graph instead (``speculative.eagle.CompiledChain``), leaving the cache as the loop does.
"""
from __future__ import annotations

import numpy as np
import torch

from ..rollout.batch import DecodeBatch
from ..rollout.compiled import prepared
from ..rollout.forward import RopeTable, attention_mask, policy_forward
from ..rollout.sampling_mode import SamplingMode
from ..rollout.static_cache import StaticKVCache
from ..rollout.tree import DraftTree, grow_tree
from .drafter_protocol import DRAFTERS, Drafter, output_vocab_size
from .eagle import CompiledChain, CompiledDraft
from .slowed import SlowedDrafter

__all__ = ["Drafter", "DRAFTERS", "CachedDrafter", "NGramDrafter", "LMDrafter", "EagleDrafter",
           "SlowedDrafter"]


class CachedDrafter(Drafter):
    """A drafter with its own KV cache (a DecodeBatch), rows in step with the policy's batch.

    ``seen[r]`` counts what row ``r`` has consumed; ``spec_cols`` is the speculative tail fed
    while drafting, dropped at the start of the next round (the policy's verdict decides what
    of it was right, and the committed tokens are fed again).

    :meth:`draft` and :meth:`draft_tree` are one loop each, over a *carry*: what the drafter
    holds after each fed token (the small LM its logits, EAGLE its predicted state). A
    subclass implements the hooks:

    - ``_catch_up(ctx) -> carry [B, 1, *]``: open the round, feed every committed token not
      seen yet; the carry after each row's last one.
    - ``_logits(carry) -> [B, w, V]``: the drafter's logits after each carried token.
    - ``_advance(tokens [B, w], carry, pos [B, w], slot=None, tree=None) -> carry [B, w, *]``:
      feed ``tokens`` at ``pos`` (their columns already appended); a token's parent is the
      carry's last column (a chain), or column ``slot[b, j]`` (a tree level), and ``tree``
      ``[B, w, m]`` is the level's visibility of the ``m`` speculative columns fed so far.
    """

    state: DecodeBatch | None = None
    supports_trees = True

    def begin(self) -> None:
        self.state, self.seen, self.spec_cols = None, [], 0

    def keep_rows(self, rows):
        if self.state is not None:
            self.state.keep_rows(rows)
            self.seen = [self.seen[r] for r in rows]

    def add_rows(self, n: int) -> None:
        """New rows join at the bottom with nothing seen yet (no state yet: nothing to do)."""
        if self.state is None or self.state.size == 0:
            self.begin()  # the first round sizes the cache to the batch
            return
        self.state.crop_right(self.spec_cols)
        self.spec_cols = 0
        self.state.concat(DecodeBatch.empty(n, self.state.mask.device))
        self.seen = self.seen + [0] * n

    def open_round(self, rows: int, device, cache=None) -> DecodeBatch:
        """The cache for this round: created on the first round (its KV cache ``cache``
        where given: a preallocated one for a compiled step), speculative tail dropped."""
        if self.state is None:
            self.state = DecodeBatch.empty(rows, device)
            if cache is not None:
                self.state.cache = cache
            self.seen, self.spec_cols = [0] * rows, 0
        self.state.crop_right(self.spec_cols)
        return self.state

    @torch.no_grad()
    def draft(self, ctx, k):
        """A chain of ``k`` drafts per row, each fed back to draft the next (the last is not
        fed: ``k - 1`` speculative columns)."""
        carry = self._catch_up(ctx)
        st = self.state
        tokens, logqs = [], []
        for depth in range(k):
            tok, logq = ctx.choose(self._logits(carry)[:, -1], depth)
            tokens.append(tok)
            logqs.append(logq)
            if depth < k - 1:
                pos = st.append_columns(1)
                carry = self._advance(tok[:, None], carry, pos)
                st.next_pos += 1
        self.spec_cols = k - 1
        st.compact()
        return self.stacked(tokens, logqs)

    @torch.no_grad()
    def draft_tree(self, ctx, k, branch) -> DraftTree:
        """A tree ``k`` deep, ``branch`` nodes per level (``rollout.tree.grow_tree``). Each
        level's nodes are appended to the cache at one position (``next_pos + depth``) and
        fed together; like a chain's tail, those columns are dropped at the next round."""
        carry = self._catch_up(ctx)
        st = self.state
        base, fed = st.next_pos.clone(), 0

        def expand(levels):
            nonlocal carry, fed
            tokens, slot, _ = levels[-1]
            w = tokens.shape[1]
            pos = st.append_columns(w, positions=(base + len(levels) - 1)[:, None].expand(-1, w))
            st.next_pos += w  # as a chain's tail counts, so that crop_right undoes it
            fed += w
            visible = DraftTree.from_levels(levels).ancestors()[:, -w:, 1:]
            carry = self._advance(tokens, carry, pos, slot, visible)
            return self._logits(carry)

        tree = grow_tree(ctx.tree_logprobs, self._logits(carry)[:, -1], k, branch, expand)
        self.spec_cols = fed
        st.compact()
        return tree


@DRAFTERS.register("ngram", builtin=True)
class NGramDrafter(Drafter):
    """Model-free prompt lookup: continue the latest earlier match of the sequence's last
    ``n``-gram (``n`` from ``max_ngram`` down to ``min_ngram``); repeat the last token when
    nothing matches."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, seq: list[int], k: int) -> list[int]:
        arr = np.asarray(seq)
        for n in range(min(self.max_ngram, len(arr) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                start = hits[-1] + n
                cont = arr[start:start + k].tolist()
                return cont + [cont[-1]] * (k - len(cont))
        return [int(arr[-1])] * k

    def draft(self, ctx, k):
        tokens = torch.tensor([self.propose(s, k) for s in ctx.sequences], dtype=torch.long,
                              device=ctx.device)
        return self.proposal(ctx, tokens)


class LMDrafter(CachedDrafter):
    """Any small HF causal LM that shares the policy's tokenizer, with its own KV cache."""

    name = "small_lm"

    def __init__(self, model, tokenizer=None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        # the lean path (rollout.forward) for the Llama family, HF's forward for the rest
        self.forward = policy_forward(model)
        self.begin()

    @property
    def module(self):
        return self.model

    def check_compatible(self, policy, tokenizer) -> None:
        super().check_compatible(policy, tokenizer)
        if self.model is policy:
            raise ValueError("the policy cannot serve as its own drafter; pass a smaller model")
        mine = output_vocab_size(self.model)
        if mine != self.vocab_size:
            raise ValueError(f"drafter vocabulary size {mine} does not match the policy's "
                             f"{self.vocab_size}; the drafter must share the policy's tokenizer")
        if self.tokenizer is not None and self.tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError("drafter tokenizer does not match the policy's tokenizer (their "
                             "vocabularies differ); the drafter must share the policy's tokenizer")

    def _catch_up(self, ctx) -> torch.Tensor:
        """Feed every committed token not seen yet; the logits after each row's last ``[B, 1, V]``."""
        seqs = ctx.sequences
        st = self.open_round(len(seqs), ctx.device)
        ids, pos = st.append_ragged([s[n:] for s, n in zip(seqs, self.seen)], 0)
        self.seen = [len(s) for s in seqs]
        return self.forward(ids, pos, st.mask, st.col_pos, st.cache)[0]

    def _logits(self, carry: torch.Tensor) -> torch.Tensor:
        return carry  # the small LM carries its logits

    def _advance(self, tokens, carry, pos, slot=None, tree=None) -> torch.Tensor:
        """The LM's logits after ``tokens``; their parents are in its cache already."""
        st = self.state
        return self.forward(tokens, pos, st.mask, st.col_pos, st.cache, logits_from=0,
                            tree=tree)[0]


class EagleDrafter(CachedDrafter):
    """Drafts with an :class:`~workbench.speculative.eagle.EagleHead` on top of the policy's own embedding, norm and head."""

    name = "eagle"
    needs_hidden = True
    # A catch-up of at most this many pairs a row (a round's accepted drafts and the bonus
    # token, for k up to 7) runs compiled, a graph per width like a verify pass's; a longer
    # one (a row's prompt, when it joins) eagerly: it happens once per request.
    COMPILED_CATCH_UP = 8

    def __init__(self, head, policy=None, whole_chain: bool = True):
        self.head = head.eval()
        self.compiled = None  # its compiled draft step (speculative.eagle.CompiledDraft)
        # compiled chain rounds as one graph each (speculative.eagle.CompiledChain), per
        # (mode kind, sampling params); False: a graph call per draft step
        self.whole_chain, self.chains = whole_chain, {}
        self.begin()
        if policy is not None:
            self.bind(policy)

    def begin(self) -> None:
        super().begin()
        self.compile = None  # the round's DraftCompile (None: eager drafts)

    @property
    def module(self):
        return self.head

    def bind(self, policy) -> None:
        """Use ``policy``'s frozen embedding, final norm, rotary embedding and LM head."""
        self.head.config.check(policy.config)
        decoder = policy.get_decoder()
        self.embed, self.norm = policy.get_input_embeddings(), decoder.norm
        self.rope, self.lm_head = RopeTable(decoder.rotary_emb), policy.get_output_embeddings()
        if self.compiled is None or self.compiled.embed is not self.embed:  # another policy
            self.compiled = CompiledDraft(None, True, head=self.head, embed=self.embed,
                                          rope=self.rope)
            self.chains = {}

    def check_compatible(self, policy, tokenizer) -> None:
        super().check_compatible(policy, tokenizer)
        self.bind(policy)

    def _step(self, ids, hidden, pos, tree=None):
        """The head on pairs ``(ids, hidden)`` at ``pos``: predicted states ``[B, L, H]``."""
        st = self.state
        emb = self.embed(ids)
        mask = attention_mask(st.mask, st.col_pos, pos, None, emb.dtype, allow_none=True,
                              tree=tree)
        return self.head.step(emb, hidden, mask, self.rope(emb, pos), st.cache)

    @torch.no_grad()
    def draft(self, ctx, k):
        """A chain of ``k`` drafts a row: on the compiled path, the catch-up and every draft
        in one graph call (:meth:`_chain_graph`, ``speculative.eagle.CompiledChain``), the
        cache's columns as :meth:`CachedDrafter.draft` leaves them; else that loop."""
        chain = self._chain_graph(ctx, k)
        if chain is None:
            return super().draft(ctx, k)
        ids, hidden, pos = self._pending(ctx, k + 1)  # [B, w], [B, w, H], [B, w]; w = k + 1
        st = self.state
        if k > 1:  # the chain's columns: drafts 0..k-2 are fed at next_pos + 0..k-2
            pos = torch.cat([pos, st.append_columns(k - 1)], dim=1)  # [B, w + k - 1]
            st.next_pos += k - 1
            ids = torch.cat([ids, ids.new_zeros((ids.shape[0], k - 1))], dim=1)
        u = ctx.mode.draft_uniforms(np.arange(k))  # [B, k] float64, None when greedy
        u = (torch.zeros((ids.shape[0], k), dtype=torch.float64) if u is None
             else torch.from_numpy(u)).to(ctx.device)
        call = prepared(chain, self.compile.compile_row, st.size, st, pos, ids, None,
                        data=(hidden, u))
        chain.steps["compiled"] += 1
        out = chain.run(call)  # (drafts [B, k],) or (drafts, logq [B, k, V])
        self.spec_cols = k - 1
        st.compact()
        return out[0], out[1] if len(out) > 1 else None

    def _chain_graph(self, ctx, k: int):
        """The compiled chain graph for this round (made once per mode kind and sampling
        params), or ``None`` where the round drafts step by step: not compiling, a head the
        lean forward does not run, the first round (its cache not filled yet), or a row whose
        catch-up is longer than a round's ``k + 1`` (a row that joined, or that decoded
        plain steps since). The catch-up is padded to ``k + 1`` pairs with holes, so a graph
        serves every round of a row bucket and ``k``."""
        if not (self.whole_chain and ctx.compile is not None and self.head.lean
                and self.state is not None and self.compiled.covers(self.state)):
            return None
        if max(len(s) - 1 - n for s, n in zip(ctx.sequences, self.seen)) > k + 1:
            return None
        mode = SamplingMode(ctx.mode.kind, ctx.mode.params)  # rowless: what a graph closes over
        if mode not in self.chains:
            c = self.compiled
            self.chains[mode] = CompiledChain(
                None, True, c.col_step, c.dynamic_cols, backend=c.backend,
                step_wrapper=c.step_wrapper, cpp_wrapper=c.cpp_wrapper, direct=c.direct,
                few_rows=c.few_rows, head=self.head, embed=self.embed, rope=self.rope,
                sampling=mode, norm=self.norm, lm_head=self.lm_head)
        return self.chains[mode]

    def _catch_up(self, ctx) -> torch.Tensor:
        """Feed every committed pair not seen yet; the state predicted after each row's last
        ``[B, 1, H]`` (whose logits give the first draft)."""
        ids, hidden, pos = self._pending(ctx)
        if self.compile is not None and ids.shape[1] <= self.COMPILED_CATCH_UP:
            return self._compiled_step(ids, hidden, pos)[:, -1:]
        return self._step(ids, hidden, pos)[:, -1:]

    def _pending(self, ctx, width: int = 0):
        """Open the round and append every committed pair not fed yet as one ragged block, at
        least ``width`` columns wide: its tokens ``[B, w]`` (right-aligned, holes before
        them), their parents' states ``[B, w, H]`` and their positions ``[B, w]``."""
        seqs, pending = ctx.sequences, ctx.hidden
        self.compile = ctx.compile if self.head.lean else None
        cache = None if self.compile is None else StaticKVCache(self.compile.length, len(seqs))
        st = self.open_round(len(seqs), ctx.device, cache)
        # pairs (h_t, x_{t+1}) not yet fed: tokens after the first `seen + 1`
        new = [s[n + 1:] for s, n in zip(seqs, self.seen)]
        for r, (toks, h) in enumerate(zip(new, pending)):
            if h is None or len(toks) != h.shape[0]:
                raise RuntimeError(f"row {r}: {len(toks)} new tokens but "
                                   f"{0 if h is None else h.shape[0]} policy states")
        ids, pos = st.append_ragged(new, 0, width)
        hidden = torch.zeros((*ids.shape, pending[0].shape[-1]), dtype=pending[0].dtype,
                             device=ids.device)
        for r, h in enumerate(pending):
            hidden[r, ids.shape[1] - h.shape[0]:] = h
        self.seen = [len(s) - 1 for s in seqs]
        return ids, hidden, pos

    def _logits(self, feat: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(feat))

    def _advance(self, tokens, carry, pos, slot=None, tree=None) -> torch.Tensor:
        """The states predicted after ``tokens``, each paired with its parent's predicted
        state (the carry's last column, or column ``slot`` of a tree's frontier)."""
        parent = carry if slot is None else carry.gather(
            1, slot[..., None].expand(-1, -1, carry.shape[-1]))
        if self.compile is None or self.state.size == 0:
            return self._step(tokens, parent, pos, tree)
        return self._compiled_step(tokens, parent, pos, tree)

    def _compiled_step(self, tokens, parent, pos, tree=None) -> torch.Tensor:
        """:meth:`_step` compiled (:attr:`compiled`, made at :meth:`bind`: set its
        ``backend`` there) where its cache is the preallocated one; a graph compiled first is
        the decoder's ``compile`` row."""
        c, st = self.compiled, self.state
        if not c.covers(st):
            return self._step(tokens, parent, pos, tree)
        call = prepared(c, self.compile.compile_row, st.size, st, pos, tokens, tree,
                        data=(parent,))
        c.steps["compiled"] += 1
        return c.run(call)[0]
