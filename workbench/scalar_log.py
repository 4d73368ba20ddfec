"""A run's per-step scalars where researchers watch long runs: TensorBoard (``report_to``).

Why: the long RL runs here (hundreds of steps, hours) were watched through log files; TRL's
``report_to`` and veRL's ``trainer.logger`` send the same curves to TensorBoard, which a
researcher already has open. A run's loop hands each step's row (its history row, the same
numbers its table holds) to a :class:`ScalarLog`; ``report_to="tensorboard"`` writes them as
event files under the run's folder, ``"none"`` drops them.

- **Tags.** Every numeric value of a row is one scalar (bools as 0/1; strings and None
  skipped). Seconds (keys ending in ``_s``) are tagged with their clock, ``time_sim/step_s``
  or ``time_wall/update_s``, since a sim second and a wall second are not the same measure
  (``workbench.clock``); the rest keep their key (``reward``, ``loss``, ``kl_start``).
  :func:`tag_of` is the one mapping.
- **Two x axes.** The step is TensorBoard's step. Each event's wall time is the run's
  cumulative step seconds (on the row's clock) since the epoch, so TensorBoard's "Relative"
  axis reads the run's own (sim) time, and ``time_<clock>/cumulative_step_s`` holds it too.
- **Resume.** A run resumed at step T opens its log with ``purge_step=T``: TensorBoard's own
  convention, which drops whatever a crashed run wrote from step T on, so that the steps
  run again are shown once and earlier ones are never written twice. Its event file is
  named to be read after the crashed run's (:func:`_after_existing_files`).
- **Figures** go in as images when the run ends (:meth:`ScalarLog.figures`).
"""
from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .checks import check_choice

__all__ = ["REPORT_TO", "LOG_DIR", "ScalarLog", "TensorBoardLog", "scalar_log", "check_report_to",
           "scalars_of", "tag_of", "log_saved_figures"]

REPORT_TO = ("none", "tensorboard")
"""Where a run's scalars may go: nowhere, or TensorBoard."""
LOG_DIR = "tensorboard"  # a run's log folder, under the run's own folder
"""A run's log folder, under the run's own folder."""


def tag_of(key: str, clock: str | None) -> str:
    """The TensorBoard tag of a row's ``key``: seconds under their clock
    (``time_sim/step_s``), everything else its key."""
    return f"time_{clock or 'wall'}/{key}" if key.endswith("_s") else key


def scalars_of(row: Mapping) -> dict[str, float]:
    """The numeric values of ``row`` as floats, by tag (:func:`tag_of`, the row's ``clock``)."""
    clock = row.get("clock")
    return {tag_of(key, clock): float(value) for key, value in row.items()
            if isinstance(value, (numbers.Real, np.bool_))}


class ScalarLog:
    """Where a run's rows go: nowhere (``report_to="none"``), or a subclass's writer."""

    def row(self, step: int, row: Mapping) -> None:
        """Log one step's ``row`` (a history row) at ``step``."""

    def figures(self, figures: Mapping[str, object], step: int) -> None:
        """Log the run's ``figures`` (matplotlib figures, by name) at ``step``."""

    def close(self) -> None:
        """Flush and close."""

    def __enter__(self) -> "ScalarLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TensorBoardLog(ScalarLog):
    """Event files in ``log_dir``, through torch's ``SummaryWriter``.

    Args:
        log_dir: the folder (made if missing); one per run.
        resume_step: the step the run goes on from (0 for a fresh run): events a crashed run
            wrote from there on are purged (module docstring, "Resume").
        elapsed_s: the run's cumulative step seconds before ``resume_step``, so that the
            time axis goes on where it stood.
    """

    def __init__(self, log_dir, resume_step: int = 0, elapsed_s: float = 0.0):
        from torch.utils.tensorboard import SummaryWriter  # tensorboard: a default dependency
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _after_existing_files(self.log_dir)
        self.writer = SummaryWriter(str(self.log_dir),
                                    purge_step=resume_step if resume_step > 0 else None)
        self.elapsed_s = float(elapsed_s)

    def row(self, step: int, row: Mapping) -> None:
        step_s = row.get("step_s")
        if isinstance(step_s, (int, float)) and math.isfinite(step_s):
            self.elapsed_s += float(step_s)
        clock = row.get("clock") or "wall"
        for tag, value in {**scalars_of(row),
                           f"time_{clock}/cumulative_step_s": self.elapsed_s}.items():
            self.writer.add_scalar(tag, value, global_step=step, walltime=self.elapsed_s)
        self.writer.flush()

    def figures(self, figures: Mapping[str, object], step: int) -> None:
        for name, figure in figures.items():
            self.writer.add_figure(f"figures/{name}", figure, global_step=step, close=False)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


EVENT_FILES = "events.out.tfevents.*"


def _after_existing_files(log_dir: Path) -> None:
    """Wait, if need be, until a new event file's name sorts after every one in ``log_dir``.

    TensorBoard reads a folder's event files in name order. A name holds the second it was
    opened, then the host, the process and the process's count of writers so far, which does
    not sort as a number ("...9" after "...10"): a file opened in the same second as an
    earlier one of the same process could be read first, and then a resumed run's purge
    would come before the steps it drops. So a new file waits for the second after the
    newest one's (a wait only where a run resumes within a second of its last write)."""
    seconds = [int(part) for part in (p.name.split(".")[3] for p in log_dir.glob(EVENT_FILES))
               if part.isdigit()]
    if seconds:
        wait = max(seconds) + 1 - time.time()
        if wait > 0:
            time.sleep(wait)


def check_report_to(report_to: str, run_dir) -> str:
    """``report_to`` once it names a log (:data:`REPORT_TO`) and, for a file-backed one, the
    run has a folder ``run_dir`` to write it in; ``ValueError`` naming the bad value and what
    is accepted. A run checks this when it is built, before its first step."""
    check_choice("report_to", report_to, REPORT_TO)
    if report_to != "none" and run_dir is None:
        raise ValueError(f"report_to={report_to!r} needs the run's folder (run_dir or "
                         "checkpoint_dir), where its log goes; accepted: a folder path, or "
                         "report_to='none'")
    return report_to


def log_saved_figures(report_to: str, run_dir, step: int = 0) -> list[str]:
    """The PNG figures a run wrote in ``run_dir`` (a notebook's figures), as TensorBoard
    images at ``step`` in ``run_dir/tensorboard`` beside the run's curves, when ``report_to``
    is ``"tensorboard"``; their names (none with ``"none"``)."""
    check_choice("report_to", report_to, REPORT_TO)
    if report_to == "none":
        return []
    import matplotlib.image as mpimg
    names = []
    with TensorBoardLog(Path(run_dir) / LOG_DIR) as log:
        for png in sorted(Path(run_dir).glob("*.png")):
            image = mpimg.imread(png)  # H x W x C floats in [0, 1]
            log.writer.add_image(f"figures/{png.stem}", image, global_step=step,
                                 dataformats="HWC")
            names.append(png.stem)
        log.writer.flush()
    return names


def scalar_log(report_to: str, run_dir, resume_step: int = 0,
               elapsed_s: float = 0.0) -> ScalarLog:
    """The log ``report_to`` names for a run whose folder is ``run_dir`` (its events in
    ``run_dir/tensorboard``); ``ValueError`` naming a bad value or a missing folder, before
    anything is written."""
    if check_report_to(report_to, run_dir) == "none":
        return ScalarLog()
    return TensorBoardLog(Path(run_dir) / LOG_DIR, resume_step, elapsed_s)
