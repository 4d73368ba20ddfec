"""The diagnosis in one call, as ``workbench diagnose`` runs it: read, check, diagnose, write.

Why its own function: the command line and notebook 12 must refuse the same bad inputs the
same way, before anything is written (the out folder first, then the logs, the baseline and
the curve are read and checked, and only a finished diagnosis is written)."""
from __future__ import annotations

import os
from pathlib import Path

from ..checks import check_choice, check_int, check_positive
from .diagnosis import Diagnosis, diagnose
from .logs import FORMATS, read_logs
from .report import check_out, write_diagnosis

__all__ = ["check_inputs", "diagnose_logs"]


def check_inputs(logs: str | os.PathLike, log_format: str | None = None,
                 workers: int | None = None, drafter_step_s: float | None = None) -> None:
    """Refuse, naming the bad value and what is accepted, a ``log_format`` not of
    ``FORMATS``, ``workers`` not an integer >= 1, ``drafter_step_s`` not > 0 (each may be None)
    and ``logs`` that do not exist, before anything is read in full or written (notebook 12
    checks its parameters so; ``diagnose_logs`` reads and checks the same)."""
    check_choice("log_format", log_format, FORMATS, optional="guessed from the logs")
    check_int("workers", workers, 1, optional="from the logs")
    check_positive("drafter_step_s", drafter_step_s, optional="not counted")
    if not Path(logs).exists():
        raise ValueError(f"logs {str(logs)!r} do not exist; accepted: a file or folder of one "
                         f"of {list(FORMATS)}")


def diagnose_logs(logs: str | os.PathLike, out: str | os.PathLike, format: str | None = None,
                  sd_curve=None, workers: int | None = None,
                  baseline: str | os.PathLike | None = None,
                  drafter_step_s: float | None = None, rollout_dump=None,
                  title: str | None = None) -> tuple[Path, Diagnosis]:
    """Diagnose the logs at ``logs`` (``read_logs``; ``baseline``: the same run's logs
    without SD, same format; ``rollout_dump``: veRL's rollout_data_dir) and write the report to ``out``; (its HTML page, the
    diagnosis). Raises ValueError naming the bad value and what is accepted."""
    check_out(out)
    log = read_logs(logs, format, rollout_dump=rollout_dump)
    base = read_logs(baseline, format or log.format) if baseline is not None else None
    diagnosis = diagnose(log, sd_curve=sd_curve, workers=workers, baseline=base,
                         drafter_step_s=drafter_step_s)
    page = write_diagnosis(diagnosis, out, title or f"Diagnosis of {Path(logs).name}")
    return page, diagnosis
