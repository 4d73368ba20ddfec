"""Argument types the commands share: each parses a value under the shared checks' policy
(``workbench.checks``), so a command line is refused with the same message a Python call
gets, through argparse's usage message and exit code 2."""
from __future__ import annotations

import argparse

from ..checks import check_int, check_positive

__all__ = ["positive_minutes", "count"]


def positive_minutes(text: str) -> float:
    """``--minutes`` as a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = text  # not a number: refused below with the text as typed
    try:
        return check_positive("minutes", value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def count(name: str):
    """A parser of ``--<name>`` as a count >= 1."""
    def parse(text: str) -> int:
        try:
            return check_int(name, int(text) if text.lstrip("-").isdigit() else text, 1)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse
