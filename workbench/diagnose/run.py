"""The diagnosis in one call, as ``workbench diagnose`` runs it: read, check, diagnose, write.

Why its own function: the command line and notebook 12 must refuse the same bad inputs the
same way, before anything is written (the out folder first, then the logs, the baseline and
the curve are read and checked, and only a finished diagnosis is written)."""
from __future__ import annotations

import os
from pathlib import Path

from .diagnosis import Diagnosis, diagnose
from .logs import read_logs
from .report import check_out, write_diagnosis

__all__ = ["diagnose_logs"]


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
