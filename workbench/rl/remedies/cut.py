"""Ending a rollout early, as a measure on its timeline: how many tokens each request had at
a time ``t``, and the timeline of the rollout as if it had stopped at ``t``.

Over-provisioning ends a step's rollout once the target number of groups has finished. The
engine runs every request to its end; the cut is taken afterwards from the timeline, which
says when each step of each worker ended. A request gains its tokens at the ends of its
worker's steps: one at its own prefill, one per ``decode`` step after it, and at its
``j``-th ``verify`` step the tokens that step emitted for it (``emitted_per_step[j]``);
other requests' prefills and ``draft`` steps emit nothing for it. Coupled draws make a
request's tokens independent of its batch-mates, so the prefix it had at ``t`` is what an
engine stopped at ``t`` would have given.

Time after the cut is not counted: the cut timeline ends at ``t`` (a step running at ``t``
is cut there, its time until ``t`` busy, its tokens not emitted; steps that start later are
gone), and its measures (makespan, idle fraction) are ``Timeline``'s own, read on it. The
tokens decoded after ``t`` in the simulation are discarded, as an engine that stops at ``t``
never decodes them.
"""
from __future__ import annotations

import pandas as pd

from ...rollout.timeline import ROLLOUT_KINDS, Timeline

__all__ = ["tokens_at", "cut_timeline"]


def tokens_at(steps: pd.DataFrame, request, t: float) -> int:
    """Tokens ``request`` (a ``RequestOutput``) had emitted by time ``t``, from the ``steps``
    table of its rollout (the request's own worker's rows)."""
    mine = steps[(steps["worker"] == request.worker) & steps["kind"].isin(ROLLOUT_KINDS)]
    prefill = mine[(mine["kind"] == "prefill") & (mine["start_s"] == request.start_s)]
    if len(prefill) != 1:
        raise ValueError(f"request {request.uid} has {len(prefill)} prefill steps starting at "
                         f"{request.start_s} on worker {request.worker}; expected one (a "
                         "RequestOutput and the steps table of its own rollout)")
    joined = float(prefill["end_s"].iloc[0])
    if joined > t:
        return 0
    after = mine[(mine["start_s"] >= joined) & (mine["end_s"] <= t)
                 & (mine["end_s"] <= request.end_s)]
    verifies = int((after["kind"] == "verify").sum())
    return 1 + int((after["kind"] == "decode").sum()) + sum(request.emitted_per_step[:verifies])


def cut_timeline(timeline: Timeline, t: float, tokens: dict[int, int]) -> Timeline:
    """``timeline`` as if its rollout had stopped at ``t``: steps cut at ``t`` (later ones
    dropped), and each request unfinished at ``t`` with ``tokens[uid]`` response tokens,
    ``end_s`` at ``t`` and ``finish`` ``"cut"``."""
    s = timeline.steps[timeline.steps["start_s"] < t].copy()
    s["end_s"] = s["end_s"].clip(upper=t)
    r = timeline.requests.copy()
    late = r["end_s"] > t
    r.loc[late, "response_tokens"] = r.loc[late, "uid"].map(tokens).astype(int)
    r.loc[late, "finish"] = "cut"
    r["start_s"] = r["start_s"].clip(upper=t)
    r["end_s"] = r["end_s"].clip(upper=t)
    return Timeline(s.reset_index(drop=True), r, timeline.num_workers, timeline.clock)
