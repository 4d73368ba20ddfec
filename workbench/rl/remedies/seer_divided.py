"""Seer's divided rollout (arXiv 2511.14617) as an RL variant, ``seer_divided``: when a worker
falls idle while others still hold queued or running requests, work moves to it.

It is ``seer_schedule`` (longest predicted first, the same predictors and their errors in
the history) with the requests in one pool instead of per-worker queues
(:class:`DividedDispatch`):

- **queued requests move freely**: a worker whose refill is due takes the longest
  predicted requests of the pool, as many as its batch has room for (``max_batch_size``;
  without a cap, its share of the rollout, as a round-robin deal would give it);
- **running requests move by re-prefilling**: a worker with nothing left, when the pool is
  empty too, takes the longest predicted running requests (up to half) of the worker that
  runs the most (two at least), each request at most once, when that pays by the costs
  measured so far: both workers then end sooner than the source would alone, re-prefill
  included (:meth:`DividedDispatch.worth_moving`: where a decode step costs as much for one
  row as for several, the tail's last tokens take as many steps wherever they run, and
  nothing moves). The source lets them go after its step in flight; the receiving worker re-prefills each one's prompt and tokens
  as a ``prefill`` step of its own (``moved_from`` in the steps table), on its sim clock,
  from the source's clock at the earliest, so the re-prefill is charged where it runs and
  the wait before it shows as idle. The history counts them (``seer_moves``,
  ``seer_reprefills``, ``seer_reprefill_s``).

Tokens are unchanged: a moved request keeps its uid, so coupled draws give it the tokens it
would have had where it was (equal in float64; in float32 a re-prefill may round
differently from the steps it replaces, and the divergence shows in ``tokens_digest``).

The workers advance in sim-time order on the local backend (``LocalBackend.map_steps``); on
Ray, whose actors decode in parallel, in rounds of one step of every busy actor, the
dispatch asked between rounds on what the actors reported (``rollout.ray_steps``), each
re-prefill on the receiving actor's wall clock. A lost worker's share, from scratch, joins
the pool (``rollout.recovery``, "on the dispatch path").
"""
from __future__ import annotations

import math

from .seer_schedule import SeerDispatch

__all__ = ["DividedDispatch"]


class DividedDispatch(SeerDispatch):
    """One rollout's divided placement (module docstring). ``min_rows``: a worker gives
    running requests only while it runs at least this many."""

    min_rows = 2

    def begin(self, runs) -> None:
        super().begin(runs)  # dealt round-robin, longest predicted first
        self.pool, self.moved = [], set()
        for run in runs:  # each worker keeps its first batch; the rest wait in the pool
            self.pool += run.take_queued([q.uid for q in list(run.queue)[run.cap:]])
        self.pool = self.longest_first(self.pool)

    def fill(self, run) -> None:
        """Queue on ``run`` the pool's longest predicted requests its batch has room for,
        when its refill is due with them waiting."""
        if not self.pool:
            return
        room = run.cap - len(run.running) - len(run.queue)
        if room <= 0 or not run.refill_due(len(run.queue) + len(self.pool)):
            return
        self.pool = self.longest_first(self.pool)
        take, self.pool = self.pool[:room], self.pool[room:]
        run.give_queued(take)

    def before(self, run, runs) -> None:
        self.fill(run)
        super().before(run, runs)

    def lost(self, run, requests, runs) -> None:
        """A lost worker's share, from scratch, waits in the pool (longest predicted first)
        for the survivors' refills and idle turns; its requests may move again."""
        self.adopt(requests)
        self.moved -= {q.uid for q in requests}
        self.pool = self.longest_first(self.pool + list(requests))

    def idle(self, run, runs) -> None:
        if self.pool:
            self.fill(run)
            self.note_starts(run)
            return
        donors = [r for r in runs if r is not run and len(r.running) >= self.min_rows
                  and any(q.uid not in self.moved for q in r.running)]
        if not donors:
            return
        source = max(donors, key=lambda r: (len(r.running), -r.index))
        take = self.worth_moving(source, runs)
        if not take:
            return
        self.moved |= {q.uid for q in take}
        self.moves += len(take)
        run.receive(source.release([q.uid for q in take]), source.index, source.clock_s)

    # ---- whether a move pays, by the steps measured so far ------------------------------------
    def worth_moving(self, source, runs) -> list:
        """The running requests of ``source`` to move to an idle worker: of the moves of its
        ``k`` longest predicted requests (``k`` up to half its rows), the one that ends both
        workers soonest, when that is sooner than ``source`` alone would end; none without
        the measures to tell. Each worker's end is its decode steps' predicted seconds (a
        step's seconds as a line in its rows, fitted on every worker's decode steps so far),
        the receiving one's after the re-prefill (the prefills' seconds per context token so
        far). Where a step costs as much for one row as for many, no move pays: the tail's
        last tokens take as many steps wherever they run."""
        step = self._step_cost(runs)
        per_token = self._prefill_cost(runs)
        if step is None or per_token is None:
            return []
        free = [q for q in source.running if q.uid not in self.moved]
        left = {q.uid: int(math.ceil(self.left(q))) for q in source.running}
        free.sort(key=lambda q: (-left[q.uid], q.prompt_id))

        def finish(rows) -> float:  # the decode steps' seconds until every row is done
            lengths = sorted((left[q.uid] for q in rows), reverse=True)
            seconds = 0.0
            for k in range(1, (lengths[0] if lengths else 0) + 1):
                while lengths and lengths[-1] < k:
                    lengths.pop()
                seconds += step(len(lengths))
            return seconds
        alone = finish(source.running)
        best, best_end = [], alone
        for k in range(1, max(1, len(source.running) // 2) + 1):
            moved = free[:k]
            stay = [q for q in source.running if q not in moved]
            context = sum(len(q.prompt_ids) + len(q.tokens) for q in moved)
            end = max(finish(stay), per_token * context + finish(moved))
            if end < best_end:
                best, best_end = moved, end
        return best

    @staticmethod
    def _step_cost(runs):
        """A decode step's seconds as ``a + b * rows`` (least squares on every worker's decode
        and verify steps so far, a verify step with its draft), or None before two batch sizes
        were seen."""
        points = []
        for run in runs:
            rows = run.rows
            for i, row in enumerate(rows):
                if row["kind"] in ("decode", "verify"):
                    seconds = row["end_s"] - row["start_s"]
                    if row["kind"] == "verify" and i and rows[i - 1]["kind"] == "draft":
                        seconds += rows[i - 1]["end_s"] - rows[i - 1]["start_s"]
                    points.append((row["batch_size"], seconds))
        xs = [x for x, _ in points]
        if len(set(xs)) < 2:
            return None
        mx, my = sum(xs) / len(xs), sum(y for _, y in points) / len(points)
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        a, b = my - slope * mx, max(0.0, slope)
        return lambda rows: max(0.0, a + b * rows) if rows else 0.0

    def _prefill_cost(self, runs):
        """A prefill's seconds per context token so far (the prefills of fresh requests:
        their prompts), or None before one."""
        seconds = tokens = 0.0
        for run in runs:
            seconds += sum(r["end_s"] - r["start_s"] for r in run.rows
                           if r["kind"] == "prefill" and r.get("moved_from") is None)
            tokens += sum(len(q.prompt_ids) for q in run.admitted if q.uid not in self.moved)
        return seconds / tokens if tokens > 0 and seconds > 0 else None
