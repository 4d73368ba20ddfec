"""The spool between the two processes of a two-core staleness run: one observation per RL step.

The trajectory process writes each step's :class:`Observation` after its rollout, before its
update; the observer process reads them in step order. Files are written atomically
(``workbench.atomic``), so a reader (or a resumed process) sees a whole observation or none.

Glossary:

observation   what steps 2) and 3) of a staleness step read: the policy's weights as they
              sampled the step, the step's ``RLStep`` (problems, the harvested
              ``RolloutResult``, rewards), and the rollout workers' step
              recorders (the clocks of the idle windows the adaptive drafter trains in).
consumed      the observer's progress: the first step it has not yet observed
              (``consumed.json``). Observations below it are done with; it deletes those its
              checkpoint covers (a resumed observer goes back to its checkpoint).
pending       observations at or past ``consumed``: what the trajectory is ahead by. It writes
              step ``s`` only while fewer than ``max_ahead`` steps below ``s`` are pending
              (bounded disk; a resumed trajectory writes again, identically, the steps it
              had written after its checkpoint).
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ...atomic import atomic_file
from ...checks import check_int
from ...rollout.backend import LocalBackend
from ..checkpoint import load_pickled
from ..grpo import RLStep

__all__ = ["Observation", "Spool", "replay_backend"]

_NAME = re.compile(r"observation_(\d+)\.pt")


@dataclass
class Observation:
    """One RL step as steps 2) and 3) of a staleness run need it (module docstring)."""

    step: int
    policy: dict              # the policy's state dict before the step's update
    rl: RLStep                # the step's rollout, harvested
    recorders: list           # the rollout workers' StepRecorders, one per worker


def replay_backend(policy, recorders: list) -> LocalBackend:
    """A local backend with one worker per recorder, each on ``policy`` and resuming its
    recorder: ``run_idle`` on it trains in the observed rollout's idle windows, on that
    rollout's clocks, as the trajectory's own backend would have."""
    backend = LocalBackend()
    backend.start(lambda w: policy, None, len(recorders))
    backend.replay_recorders(recorders)
    return backend


class Spool:
    """The spool folder ``folder`` (created if missing); the trajectory may run
    ``max_ahead`` steps ahead of the observer.

    ``wait_s``: the longest :meth:`wait_for_room` and :meth:`take` wait (None: as long as it
    takes; a ``TimeoutError`` names what was waited for)."""

    def __init__(self, folder: str | os.PathLike, max_ahead: int = 2,
                 wait_s: float | None = None, poll_s: float = 0.2):
        self.folder = Path(folder)
        if self.folder.is_file():
            raise ValueError(f"spool {str(folder)!r} is an existing file; it must be a folder")
        self.max_ahead = check_int("max_ahead", max_ahead, 1)
        self.wait_s, self.poll_s = wait_s, poll_s
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, step: int) -> Path:
        return self.folder / f"observation_{step:06d}.pt"

    def steps(self) -> list[int]:
        """The steps whose observations are on disk, in order."""
        return sorted(int(m.group(1)) for p in self.folder.iterdir()
                      if (m := _NAME.fullmatch(p.name)))

    @property
    def consumed(self) -> int:
        path = self.folder / "consumed.json"
        return json.loads(path.read_text())["consumed"] if path.is_file() else 0

    def mark_consumed(self, step: int) -> None:
        """The observer has observed every step below ``step``."""
        with atomic_file(self.folder / "consumed.json") as tmp:
            tmp.write_text(json.dumps({"consumed": step}))

    def pending(self, before: int | None = None) -> list[int]:
        """The steps on disk not yet observed (and below ``before``, when given)."""
        consumed = self.consumed
        return [s for s in self.steps() if consumed <= s and (before is None or s < before)]

    def put(self, observation: Observation) -> None:
        with atomic_file(self.path(observation.step)) as tmp:
            torch.save(observation, tmp)

    def drop_before(self, step: int) -> None:
        """Delete the observations of the steps below ``step``."""
        for s in self.steps():
            if s < step:
                self.path(s).unlink(missing_ok=True)

    def drop_from(self, step: int) -> None:
        """Delete the observations of ``step`` and after: what a trajectory resuming from its
        checkpoint at ``step`` writes again. Those on disk are a stopped run's, whose clocks
        may hold a pause or a load the new ones do not (a sim-clock step of a process
        stopped mid-rollout lasts the stop: its idle windows, and the drafter steps trained
        in them, grow with it); the observer must take the new ones."""
        for s in self.steps():
            if s >= step:
                self.path(s).unlink(missing_ok=True)

    def _wait(self, ready, what: str) -> None:
        start = time.monotonic()
        while not ready():
            if self.wait_s is not None and time.monotonic() - start > self.wait_s:
                raise TimeoutError(f"waited {self.wait_s} s for {what} in {str(self.folder)!r}")
            time.sleep(self.poll_s)

    def wait_for_room(self, step: int) -> None:
        """Wait until fewer than ``max_ahead`` observations below ``step`` (the one about to
        be written) are pending."""
        self._wait(lambda: len(self.pending(before=step)) < self.max_ahead,
                   f"the observer to take one of {self.max_ahead} pending observations")

    def take(self, step: int) -> Observation:
        """The observation of ``step``, once the trajectory has written it."""
        path = self.path(step)
        self._wait(path.is_file, f"the observation of step {step}")
        return load_pickled(path, "a staleness observation",
                            "delete it and start the trajectory process again to write it anew")
