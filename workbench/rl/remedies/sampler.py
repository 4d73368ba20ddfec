"""The rollout half of an RL step with remedies: which groups are sampled, how far each
response grows, when the rollout ends, and what is trained, carried or dropped.

One call of :meth:`Sampler.sample` reads top to bottom:

1. **groups**: the groups carried from the last step (oldest first), topped up with fresh
   prompts (the run's stream: GRPO's ``problems_for`` order) to ``target + extra_groups``
   slots (:meth:`Sampler.groups`);
2. **requests**: one per live response, its prompt followed by its tokens so far, capped at
   the rest of its budget (``max_new_tokens`` minus its length, and at most
   ``segment_tokens`` with partial rollouts), in the order ``order`` gives (default: as
   drawn); one engine rollout runs them all (dealt to the workers round-robin in that order,
   each worker admitting its shard in it: the seam of a scheduling policy such as
   shortest-predicted-first);
3. **the end of the rollout**: with over-provisioning, the time the ``target``-th group
   finished (all ``G`` responses done), and the timeline cut there (``cut``); else the
   rollout's own end;
4. **growth**: each response takes the tokens it had at the end, sampled by ``version``
   (and, recorded, that policy's log-probs of them: the rollout's own, as the sampler drew
   them, so that the behaviour policy costs no forward of the trainer's);
5. **split**: the finished groups, ``target`` of them at most, are trained (with
   over-provisioning the first to finish; else the first drawn: a choice by tokens alone);
   the rest carry over to the next step, are dropped, or are dropped and their prompts
   deferred (``leftover``).

TLT beside a remedy: the spot trainer's drafter jobs (``tail``) train in the idle windows of
the rollout *as it ended*. A rollout that may be cut (over-provisioning) runs without them;
once its end is known, the jobs run in the idle windows of the cut timeline (``LocalBackend.
run_idle``, the sim clock), so each worker that finished before the cut trains until the cut,
a worker busy at the cut has no window, and the pairs are the requests as they stood at the
cut (tokens and harvested states after it discarded, as an engine stopped there never
decoded them). A rollout that is never cut takes the jobs itself (``RolloutEngine.rollout(
tail=...)``), as TLT's does.

Tail batching (RollPacker): with ``leftover="defer"`` the prompts of the groups unfinished
at the cut, those whose responses ran long, wait in a tail queue; once it holds ``target``
prompts, the next step is a *long round* of those prompts alone, sampled afresh and run to
their end (no over-provisioning, no cut), so the long responses share a batch and the other
steps stay short.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from ...rollout import RequestOutput, RolloutConfig, RolloutResult
from ...rollout.timeline import Timeline
from .cut import cut_timeline, tokens_at
from .responses import Group, Response

__all__ = ["Sampler", "Sampled"]


@dataclass
class Sampled:
    """One step's rollout: ``trained`` (finished groups, as ``Sampler.split`` chose), ``carried``
    (groups that go on next step), the ``timeline`` (cut where the rollout ended), the
    policy ``version`` that sampled, the tokens of dropped groups (``aborted_tokens``), the
    engine's ``result``, whether it was a ``long_round`` of deferred prompts (tail
    batching), and ``at_end``: the rollout as it stood at its end (requests and their
    harvested states cut there, the timeline with the drafter jobs' rows, and what the jobs
    handed back in ``idle``: what the spot trainer merges); the engine's ``result`` when the
    rollout was not cut and no jobs ran after it."""

    trained: list[Group]
    carried: list[Group]
    timeline: Timeline
    version: int
    aborted_tokens: int
    result: object
    long_round: bool = False
    at_end: object = None


class Sampler:
    """Samples the steps of one run, holding the groups carried between them.

    Args:
        engine: the rollout engine.
        rollout: how to sample (``samples_per_prompt`` is ``G``); each rollout's ``rl_step``
            is the number of rollouts sampled so far, so no two share coupled draws.
        target: groups a step trains on (``P``).
        problems_for: ``problems_for(s)``, the ``P`` fresh problems of stream step ``s``.
        extra_groups, leftover, segment_tokens: the remedies (``RemedyConfig``).
        order: ``order(live)``, the order of a rollout's requests: a permutation of
            ``range(len(live))``, where ``live[i]`` is request ``i``'s ``(Group, Response)``,
            or None (as drawn); None: always as drawn (``rl.variants.RemedyVariant.order``).
        dispatch: ``dispatch(live)``, a ``rollout.dispatch.Dispatch`` for one rollout of the
            ``live`` requests (in ``order``'s order; request ``i``'s ``prompt_id`` is ``i``):
            the workers then advance in sim-time order and it moves work between them
            (``RolloutEngine.rollout(dispatch=...)``: the requests' uids, hence their tokens,
            are unchanged); None: each worker runs its shard.
    """

    def __init__(self, engine, rollout: RolloutConfig, target: int,
                 problems_for: Callable[[int], list], extra_groups: int = 0,
                 leftover: str = "abort", segment_tokens: int | None = None,
                 order: Callable[[list], Sequence[int] | None] | None = None,
                 dispatch: Callable[[list], object] | None = None):
        self.engine, self.rollout, self.target = engine, rollout, target
        self.problems_for, self.order, self.dispatch = problems_for, order, dispatch
        self.extra_groups, self.leftover = extra_groups, leftover
        self.segment_tokens = segment_tokens
        self.pool: list[Group] = []
        self.tail: list[Group] = []  # deferred prompts (tail batching), as fresh groups
        self.drawn = 0      # fresh prompts drawn so far
        self.rollouts = 0   # rollouts sampled so far

    def groups(self) -> tuple[list[Group], bool]:
        """1) the carried groups, and fresh ones until ``target + extra_groups`` groups hold a
        slot. Every carried group holds one (APRIL's fixed pool), except with partial
        rollouts, where a group still growing waits in a buffer beside the slots (Kimi
        k1.5): fresh prompts keep coming however long the carried ones run. A long round
        (tail batching; second value True): ``target`` deferred prompts alone."""
        if len(self.tail) >= self.target:
            groups, self.tail = self.tail[:self.target], self.tail[self.target:]
            return groups, True
        groups = list(self.pool)
        G = self.rollout.samples_per_prompt
        held = sum(1 for g in groups if g.done or self.segment_tokens is None)
        for _ in range(self.target + self.extra_groups - held):
            step, i = divmod(self.drawn, self.target)
            problem = self.problems_for(step)[i]
            ids = self.engine.encode([problem.prompt])[0]
            groups.append(Group.fresh(problem, ids, G, self.drawn))
            self.drawn += 1
        return groups, False

    def cap(self, response: Response) -> int:
        """The most tokens ``response`` may grow by in this step."""
        rest = self.rollout.max_new_tokens - len(response.tokens)
        return rest if self.segment_tokens is None else min(rest, self.segment_tokens)

    def ordered(self, live: list) -> list:
        """``live`` (the step's ``(Group, Response)`` requests, as drawn) in ``order``'s
        order; ``ValueError`` when it gives no permutation of their indices."""
        picked = None if self.order is None else self.order(live)
        if picked is None:
            return live
        picked = list(picked)
        if sorted(i if isinstance(i, int) else -1 for i in picked) != list(range(len(live))):
            raise ValueError(f"order gave {picked[:8]}{'...' if len(picked) > 8 else ''} for "
                             f"{len(live)} requests; accepted: a permutation of "
                             f"range({len(live)}) (each request's index once), or None")
        return [live[i] for i in picked]

    def may_cut(self, long_round: bool) -> bool:
        """Whether a rollout may end before its last request (over-provisioning, not in a
        long round)."""
        return bool(self.extra_groups) and not long_round

    def sample(self, version: int, record: bool = False, schedule=None, drafter=None,
               harvest: bool = False, tail=None) -> Sampled:
        """One step's rollout by policy ``version``; ``record``: keep the sampling policy's
        log-prob of every new token (the behaviour of off-policy training); ``tail``: the
        spot trainer's drafter jobs, run in the idle windows of the rollout as it ended
        (module docstring)."""
        groups, long_round = self.groups()                                  # 1) groups
        live = self.ordered([(g, r) for g in groups for r in g.live])
        caps = [self.cap(r) for _, r in live]
        config = replace(self.rollout, samples_per_prompt=1)
        later = self.may_cut(long_round)  # the jobs wait for the rollout's end
        result = self.engine.rollout([g.prompt_ids + r.tokens for g, r in live], config,
                                     progress=False, drafter=drafter, schedule=schedule,
                                     caps=caps, tail=None if later else tail,
                                     rl_step=self.rollouts, harvest=harvest,
                                     dispatch=None if self.dispatch is None
                                     else self.dispatch(live))  # 2) requests
        self.rollouts += 1
        outs = result.requests
        ended = [self._finish(r, out, cap) for (_, r), out, cap in zip(live, outs, caps)]
        end_s, timeline, at_end = self._end(groups, live, outs, ended, result.timeline,
                                            long_round)                     # 3) end
        seen = result
        if tail is not None and later:
            seen = self._train_idle(result, timeline, at_end, end_s, tail)
            timeline = seen.timeline
        grown = [out.tokens[:at_end.get(out.uid, len(out.tokens))] for out in outs]
        for (_, r), out, tokens, finish in zip(live, outs, grown, ended):  # 4) growth
            r.grow(tokens, version, out.uid, finish if out.end_s <= end_s else "")
            if record and tokens:
                r.segments.append(torch.tensor(out.logprobs[:len(tokens)], dtype=torch.float64))
        trained, carried, dropped = self.split(groups, live, outs)        # 5) split
        self.pool = carried
        if self.leftover == "defer":
            G = self.rollout.samples_per_prompt
            self.tail += [Group.fresh(g.problem, g.prompt_ids, G, g.drawn)
                          for g in dropped if not g.done]
        return Sampled(trained, carried, timeline, version,
                       sum(g.tokens() for g in dropped), result, long_round, seen)

    def _train_idle(self, result, timeline: Timeline, at_end: dict[int, int], end_s: float,
                    tail) -> RolloutResult:
        """``result`` as it stood at ``end_s`` (the requests unfinished then cut to their
        ``at_end`` tokens, their harvested states with them; ``timeline``: the cut one), with
        ``tail``'s jobs run in that timeline's idle windows, which end at the cut."""
        requests = [_cut_request(out, at_end[out.uid], end_s) if out.uid in at_end else out
                    for out in result.requests]
        seen = RolloutResult(requests, timeline, result.config,
                             compile_choices=result.compile_choices)
        seen.idle = self.engine.backend.run_idle(tail, timeline, [seen])
        seen.timeline = seen.idle.on(timeline)
        return seen

    def _finish(self, response: Response, out, cap: int) -> str:
        """How ``response`` ends if it takes all of ``out``'s tokens: ``"eos"``, ``"length"``
        (the whole budget, or the model's context), or ``""`` (cut by its segment)."""
        if out.finish == "eos":
            return "eos"
        if len(response.tokens) + len(out.tokens) >= self.rollout.max_new_tokens:
            return "length"
        return "length" if out.finish == "length" and len(out.tokens) < cap else ""

    def _end(self, groups, live, outs, ended, timeline, long_round) -> tuple:
        """3) ``(when the rollout ends, its timeline cut there, {uid: tokens at the end} of
        the requests unfinished then)``: with over-provisioning the time the ``target``-th
        group finished, when that many did; else (and in a long round) its last step."""
        finish = self._group_finish(groups, live, outs, ended)
        done = sorted(t for t in finish.values() if t < math.inf)
        if not self.extra_groups or long_round or len(done) < self.target:
            return math.inf, timeline, {}
        t = done[self.target - 1]
        tokens = {out.uid: tokens_at(timeline.steps, out, t) for out in outs if out.end_s > t}
        return t, cut_timeline(timeline, t, tokens), tokens

    @staticmethod
    def _group_finish(groups, live, outs, ended) -> dict[int, float]:
        """``{id(group): the time its last response finished}`` (0 for a group finished
        before this step, inf for one that does not finish in it)."""
        finish = {id(g): 0.0 for g in groups}
        for (g, _), out, end in zip(live, outs, ended):
            finish[id(g)] = max(finish[id(g)], out.end_s if end else math.inf)
        return finish

    def split(self, groups, live, outs) -> tuple[list, list, list]:
        """5) ``(trained, carried, dropped)``: of the finished groups, ``target`` at most are
        trained. With over-provisioning the first to finish (by finish time, ties in group
        order: the early stop's own choice); else the first drawn (partial rollouts, where
        groups held over several steps may finish together with fresh ones: the one that
        waited longest goes first, and the choice reads tokens alone, never the measured
        clock, so a resumed run takes the same groups as a straight one)."""
        ends = {id(g): 0.0 for g in groups}
        for (g, _), out in zip(live, outs):
            ends[id(g)] = max(ends[id(g)], out.end_s)
        first = (lambda g: ends[id(g)]) if self.extra_groups else (lambda g: g.drawn)
        done = sorted((g for g in groups if g.done), key=first)
        trained, rest = done[:self.target], done[self.target:]
        rest += [g for g in groups if not g.done]
        rest.sort(key=lambda g: g.drawn)
        if self.leftover == "carry":
            return trained, rest, []
        return trained, [], rest


def _cut_request(out: RequestOutput, tokens: int, t: float) -> RequestOutput:
    """``out`` as it stood at ``t``, with its first ``tokens`` response tokens (and their
    log-probs and harvested states: ``hidden [prompt + tokens - 1, H]``), finish ``"cut"``."""
    hidden = None if out.hidden is None else out.hidden[:len(out.prompt_ids) + tokens - 1]
    return replace(out, tokens=out.tokens[:tokens], logprobs=out.logprobs[:tokens],
                   end_s=min(out.end_s, t), finish="cut", text="", hidden=hidden)
