"""Drafting from a row's siblings: the other responses to the same prompt.

GRPO samples G responses per prompt. A sibling that finished, one that runs ahead, and that
prompt's responses in earlier RL steps are free drafts for the rest of the group, above all
for the long-tail rows that run alone at the end of a step (SPEC-RL's and RhymeRL's reuse of
earlier rollouts). Verification keeps the output exact (lossless in every mode), so how alike
the siblings are decides only the speed.

Glossary:

reference   a token sequence a row may draft from: a sibling's, or a response in memory.
            Each is held as its prompt's last ``max_ngram`` tokens, then its response, so
            that all references of one prompt share positions: position ``p`` is the same
            response offset in each (and in the row's own sequence).
sibling     another row of the same prompt (the same prompt token ids) in this worker's
            rollout: running (its committed tokens so far) or finished (its whole response).
            Only this worker's: a worker never sees what another has not produced yet
            (workers run in turn on the sim clock, but model parallel machines).
memory      the latest ``max_per_prompt`` responses of each prompt from earlier rollouts,
            given with :meth:`SiblingDrafter.remember` or
            :meth:`SiblingDrafter.remember_result`; kept across rollouts (``begin``), while
            the siblings start afresh with each worker's rollout.
match       where a row's last ``n`` tokens occur in a reference (an :class:`NGramIndex`:
            each n-gram hashed to where it ends, grown as the references grow); the drafts
            are the ``k`` tokens that follow it. The match chosen: the longest ``n``
            (``max_ngram`` down to ``min_ngram``) found in any reference; at that ``n``,
            among the ``NGramIndex.SCAN`` references added last that hold it, the
            occurrence nearest the row's own position (the aligned one first: an identical
            sibling's continuation is exactly right, and one that diverged a little is best
            followed where it stands), then the one with more tokens after it (up to ``k``),
            then a sibling of this rollout before memory, then the reference added last.
            With no match in any reference, the row's own sequence is looked up
            (:class:`~workbench.speculative.drafters.NGramDrafter`'s prompt lookup), which
            repeats the last token when nothing matches. A continuation shorter than ``k``
            is padded with its last token.
"""
from __future__ import annotations

import bisect
from collections import deque
from itertools import islice

import torch

from ..checks import check_int
from .drafters import DRAFTERS, Drafter, NGramDrafter

__all__ = ["SiblingDrafter", "NGramIndex"]


class NGramIndex:
    """Where every n-gram (``min_n <= n <= max_n``) of some growing token sequences ends.

    ``docs[d]`` is sequence ``d``; an n-gram of it that ends at position ``e >= start`` (its
    :meth:`add`) is listed in ``ends[gram][d]``, ascending. Sequences only grow:
    :meth:`extend` indexes the n-grams that end in the new tokens and touches nothing
    indexed before, so keeping the index of a growing sequence costs ``max_n - min_n + 1``
    dictionary inserts per token.
    """

    SCAN = 32  # sequences :meth:`nearest` looks at, the last added first

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.docs: list[list[int]] = []
        self.ends: dict[tuple[int, ...], dict[int, list[int]]] = {}
        self._next: list[int] = []  # per sequence: the first end not indexed yet

    def add(self, tokens, start: int = 0) -> int:
        """A new sequence ``tokens``, its n-grams ending at ``start`` or later indexed; its id."""
        self.docs.append([])
        self._next.append(start)
        self.extend(len(self.docs) - 1, tokens)
        return len(self.docs) - 1

    def extend(self, doc: int, tokens) -> None:
        """Append ``tokens`` to sequence ``doc`` and index the n-grams that end in them."""
        seq, ends = self.docs[doc], self.ends
        seq.extend(tokens)
        for e in range(max(self._next[doc], self.min_n - 1), len(seq)):
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                gram = tuple(seq[e - n + 1:e + 1])
                per_doc = ends.get(gram)
                if per_doc is None:
                    ends[gram] = {doc: [e]}
                else:
                    per_doc.setdefault(doc, []).append(e)
        self._next[doc] = max(self._next[doc], len(seq))

    def nearest(self, gram: tuple[int, ...], pos: int, k: int, skip: int | None = None):
        """The occurrence of ``gram`` to continue a sequence whose own ``gram`` ends at
        ``pos`` (the module's *match*, in this index; sequence ``skip`` left out), among the
        ``SCAN`` sequences added last that hold it (so that a group of thousands of rows
        costs what one of ``SCAN`` does): ``(distance to pos, up to k tokens after it)``, or
        ``None`` when no occurrence has a token after it."""
        best, best_rank = None, None
        for d, ends in islice(reversed(self.ends.get(gram, {}).items()), self.SCAN + 1):
            if d == skip:
                continue
            i = bisect.bisect_left(ends, pos)
            for e in ends[max(i - 2, 0):i + 1]:  # the nearest below and at or above pos
                after = self.docs[d][e + 1:e + 1 + k]  # empty only at a sequence's end
                rank = (abs(e - pos), -len(after), -d)
                if after and (best_rank is None or rank < best_rank):
                    best, best_rank = (rank[0], after), rank
        return best


@DRAFTERS.register("sibling", builtin=True)
class SiblingDrafter(Drafter):
    """Drafts each row from its siblings and from its prompt's earlier responses (module
    docstring); model-free and deterministic (``logq`` one-hot).

    Each round it reads every request the worker admitted (``DraftInput.admitted``), live
    or finished, not only the live rows: a row that finished since the last round (or while
    another member of a ``DrafterSet`` drafted) is read whole, to its last token. So it keeps
    no per-row state, and ``keep_rows``/``add_rows`` have nothing to do.

    Args:
        max_ngram, min_ngram: the lengths of the row's last tokens matched, longest first.
        max_per_prompt: responses kept in memory per prompt, the latest (memory holds every
            prompt remembered; the siblings only this rollout's).
    """

    name = "sibling"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_per_prompt: int = 16):
        self.own = NGramDrafter(max_ngram, min_ngram)  # checks the n-gram lengths
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.max_per_prompt = check_int("max_per_prompt", max_per_prompt, 1)
        self.memory: dict[tuple[int, ...], deque] = {}
        self.memory_index: dict[tuple[int, ...], NGramIndex] = {}  # built on first use
        self.begin()

    def begin(self) -> None:
        """A worker's rollout starts: no siblings yet (the memory stays)."""
        self.siblings: dict[tuple[int, ...], NGramIndex] = {}  # per prompt, this rollout's
        self.refs: list[tuple[tuple[int, ...], int, int]] = []  # per admitted request:
        # its prompt, its reference in siblings[prompt], the prompt tokens it starts with
        self.growing: set[int] = set()  # admitted requests not finished when last read

    def remember(self, prompt_ids, response_ids) -> None:
        """Keep ``response_ids`` as a response to ``prompt_ids`` for later rollouts (the
        latest ``max_per_prompt`` per prompt)."""
        key = tuple(int(t) for t in prompt_ids)
        if not key:
            raise ValueError("remember: prompt_ids is empty; accepted: the prompt's token ids")
        responses = self.memory.setdefault(key, deque(maxlen=self.max_per_prompt))
        responses.append([int(t) for t in response_ids])
        self.memory_index.pop(key, None)  # indexed again when next used

    def remember_result(self, result) -> None:
        """:meth:`remember` every response of a ``RolloutResult`` (its ``requests``: each
        request's prompt ids and response tokens)."""
        for r in result.requests:
            self.remember(r.prompt_ids, r.tokens)

    def draft(self, ctx, k):
        admitted = ctx.admitted
        self._read(admitted)
        tokens = torch.tensor([self.draft_row(i, admitted[i], k) for i in ctx.request_ids],
                              dtype=torch.long, device=ctx.device)
        return self.proposal(ctx, tokens)

    def _read(self, admitted) -> None:
        """Bring the siblings up to date with the worker's requests: new ones join, growing
        ones get their new tokens, finished ones are read a last time (their whole response)."""
        for i in range(len(self.refs), len(admitted)):
            key = tuple(admitted[i].prompt_ids)
            index = self.siblings.get(key)
            if index is None:
                index = self.siblings[key] = NGramIndex(self.min_ngram, self.max_ngram)
            tail = list(key[-self.max_ngram:])
            self.refs.append((key, index.add(tail, len(tail) - 1), len(tail)))
            self.growing.add(i)
        for i in list(self.growing):
            req, (key, doc, offset) = admitted[i], self.refs[i]
            index = self.siblings[key]
            have = len(index.docs[doc]) - offset
            if len(req.tokens) > have:
                index.extend(doc, req.tokens[have:])
            if req.finish:
                self.growing.discard(i)

    def _memory(self, key: tuple[int, ...]) -> NGramIndex | None:
        """The index of the prompt's responses in memory (built here after a change)."""
        if key not in self.memory:
            return None
        index = self.memory_index.get(key)
        if index is None:
            index = self.memory_index[key] = NGramIndex(self.min_ngram, self.max_ngram)
            tail = list(key[-self.max_ngram:])
            for response in self.memory[key]:
                index.add(tail + response, len(tail) - 1)
        return index

    def draft_row(self, i: int, req, k: int) -> list[int]:
        """``k`` drafts for admitted request ``i`` (``req``), read up to date (module
        docstring, *match*)."""
        key, doc, _ = self.refs[i]
        siblings, memory = self.siblings[key], self._memory(key)
        seq = siblings.docs[doc]
        pos = len(seq) - 1
        for n in range(min(self.max_ngram, len(seq)), self.min_ngram - 1, -1):
            gram = tuple(seq[-n:])
            hits = [(hit[0], -len(hit[1]), source, hit[1]) for source, hit in enumerate(
                (siblings.nearest(gram, pos, k, skip=doc),
                 memory.nearest(gram, pos, k) if memory is not None else None)) if hit]
            if hits:
                after = min(hits)[3]  # (distance, more tokens, siblings first) decide
                return after + [after[-1]] * (k - len(after))
        return self.own.propose(req.prompt_ids + req.tokens, k)
