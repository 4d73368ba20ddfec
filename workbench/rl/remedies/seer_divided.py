"""Seer's divided rollout (arXiv 2511.14617) as an RL variant, ``seer_divided``: when a worker
falls idle while others still hold queued or running requests, work moves to it.

It is ``seer_schedule`` (longest predicted first, the same predictors and their errors in
the history) with the requests in one pool instead of per-worker queues
(:class:`DividedDispatch`):

- **queued requests move freely**: a worker whose refill is due takes the longest
  predicted requests of the pool, as many as its batch has room for (``max_batch_size``;
  without a cap, its share of the rollout, as a round-robin deal would give it);
- **running requests move by re-prefilling**: a worker with nothing left, when the pool is
  empty too, takes half of the running requests (the longest predicted to go on) of the
  worker that runs the most (two at least), each request at most once. The source lets them
  go after its step in flight; the receiving worker re-prefills each one's prompt and tokens
  as a ``prefill`` step of its own (``moved_from`` in the steps table), on its sim clock,
  from the source's clock at the earliest, so the re-prefill is charged where it runs and
  the wait before it shows as idle. The history counts them (``seer_moves``,
  ``seer_reprefills``, ``seer_reprefill_s``).

Tokens are unchanged: a moved request keeps its uid, so coupled draws give it the tokens it
would have had where it was (equal in float64; in float32 a re-prefill may round
differently from the steps it replaces, and the divergence shows in ``tokens_digest``).

The workers must advance in sim-time order, which the local backend does
(``LocalBackend.map_steps``); on Ray, whose actors decode in parallel, no request can move
mid-step, and the variant is refused when it is built (moving work between Ray actors, with
the re-prefill on the wall clock, is left to do).
"""
from __future__ import annotations

from ..variants import rl_variant
from .seer_schedule import SeerDispatch, SeerSchedule

__all__ = ["DividedDispatch", "SeerDivided"]


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
        room = run.cap - run.dec.size - len(run.queue)
        if room <= 0 or not run.refill_due(len(run.queue) + len(self.pool)):
            return
        self.pool = self.longest_first(self.pool)
        take, self.pool = self.pool[:room], self.pool[room:]
        run.give_queued(take)

    def before(self, run, runs) -> None:
        self.fill(run)
        super().before(run, runs)

    def idle(self, run, runs) -> None:
        if self.pool:
            self.fill(run)
            self.note_starts(run)
            return
        donors = [r for r in runs if r is not run and r.dec.size >= self.min_rows
                  and any(q.uid not in self.moved for q in r.running)]
        if not donors:
            return
        source = max(donors, key=lambda r: (r.dec.size, -r.index))
        free = [q for q in source.running if q.uid not in self.moved]
        free.sort(key=lambda q: (-self.left(q), q.prompt_id))
        take = free[:max(1, min(len(free), source.dec.size // 2))]
        self.moved |= {q.uid for q in take}
        self.moves += len(take)
        run.receive(source.release([q.uid for q in take]), source.index, source.clock_s)


@rl_variant("seer_divided", builtin=True)
class SeerDivided(SeerSchedule):
    """GRPO whose rollouts divide the requests over the workers as they free (queued ones
    freely, running ones re-prefilled), longest predicted first; tokens unchanged."""

    dispatch_cls = DividedDispatch
