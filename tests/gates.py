"""Gates that put a rollout's events in a fixed order across its workers, whatever the load.

A test that needs one Ray actor's shard back first, or a drafter job to take its steps while
the other actor still decodes, used to slow the other actor by naps and hope the machine kept
up; under load it did not (issue 36). Here the other actor is *held* until the event has
happened: the event leaves a file in a folder that every actor of the session's local Ray
sees (the test's ``tmp_path``), and the held worker's schedule waits for that file before its
first decode step. Nothing is decided by how long anything takes.

- :class:`HeldOn`: plain decoding, but worker ``worker`` waits for ``signal`` before it
  decodes (its shard comes back after the signal, so the other one's comes back first);
- :class:`Together`: plain decoding, but every worker waits at its first decode step until
  all of them have come that far (a barrier: their shards decode at once);
- :class:`Signalled`: an idle job that signals as it goes: ``job-<worker>`` as it starts,
  ``step-<n>`` after its n-th step is recorded (its row's end read), and, with ``hold``, its
  step ``hold`` stays in flight until the test signals ``release`` (after the rollout came
  back: a driver that waited for the step in flight would wait :data:`WAIT_S`).

A gate that never opens raises (in the held worker) or goes on (a held step) after
:data:`WAIT_S`: a bug is a failure, never a hang.
"""
from __future__ import annotations

import time
from pathlib import Path

from workbench.rollout.schedule import PLAIN, PlainSchedule

__all__ = ["WAIT_S", "wait_for", "signal", "HeldOn", "Together", "Signalled"]

WAIT_S = 300.0  # the longest a gate waits for its signal (a loaded machine starts Ray slowly)


def signal(marks, name: str) -> None:
    """Say ``name`` happened (a file in ``marks``)."""
    (Path(marks) / name).touch()


def wait_for(marks, name: str, timeout_s: float = WAIT_S) -> bool:
    """Wait until ``name`` was signalled in ``marks``; False after ``timeout_s`` without it.
    Reads ``time.monotonic``, which no test's tick clock patches."""
    path, end = Path(marks) / name, time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


class HeldOn(PlainSchedule):
    """Plain decoding (tokens are plain decoding's); worker ``worker`` waits at its first
    decode step until ``signal`` is in ``marks``, and raises if it never comes."""

    def __init__(self, worker: int, marks, signal: str):
        self.worker, self.marks, self.signal, self.held = worker, str(marks), signal, True

    def plan(self, batch_size, worker):
        if worker == self.worker and self.held:
            if not wait_for(self.marks, self.signal):
                raise TimeoutError(f"worker {worker} held {WAIT_S:g} s for {self.signal!r}, "
                                   "which never came")
            self.held = False
        return PLAIN


class Together(PlainSchedule):
    """Plain decoding; each of ``workers`` signals ``at-<worker>`` at its first decode step
    and waits there until every one of them has (raises if one never comes)."""

    def __init__(self, workers, marks):
        self.workers, self.marks, self.waiting = tuple(workers), str(marks), True

    def plan(self, batch_size, worker):
        if self.waiting:
            signal(self.marks, f"at-{worker}")
            for other in self.workers:
                if not wait_for(self.marks, f"at-{other}"):
                    raise TimeoutError(f"worker {worker} waited {WAIT_S:g} s for worker "
                                       f"{other}, which never reached its first decode step")
            self.waiting = False
        return PLAIN


class Signalled:
    """``job`` (an idle job: ``rollout.idle.IdleJob``) that signals in ``marks`` (module
    docstring); everything else, ``settled`` included, is ``job``'s."""

    def __init__(self, job, marks, hold: int | None = None):
        self.job, self.marks, self.hold = job, str(marks), hold

    @classmethod
    def around(cls, job, marks, hold: int | None = None):
        """``job`` signalled (None stays None: no job for that window)."""
        return None if job is None else cls(job, marks, hold)

    def __getattr__(self, name):
        if name.startswith("__") or name in ("job", "marks", "hold"):
            raise AttributeError(name)  # unpickling looks up names before __dict__ is back
        return getattr(self.job, name)

    def run(self, window, clock):
        signal(self.marks, f"job-{window.worker}")
        return self.job.run(window, _SignallingClock(clock, self.marks, self.hold))


class _SignallingClock:
    """An ``IdleClock`` whose ``timed`` steps signal ``step-<n>`` once recorded, and hold
    step ``hold`` in flight until ``release``."""

    def __init__(self, clock, marks: str, hold: int | None):
        self._clock, self._marks, self._hold, self._steps = clock, marks, hold, 0

    def __getattr__(self, name):
        return getattr(self._clock, name)

    def timed(self, kind, fn, *args, **kw):
        number = self._steps + 1

        def step():
            if number == self._hold:
                wait_for(self._marks, "release")  # goes on after WAIT_S: the test then fails
            return fn()
        out = self._clock.timed(kind, step, *args, **kw)
        self._steps = number
        signal(self._marks, f"step-{number}")
        return out
