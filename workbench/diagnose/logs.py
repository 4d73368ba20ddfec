"""What RL frameworks actually log, read into one shape: a ``StepLog``.

Why: the question "why didn't TLT pay on my cluster?" starts from the logs a run already
wrote, not from a new run. This module picks the reader of a format (veRL, OpenRLHF, TRL:
:mod:`workbench.diagnose.frameworks`; a workbench run: :mod:`workbench.diagnose.workbench_runs`),
guessing the format from the files when none is given, and checks the options each reader
takes. The formats and the files their keys come from are in docs/diagnose.md.
"""
from __future__ import annotations

import os
from pathlib import Path

from .frameworks import read_openrlhf, read_trl, read_verl
from .log_rows import read_rows
from .steplog import PARTS, StepLog
from .workbench_runs import read_workbench

__all__ = ["StepLog", "read_logs", "read_verl", "read_openrlhf", "read_trl", "read_workbench",
           "FORMATS", "PARTS"]

FORMATS = ("verl", "openrlhf", "trl", "workbench")
"""The log formats `read_logs` reads, by name."""
OPTIONS = {"verl": ("rollout_dump",), "openrlhf": (), "trl": (), "workbench": ("variant", "seed")}


def read_logs(path: str | os.PathLike, format: str | None = None, **options) -> StepLog:
    """Read ``path`` as ``format`` (one of ``FORMATS``); without one, guessed: a folder
    with ``history.csv`` is a workbench run, ``trainer_state.json`` is TRL's, keys starting
    ``timing_s/`` or ``response_length/`` are veRL's, ``train/`` OpenRLHF's,
    ``completions/`` TRL's. ``options`` go to the format's reader."""
    if format is not None and format not in FORMATS:
        raise ValueError(f"format {format!r} is unknown; accepted: {list(FORMATS)}")
    path = Path(path)
    if not path.exists():
        raise ValueError(f"logs {str(path)!r} do not exist; accepted: a file or folder of "
                         f"one of the formats {list(FORMATS)} (docs/diagnose.md)")
    format = format or _guess(path)
    options = {k: v for k, v in options.items() if v is not None}
    accepted = OPTIONS[format]
    if set(options) - set(accepted):
        raise ValueError(f"{sorted(set(options) - set(accepted))} is no option of the "
                         f"{format} format; its options: {list(accepted)}")
    reader = {"verl": read_verl, "openrlhf": read_openrlhf, "trl": read_trl,
              "workbench": read_workbench}[format]
    return reader(path, **options)


def _guess(path: Path) -> str:
    if path.is_dir():
        if (path / "history.csv").is_file() or (path / "ablation.json").is_file():
            return "workbench"
        if (path / "trainer_state.json").is_file():
            return "trl"
        if any((path / n).is_file() for n in ("metrics.jsonl", "metrics.csv")):
            return "verl"
    elif path.name == "trainer_state.json":
        return "trl"
    else:
        keys = " ".join(map(str, read_rows(path, "any format").columns))
        for prefix, fmt in (("timing_s/", "verl"), ("response_length/", "verl"),
                            ("completions/", "trl"), ("train/", "openrlhf")):
            if prefix in keys:
                return fmt
    raise ValueError(f"cannot tell the format of {str(path)!r}; pass one of {list(FORMATS)}")
