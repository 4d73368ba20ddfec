"""A suffix-tree drafter over a prompt's rollout history, with DAS's length-aware budget.

DAS (distribution-aware speculative decoding, MLSys 2026) and SuffixDecoding (arXiv
2411.04975) draft without a model: RL revisits the same prompts every epoch and samples G
responses to each, so what a prompt's earlier and sibling responses said next after the
row's latest tokens is a cheap, often right, guess, above all deep into the long responses
that set a step's makespan. Verification keeps the output exact (lossless in every mode):
how alike the responses are decides only the speed. Beside ``sibling`` (the nearest n-gram
occurrence in one reference) this drafter pools every reference of a prompt in one counted
structure and drafts the *most frequent* continuation, as a chain or as a tree.

Glossary (the trie, and its *match*, *chain* and *tree*: ``speculative.suffix_trie``):

reference   a token sequence the trie holds: the prompt itself (once), then each response to
            it: the prompt's responses from earlier rollouts (*memory*, the latest
            ``max_per_prompt``, given with :meth:`SuffixDrafter.remember` or
            :meth:`SuffixDrafter.remember_result`) and this rollout's requests of the same
            prompt (*siblings*, the row itself among them), each read as it grows. A
            response continues the prompt's suffixes, so substrings across the boundary are
            there while the prompt is counted once.
budget      DAS's length-aware draft budget (:func:`length_aware_budget`): per row, ``k``
            grows from ``k_min`` towards ``k_max`` with the row's response length and its
            recent acceptance; a step drafts the largest of its rows' budgets (the rows share
            one ``k``), so a long-tail row running alone at the end of a step gets long
            drafts while a full batch of fresh rows drafts little. The decoding arm
            ``suffix:k_max=K[,b=B,n=N]`` (``speculative.arms``) drafts with it, so the
            bandit chooses among budgets by their ``k_max``; a plain ``chain:k=K`` or
            ``tree:...`` plan with this drafter drafts a fixed ``k`` as any drafter does.
acceptance  per request, an exponential average (weight ``decay`` on the past, prior 1) of
            the share of its last draft's depth that the policy kept: read from the tokens
            it committed after that draft (a kept draft equals the committed token, and the
            policy's token at the first rejection never equals the draft there, in every
            mode, so the longest agreeing path is exactly what was accepted).

Across workers: a worker's tries hold its own rollout's requests and the memory. On the
local backend the workers run one after another and on Ray side by side; either way a
worker sees another worker's responses only once they are in memory (``remember_result``
after a step, as the sibling drafter's ``SiblingMemory`` does in ``rl.staleness``); nothing
travels between workers during a rollout.
"""
from __future__ import annotations

import math
from collections import deque

import torch

from ..checks import check_fraction, check_int
from ..rollout.drafts import ChainDraft, TreeDraft
from ..rollout.tree import DraftTree
from .drafter_protocol import DRAFTERS, Drafter
from .suffix_trie import SuffixTrie

__all__ = ["SuffixDrafter", "SuffixTrie", "length_aware_budget"]

def length_aware_budget(position: int, acceptance: float, k_min: int, k_max: int,
                        half_length: int) -> int:
    """One row's draft budget: ``k_min + round((k_max - k_min) * w * acceptance)`` with the
    length weight ``w = position / (position + half_length)``.

    ``position`` is the row's response length so far, ``acceptance`` in [0, 1] its recent
    share of drafts kept. A fresh row drafts ``k_min``; a row ``half_length`` tokens in whose
    drafts are all kept drafts half-way to ``k_max``, and the budget approaches ``k_max`` as
    the response grows (DAS: the long responses that set the makespan get aggressive
    budgets); drafts the policy rejects pull it back down, since deeper drafts of a guesser
    that is wrong cost verification and buy nothing.
    """
    position = check_int("position (response tokens so far)", position, 0)
    acceptance = check_fraction("acceptance (share of drafts kept)", acceptance)
    k_min = check_int("k_min", k_min, 1)
    k_max = check_int(f"k_max (>= k_min = {k_min})", k_max, k_min)
    half_length = check_int("half_length", half_length, 1)
    weight = position / (position + half_length)
    return k_min + math.floor((k_max - k_min) * weight * acceptance + 0.5)


@DRAFTERS.register("suffix", builtin=True)
class SuffixDrafter(Drafter):
    """Drafts each row from the counted suffixes of its prompt's references (module
    docstring): chains of the most frequent continuation, or trees scored by frequency;
    model-free and deterministic (``logq`` one-hot).

    Each round it reads every request the worker admitted (``DraftInput.admitted``), live or
    finished, as the sibling drafter does, so its state is per admitted request and
    ``keep_rows``/``add_rows`` have nothing to do.

    Args:
        max_depth: the longest substring the tries keep (the longest context matched is one
            token shorter); each committed token costs up to ``max_depth`` dict updates.
        max_per_prompt: responses kept in memory per prompt, the latest (DAS's sliding
            window over the rollout history).
        k_min, half_length, decay: the budget (:func:`length_aware_budget`): the fewest
            drafts a budgeted step drafts, the response length at which a row whose drafts
            are kept reaches half-way to ``k_max``, and the weight of the past in the
            acceptance average.
    """

    name = "suffix"
    supports_trees = True

    def __init__(self, max_depth: int = 16, max_per_prompt: int = 16, k_min: int = 1,
                 half_length: int = 64, decay: float = 0.5):
        self.max_depth = check_int("max_depth (the longest substring kept)", max_depth, 2)
        self.max_per_prompt = check_int("max_per_prompt", max_per_prompt, 1)
        self.k_min = check_int("k_min", k_min, 1)
        self.half_length = check_int("half_length", half_length, 1)
        self.decay = check_fraction("decay (the weight of past acceptance)", decay,
                                    high_open=True)
        self.memory: dict[tuple[int, ...], deque] = {}
        self.begin()

    # ---- memory and state --------------------------------------------------------------
    def begin(self) -> None:
        """A worker's rollout starts: no siblings, no tries (rebuilt from memory on first
        use); the memory stays."""
        self.tries: dict[tuple[int, ...], tuple[SuffixTrie, list[int]]] = {}  # per prompt:
        # its trie and the prompt's active nodes, which each of its responses continues
        self.refs: list[list] = []  # per admitted request: [prompt, active nodes, tokens read]
        self.growing: set[int] = set()  # admitted requests not finished when last read
        self.pending: dict[int, tuple[int, list[tuple[int, int]]]] = {}  # per request: its
        # response length at its last draft, and that draft's nodes (token, parent; -1 root)
        self.acceptance: dict[int, float] = {}

    def remember(self, prompt_ids, response_ids) -> None:
        """Keep ``response_ids`` as a response to ``prompt_ids`` for later rollouts (the
        latest ``max_per_prompt`` per prompt); a trie built already keeps what it had."""
        key = tuple(int(t) for t in prompt_ids)
        if not key:
            raise ValueError("remember: prompt_ids is empty; accepted: the prompt's token ids")
        responses = self.memory.setdefault(key, deque(maxlen=self.max_per_prompt))
        responses.append([int(t) for t in response_ids])

    def remember_result(self, result) -> None:
        """:meth:`remember` every response of a ``RolloutResult`` (its ``requests``)."""
        for r in result.requests:
            self.remember(r.prompt_ids, r.tokens)

    def trie(self, prompt_ids) -> SuffixTrie:
        """The trie of a prompt (built here on first use: the prompt, then its memory)."""
        return self._prompt(tuple(prompt_ids))[0]

    def _prompt(self, key: tuple[int, ...]) -> tuple[SuffixTrie, list[int]]:
        entry = self.tries.get(key)
        if entry is None:
            trie = SuffixTrie(self.max_depth)
            active = trie.add(key)
            for response in self.memory.get(key, ()):
                trie.extend(active, response)
            entry = self.tries[key] = (trie, active)
        return entry

    def _read(self, admitted) -> None:
        """Bring the tries up to date with the worker's requests: new ones join, growing ones
        get their new tokens (and score the draft they answered), finished ones are read a
        last time."""
        for i in range(len(self.refs), len(admitted)):
            key = tuple(admitted[i].prompt_ids)
            self.refs.append([key, self._prompt(key)[1], 0])
            self.growing.add(i)
        for i in list(self.growing):
            req, ref = admitted[i], self.refs[i]
            if len(req.tokens) > ref[2]:
                self._score(i, req.tokens)
                ref[1] = self.tries[ref[0]][0].extend(ref[1], req.tokens[ref[2]:])
                ref[2] = len(req.tokens)
            if req.finish:
                self.growing.discard(i)

    def _score(self, i: int, tokens: list[int]) -> None:
        """Fold request ``i``'s last draft, answered by the committed ``tokens``, into its
        acceptance (the deepest drafted node whose path the tokens follow: module docstring)."""
        if i not in self.pending:
            return
        start, nodes = self.pending.pop(i)
        kept = [0] * (len(nodes) + 1)  # per fed index: depth of an agreeing path, else 0
        ok = [True] + [False] * len(nodes)
        for j, (tok, parent) in enumerate(nodes):  # parents come first
            d = kept[parent + 1] + 1
            if ok[parent + 1] and start + d - 1 < len(tokens) and tokens[start + d - 1] == tok:
                ok[j + 1], kept[j + 1] = True, d
        depth = max(self._depths(nodes))
        rate = max(kept) / depth
        self.acceptance[i] = self.decay * self.acceptance.get(i, 1.0) + (1 - self.decay) * rate

    @staticmethod
    def _depths(nodes: list[tuple[int, int]]) -> list[int]:
        depths: list[int] = []
        for _, parent in nodes:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    # ---- drafting ----------------------------------------------------------------------
    def _contexts(self, ctx) -> list[list[int]]:
        """Each live row's last ``max_depth - 1`` tokens, the tries read up to date."""
        self._read(ctx.admitted)
        tail = self.max_depth - 1
        return [(r.prompt_ids + r.tokens)[-tail:] for r in ctx.rows]

    def _chains(self, ctx, k: int) -> tuple[list[list[int]], list[int]]:
        """Per row ``k`` drafts (padded with the last one) and how many were found."""
        rows, found = [], []
        for req, context in zip(ctx.rows, self._contexts(ctx)):
            out = self.tries[tuple(req.prompt_ids)][0].chain(context, k)
            found.append(len(out))
            pad = out[-1] if out else context[-1]
            rows.append(out + [pad] * (k - len(out)))
        return rows, found

    def _remember_drafts(self, ctx, nodes_per_row) -> None:
        for i, n, nodes in zip(ctx.request_ids, ctx.response_lengths, nodes_per_row):
            self.pending[i] = (n, nodes)

    def draft(self, ctx, k):
        """``k`` drafts per row (``suffix_trie``, *chain*): ``(tokens [B, k], logq or None)``."""
        rows, _ = self._chains(ctx, k)
        return self._chain_out(ctx, rows)

    def _chain_out(self, ctx, rows: list[list[int]]):
        self._remember_drafts(ctx, [[(t, j - 1) for j, t in enumerate(r)] for r in rows])
        tokens = torch.tensor(rows, dtype=torch.long, device=ctx.device)
        return self.proposal(ctx, tokens)

    def draft_tree(self, ctx, k, branch) -> DraftTree:
        """A tree ``k`` deep, ``branch`` nodes per level, scored by frequency
        (``suffix_trie``, *tree*): ``tokens``/``parents``/``scores`` ``[B, branch * k]``."""
        k = check_int("a tree's k", k, 1)
        branch = check_int("a tree's branch", branch, 1)
        tree, _ = self._tree(ctx, k, branch)
        return tree

    def _tree(self, ctx, k: int, branch: int) -> tuple[DraftTree, list[int]]:
        """The tree, and per row the depth of its deepest counted (not filler) node."""
        per_row = [self.tries[tuple(req.prompt_ids)][0].levels(context, k, branch)
                   for req, context in zip(ctx.rows, self._contexts(ctx))]
        levels = []
        for d in range(k):
            tok, slot, score = zip(*[row[0][d] for row in per_row])
            levels.append((torch.tensor(tok, dtype=torch.long, device=ctx.device),
                           torch.tensor(slot, dtype=torch.long, device=ctx.device),
                           torch.tensor(score, dtype=torch.float64, device=ctx.device)))
        tree = DraftTree.from_levels(levels)
        self._remember_tree(ctx, tree)
        return tree, [row[1] for row in per_row]

    def _remember_tree(self, ctx, tree: DraftTree) -> None:
        self._remember_drafts(ctx, [list(zip(t, p)) for t, p in
                                    zip(tree.tokens.tolist(), tree.parents.tolist())])

    # ---- the length-aware budget (the ``suffix:k_max=K`` arm) --------------------------
    def budget(self, ctx, k_max: int) -> int:
        """The step's draft depth: the largest of its rows' :func:`length_aware_budget`
        (response lengths ``ctx.response_lengths``, acceptance read up to date), at most
        ``k_max`` (and at least 1)."""
        self._read(ctx.admitted)
        k_min = min(self.k_min, k_max)
        return max(length_aware_budget(n, self.acceptance.get(i, 1.0), k_min, k_max,
                                       self.half_length)
                   for i, n in zip(ctx.request_ids, ctx.response_lengths))

    def propose_budgeted(self, ctx, k_max: int, branch: int = 1,
                         verify_budget: int | None = None) -> ChainDraft | TreeDraft:
        """A step of the ``suffix`` arm: a chain (``branch`` 1 and no ``verify_budget``) or a
        tree of :meth:`budget` drafts, cut after the deepest draft any row found (at least
        one): columns of padding alone would be verified for nothing."""
        k = self.budget(ctx, check_int("k_max", k_max, 1))
        if branch == 1 and verify_budget is None:
            rows, found = self._chains(ctx, k)
            depth = max(1, *found)
            tokens, logq = self._chain_out(ctx, [r[:depth] for r in rows])
            return ChainDraft(tokens, logq)
        tree, deepest = self._tree(ctx, k, branch)
        depth = max(1, *deepest)
        if depth < k:  # drop the levels of fillers only (nodes are numbered level by level)
            n = branch * depth
            tree = DraftTree(tree.tokens[:, :n], tree.parents[:, :n], tree.scores[:, :n])
        tree = tree.select(verify_budget)
        self._remember_tree(ctx, tree)  # what is verified: the acceptance is read against it
        return TreeDraft(tree, depth)
