"""The counted suffix trie a suffix drafter drafts from (``speculative.suffix``): the
substrings of a prompt's references, and the chains and trees their counts propose.

Glossary:

trie        :class:`SuffixTrie`, one per prompt: every substring of at most ``max_depth``
            tokens of the prompt's references, as a path from the root; a node's ``count``
            is how many times its substring occurs in them. So the children of the node of
            a string ``s`` are the tokens seen after ``s``, each with how often. A bounded
            suffix trie rather than a suffix tree or automaton: appending a token touches at
            most ``max_depth`` nodes, in plain dict operations, and nothing is rebuilt.
match       the longest suffix of a row's sequence (1 to ``max_depth - 1`` tokens) whose node
            has children: the most specific context seen followed by something. Having
            children is monotone in the suffix length (if ``s`` was followed by ``c``, so was
            every suffix of ``s``), so the match is a binary search over lengths.
chain       from the match, the most frequent child, then its most frequent child, ...; when
            a walk reaches a node with no children (the depth bound, or the end of every
            occurrence), the drafted sequence is matched afresh. Ties go to the child seen
            first. A row with no match drafts its last token repeated (``found`` 0).
tree        EAGLE-2's shape (``rollout.tree``) grown from counts: every frontier node
            proposes its ``branch`` most frequent children, each scored by its path's sum of
            log normalised counts (``log(count(child) / count(all children))``), and the
            ``branch`` best candidates of the level are the next frontier. A level short of
            ``branch`` candidates is padded with *filler* nodes (the row's last token or the
            smallest unused ids, scored ``FILLER_LOGP`` below their parent), so every row's
            tree has the ``branch * k`` nodes the engine's tree path pads to, and a verify
            budget prunes fillers first.
"""
from __future__ import annotations

import math

from ..checks import check_int

__all__ = ["SuffixTrie", "FILLER_LOGP"]

FILLER_LOGP = -1e4  # a filler node's log-probability: below any path of counted nodes


class SuffixTrie:
    """Every substring of at most ``max_depth`` tokens of some sequences, counted (the
    module's *trie*). Node 0 is the root (the empty string); ``kids[v]`` maps a token to the
    child node, ``count[v]`` is how many times node ``v``'s string occurs, ``depth[v]`` its
    length.

    A sequence is grown with :meth:`extend` from its *active* nodes, the nodes of its
    suffixes of 0 to ``max_depth - 1`` tokens (``[0]`` for an empty one), which
    :meth:`extend` returns for the next call: appending a token steps every active node to
    its child by that token (created when new) and counts one more occurrence there.
    """

    def __init__(self, max_depth: int):
        self.max_depth = check_int("max_depth (the longest substring kept)", max_depth, 2)
        self.kids: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self.depth: list[int] = [0]

    def extend(self, active: list[int], tokens) -> list[int]:
        """Append ``tokens`` to the sequence whose active nodes are ``active`` (not changed);
        the active nodes after them."""
        kids, count, depth, bound = self.kids, self.count, self.depth, self.max_depth
        for t in tokens:
            t = int(t)
            new = [0]
            for v in active:
                child = kids[v].get(t)
                if child is None:
                    child = kids[v][t] = len(count)
                    kids.append({})
                    count.append(0)
                    depth.append(depth[v] + 1)
                count[child] += 1
                if depth[child] < bound:
                    new.append(child)
            active = new
        return active

    def add(self, tokens) -> list[int]:
        """A new sequence ``tokens``; its active nodes."""
        return self.extend([0], tokens)

    def node(self, tokens) -> int | None:
        """The node of the string ``tokens``, or ``None`` when it never occurred."""
        v = 0
        for t in tokens:
            v = self.kids[v].get(int(t))
            if v is None:
                return None
        return v

    def match(self, context) -> int | None:
        """The node of the longest suffix of ``context`` (1 to ``max_depth - 1`` tokens) that
        has children (the module's *match*), or ``None`` when not even its last token has."""
        def followed(n: int) -> int | None:
            v = self.node(context[len(context) - n:])
            return v if v is not None and self.kids[v] else None

        lo, hi, best = 1, min(self.max_depth - 1, len(context)), None
        while lo <= hi:  # followed(n) is monotone: true up to the match's length, then false
            mid = (lo + hi) // 2
            v = followed(mid)
            if v is None:
                hi = mid - 1
            else:
                best, lo = v, mid + 1
        return best

    def ranked(self, v: int) -> list[tuple[int, int, float]]:
        """Node ``v``'s children, most frequent first (ties: the one seen first), as
        ``(token, child, log of its share of the children's counts)``."""
        kids, count = self.kids[v], self.count
        total = sum(count[c] for c in kids.values())
        order = sorted(kids.items(), key=lambda kv: -count[kv[1]])  # stable: first seen first
        return [(t, c, math.log(count[c] / total)) for t, c in order]

    def chain(self, context: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens after ``context`` (the module's *chain*); fewer when the walk
        finds no match."""
        ctx = list(context[-(self.max_depth - 1):])
        v, out = self.match(ctx), []
        while len(out) < k and v is not None:
            if not self.kids[v]:
                v = self.match(ctx)
                if v is None:
                    break
            count = self.count
            t, v = max(self.kids[v].items(), key=lambda kv: count[kv[1]])  # first seen on ties
            out.append(t)
            ctx.append(t)
        return out

    def levels(self, context: list[int], k: int, branch: int):
        """The levels ``[(tokens, parent slots, scores)]`` (each ``branch`` long, best first)
        of a tree ``k`` deep after ``context`` (the module's *tree*), and the depth of its
        deepest counted node."""
        # a frontier item: (its trie node or None for a filler, its context, its score)
        frontier = [(self.match(context), context, 0.0)]
        levels, deepest = [], 0
        for depth in range(1, k + 1):
            cand = []
            for slot, (v, ctx, score) in enumerate(frontier):
                if v is not None and not self.kids[v]:
                    v = self.match(ctx)  # the walk hit the depth bound: match afresh
                if v is None:
                    continue
                for t, child, logp in self.ranked(v)[:branch]:
                    cand.append((score + logp, slot, t, child))
            cand.sort(key=lambda c: -c[0])  # stable: ties go to the earlier slot and child
            cand = cand[:branch]
            if cand:
                deepest = depth
            used = {(slot, t) for _, slot, t, _ in cand}
            fillers = iter([context[-1], *range(branch + 1)])
            while len(cand) < branch:  # pad below the best frontier node with unused tokens
                t = next(fillers)
                if (0, t) not in used:
                    used.add((0, t))
                    cand.append((frontier[0][2] + FILLER_LOGP, 0, t, None))
            levels.append(([c[2] for c in cand], [c[1] for c in cand], [c[0] for c in cand]))
            frontier = [(child, frontier[slot][1] + [t], s) for s, slot, t, child in cand]
        return levels, deepest
