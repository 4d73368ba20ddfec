"""Argument checks shared across layers: bad input gets an error that names it and what is
accepted, before anything runs."""
from __future__ import annotations

import numbers

__all__ = ["check_int", "check_fraction"]


def check_int(name: str, value, low: int) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an integer >= ``low`` (bools are
    refused: ``True`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def check_fraction(name: str, value) -> float:
    """``value`` as a float, or ``ValueError`` naming ``name`` unless it is a number in
    [0, 1] (bools refused, NaN fails the range)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)
