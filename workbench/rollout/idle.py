"""The idle-window machinery in one place: what a worker runs after its shard is back, while
the step's long tail finishes elsewhere (``rollout.backend``'s glossary: "idle window",
"tail jobs", "idle job").

- :class:`IdleJob`: the work (``run(window, clock)``; ``settled(rows)`` for the wall clock's
  stop); :class:`TailJobs`: the jobs of one map, one per worker as its value comes back;
- :class:`WindowEnd`: the window's end, known at once (sim) or set later from another thread
  (wall); :class:`IdleClock`: what a job is handed, the worker's clock inside the window,
  which preempts a step that crosses the end;
- :class:`IdleRun`: what the jobs hand back, and their rows on the step's timeline.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from ..checks import check_choice
from .failures import WorkerFailed, failure_row
from .timeline import IdleWindow, Timeline

__all__ = ["IDLE_KINDS", "IdleJob", "TailJobs", "IdleRun", "WindowEnd", "IdleClock"]

IDLE_KINDS = ("drafter_train", "train")  # work an idle window runs
"""The kinds of work an idle window runs."""


class IdleJob:
    """Work for an idle window (module docstring, "idle job"): subclass it and define
    ``run``; ``settled`` has a default."""

    def run(self, window: IdleWindow, clock: IdleClock) -> object:
        """Work in ``window`` through ``clock``; the outcome the caller folds in."""
        raise NotImplementedError(f"{type(self).__name__} defines no run(window, clock)")

    def settled(self, rows: list[dict]) -> object | None:
        """The outcome of the work ``rows`` count, asked from another thread while ``run``
        may still run (the wall clock's stop, so as not to wait for a step in flight), with
        the window's rows as they stand at its end (``IdleClock.rows_at``). None (the
        default): it cannot say, and the run's return answers."""
        return None


class TailJobs(Protocol):
    """The idle-window jobs of one map (module docstring, "tail jobs")."""

    def job(self, window: IdleWindow, returned: list) -> IdleJob | None:
        """The job for ``window``'s worker, whose value just came back (``returned``: the
        values back so far, its own included); ``None``: that worker stays idle."""
        ...


@dataclass
class IdleRun:
    """What the idle jobs of a map (or of a finished rollout: ``LocalBackend.run_idle``)
    hand back: the windows they ran in (closed: each ends where the step's last shard did),
    each one's outcome (``None`` where its worker failed), the steps rows the jobs recorded,
    the failures, and how long the driver waited for the jobs once it had stopped them
    (0 on the sim clock, where nothing waits)."""

    windows: list[IdleWindow] = field(default_factory=list)
    outcomes: list = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    failed: list[WorkerFailed] = field(default_factory=list)
    stop_wait_s: float = 0.0

    @classmethod
    def of(cls, windows: Sequence[IdleWindow], runs: list, stop_wait_s: float = 0.0) -> "IdleRun":
        """``runs[i]``: window i's ``(outcome, rows)``, or the :class:`WorkerFailed` of its
        worker."""
        lost = [isinstance(run, WorkerFailed) for run in runs]
        return cls(list(windows), [None if gone else run[0] for gone, run in zip(lost, runs)],
                   [row for gone, run in zip(lost, runs) if not gone for row in run[1]],
                   [run for gone, run in zip(lost, runs) if gone], stop_wait_s)

    def on(self, timeline: Timeline) -> Timeline:
        """``timeline`` (the map's rollout) with the jobs' rows and a ``failed`` row per lost
        job (from its window's start, within it, numbered after its worker's rows)."""
        rows = list(self.rows)
        for failed in self.failed:
            window = next(w for w in self.windows if w.worker == failed.worker)
            steps = [r["step"] for r in rows if r["worker"] == failed.worker] + \
                timeline.steps.loc[timeline.steps["worker"] == failed.worker, "step"].tolist()
            rows.append(failure_row(failed, max(steps, default=-1) + 1, window.start_s,
                                    window.end_s))
        return timeline.with_steps(rows)


class WindowEnd:
    """The end of an idle window on the step's clock: known from the start (the sim clock,
    where every shard has run before any job does) or set later by :meth:`close`, from
    another thread (the wall clock: the backend's stop, when the step's last shard comes back,
    while the job runs). ``end_s`` is ``inf`` while the window is open."""

    def __init__(self, end_s: float = math.inf):
        self.end_s, self._known = math.inf, threading.Event()
        if end_s != math.inf:
            self.close(end_s)

    def close(self, end_s: float) -> None:
        self.end_s = float(end_s)
        self._known.set()

    @property
    def open(self) -> bool:
        return not self._known.is_set()

    def wait(self) -> float:
        """The end, once it is known."""
        self._known.wait()
        return self.end_s


class IdleClock:
    """What an idle-window job is handed: its window, its worker's clock, and its worker's
    ``policy`` (a job that trains against the policy uses the one where it runs).

    ``timed(kind, fn)`` runs ``fn()`` as the worker's next step of ``kind`` (one of
    :data:`IDLE_KINDS`) and returns ``(value, row)`` (the step's steps-table row, a copy): on
    the sim clock the step starts where the previous one ended, on the wall clock when it
    really starts; ``wait(seconds)`` inside it lets time pass without work (a job that
    stands in for a slower one). ``fits(seconds)``: whether a step of ``seconds`` starting now would end by
    the window's end (``end``, a :class:`WindowEnd`; always, while it is open). A step that
    ends past a known end is **preempted** there: its row ends at the end with ``preempted``
    set (``forward_s`` keeps the seconds it really took), and the job discards its work.

    ``recorder`` is the worker's ``rollout.worker.StepRecorder``: the window's rows are its
    rows, so that they join the worker's on one clock.

    An open window's end comes while the job runs, so steps may have ended past it before it
    was known: :meth:`settle` waits for the end and says how many of the job's latest whole
    steps did, for the job to discard (their rows cut as a preempted one).
    """

    def __init__(self, recorder, window: IdleWindow, policy,
                 end: WindowEnd | None = None):
        self.window, self._rec, self._first = window, recorder, len(recorder.rows)
        self.policy = policy
        self.end = end if end is not None else WindowEnd(window.end_s)
        self._in_flight: dict | None = None  # the row a step in flight will have, but its end

    @property
    def open(self) -> bool:
        """Whether the window's end is still unknown."""
        return self.end.open

    def now(self) -> float:
        """Where the next step would start on the step's clock."""
        return self._rec.now() if self._rec.clock == "wall" else self._rec.mark

    def fits(self, seconds: float) -> bool:
        return self.now() + seconds < self.end.end_s

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass on the worker's clock without work, inside a step of
        :meth:`timed` (``StepRecorder.wait``: slept on the wall clock, charged on the sim)."""
        self._rec.wait(seconds)

    def timed(self, kind: str, fn: Callable, batch_size: int = 0,
              tokens: int = 0) -> tuple[object, dict]:
        check_choice("an idle-window step's kind", kind, IDLE_KINDS)
        if self._rec.clock == "wall":
            self._rec.resume(0.0)  # the step starts now, on the step's clock
        self._in_flight = {"worker": self._rec.worker, "step": len(self._rec.rows), "kind": kind,
                           "start_s": self._rec.mark, "batch_size": batch_size,
                           "tokens": tokens, "forward_s": 0.0, "clock": self._rec.clock}
        try:
            value = self._rec.timed(kind, fn, batch_size, tokens)
        finally:
            self._in_flight = None
        row = self._rec.rows[-1]
        end = self.end.end_s  # read after the step: an open window may have closed meanwhile
        if row["end_s"] > end:
            self._cut(len(self._rec.rows) - 1, end)
        return value, dict(row)

    def settle(self, undoable: int) -> int:
        """Wait for the window's end; the number of this window's latest whole steps, at most
        ``undoable`` (as many as the job can undo), that ended past it: the first of them is
        cut at the end and flagged ``preempted``, the rows after it are dropped (they began
        after the step's last shard ended), and the job discards their work. Steps past the
        end that the job cannot undo keep their rows (``drafter_overrun_s`` then shows them).
        0 on a window whose end was known from the start (``timed`` preempted there)."""
        end = self.end.wait()
        rows = self._rec.rows
        late = [i for i in range(self._first, len(rows))
                if rows[i]["end_s"] > end and not rows[i].get("preempted")]
        late = late[len(late) - undoable:] if undoable else []
        if late:
            self._cut(late[0], end)
        return len(late)

    def rows_at(self, end_s: float) -> list[dict]:
        """This window's rows as they stand if it ends at ``end_s``, read from another thread
        while the job may still run (the wall clock's stop): the steps that ended by then,
        and the first that did not, or the one in flight, cut there and flagged
        ``preempted``; nothing after it."""
        rows = [dict(row) for row in self._rec.rows[self._first:]]
        in_flight = self._in_flight
        kept = [row for row in rows if row["end_s"] <= end_s]
        late = rows[len(kept):] or ([dict(in_flight)] if in_flight is not None else [])
        if late and late[0]["start_s"] < end_s:
            kept.append({**late[0], "end_s": end_s, "preempted": True})
        return kept

    def wasted_s(self) -> float:
        """Seconds of this window's preempted steps, whose work was discarded."""
        return float(sum(row["end_s"] - row["start_s"] for row in self._rec.rows[self._first:]
                         if row.get("preempted")))

    def _cut(self, i: int, end: float) -> None:
        self._rec.preempt(i, end)

    @property
    def rows(self) -> list[dict]:
        """The steps rows recorded in this window so far."""
        return [dict(row) for row in self._rec.rows[self._first:]]
