"""Argument checks shared by every layer: bad input gets an error that names it and what is
accepted, before anything runs (docs/design.md, "Bad input gets a clear error").

One policy for every check, so that a value is accepted or refused the same way by a notebook
parameter, a config dataclass and a function argument:

- **The error** is a ``ValueError`` reading ``"<name> must be <what is accepted>, got
  <value!r>"``; a choice lists the accepted values.
- **Numbers** are ``numbers.Integral`` (counts) and ``numbers.Real`` (amounts): Python and
  numpy ints and floats alike. Strings, ``None`` (unless the check is ``optional``), tensors
  and other objects are refused; a count refuses floats, even ``3.0``.
- **Bools are refused wherever a number is expected**: ``True`` is neither a count nor a rate,
  although Python lets it pass for 1. A choice accepts a bool only when the set holds one.
- **NaN is refused everywhere; infinity too**, unless the check says ``allow_inf=True`` (a
  budget that may be unlimited, say).
- **Optional variants**: ``optional=True`` also accepts ``None`` (and returns it); a string
  says what ``None`` stands for, and the error repeats it (``optional="learned per bucket"``
  reads "must be None (learned per bucket) or an integer >= 1").
- Each check **returns the value normalised** (``int``, ``float``, the matching choice), so a
  caller can store what it checked.

This module imports nothing from the workbench (numpy only), so every layer may use it.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["check_int", "check_real", "check_positive", "check_non_negative", "check_fraction",
           "check_choice", "check_bool", "check_list"]

_BOOLS = (bool, np.bool_)  # numpy's bool is no int subclass, but it is a switch all the same


def _refuse(name: str, accepted: str, value, optional: bool | str) -> ValueError:
    """The one error of every check (``optional``: whether, and how, None is accepted)."""
    if optional:
        none = "None" if optional is True else f"None ({optional})"
        accepted = f"{none} or {accepted}"
    return ValueError(f"{name} must be {accepted}, got {value!r}")


def _interval(low, high, low_open: bool, high_open: bool, finite: bool) -> str:
    """What a range accepts, in words: ``a number in (0, 1]``, ``a finite number >= 0``."""
    noun = "a finite number" if finite else "a number"
    if low is not None and high is not None:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        return f"a number in {left}{low:g}, {high:g}{right}"
    bound = []
    if low is not None:
        bound.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bound.append(f"{'<' if high_open else '<='} {high:g}")
    tail = " (inf accepted)" if not finite else ""
    return " ".join([noun, *bound]) + tail


def check_int(name: str, value, low: int, high: int | None = None, *,
              optional: bool | str = False) -> int | None:
    """``value`` as an ``int`` if it is an integer in [``low``, ``high``] (no upper bound when
    ``high`` is None); else ``ValueError`` naming ``name``. Bools and floats are refused."""
    if value is None and optional:
        return None
    accepted = (f"an integer >= {low}" if high is None
                else f"an integer in [{low}, {high}]")
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low
            or (high is not None and value > high)):
        raise _refuse(name, accepted, value, optional)
    return int(value)


def check_real(name: str, value, low: float | None = None, high: float | None = None, *,
               low_open: bool = False, high_open: bool = False, allow_inf: bool = False,
               optional: bool | str = False) -> float | None:
    """``value`` as a ``float`` if it is a number in the range ``low``..``high`` (either bound
    may be None; ``low_open``/``high_open`` exclude the bound itself); else ``ValueError``
    naming ``name``. NaN is refused, and so is infinity unless ``allow_inf``."""
    if value is None and optional:
        return None
    accepted = _interval(low, high, low_open, high_open, finite=not allow_inf)
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not number or math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise _refuse(name, accepted, value, optional)
    if low is not None and (value <= low if low_open else value < low):
        raise _refuse(name, accepted, value, optional)
    if high is not None and (value >= high if high_open else value > high):
        raise _refuse(name, accepted, value, optional)
    return float(value)


def check_positive(name: str, value, *, allow_inf: bool = False,
                   optional: bool | str = False) -> float | None:
    """A number > 0 (a duration, a learning rate, a temperature of a softmax)."""
    return check_real(name, value, 0, low_open=True, allow_inf=allow_inf, optional=optional)


def check_non_negative(name: str, value, *, allow_inf: bool = False,
                       optional: bool | str = False) -> float | None:
    """A number >= 0 (a weight that may switch its term off, a delay)."""
    return check_real(name, value, 0, allow_inf=allow_inf, optional=optional)


def check_fraction(name: str, value, *, low_open: bool = False, high_open: bool = False,
                   optional: bool | str = False) -> float | None:
    """A probability or a share: a number in [0, 1] (either end excluded when told, e.g.
    ``top_p`` in (0, 1])."""
    return check_real(name, value, 0, 1, low_open=low_open, high_open=high_open,
                      optional=optional)


def _matching(value, choices: Sequence) -> tuple[bool, Any]:
    """Whether ``value`` equals one of ``choices``, and which (a bool matches only a bool, so
    ``True`` is not taken for 1; a value that cannot be compared matches nothing)."""
    for choice in choices:
        if isinstance(value, _BOOLS) != isinstance(choice, _BOOLS):
            continue
        try:
            if bool(value == choice):
                return True, choice
        except (TypeError, ValueError):  # an array compared element-wise, say
            continue
    return False, None


def check_choice(name: str, value, choices: Sequence, *, optional: bool | str = False):
    """The element of ``choices`` equal to ``value`` (a value from a fixed set: a mode, a
    kind, a schedule); else ``ValueError`` naming the value and listing every accepted one."""
    if value is None and optional:
        return None
    found, choice = _matching(value, choices)
    if not found:
        raise _refuse(name, "one of " + ", ".join(repr(c) for c in choices), value, optional)
    return choice


def check_bool(name: str, value) -> bool:
    """``value`` if it is ``True`` or ``False`` (a numpy bool too); 0, 1 and strings such as
    ``"false"`` are refused rather than read as a switch."""
    if not isinstance(value, _BOOLS):
        raise _refuse(name, "True or False", value, False)
    return bool(value)


def check_list(name: str, values, check_item: Callable[[str, Any], Any], what: str) -> list:
    """``values`` as a list of what ``check_item(f"{name}[{i}]", item)`` returns for each item,
    if it is a non-empty list, tuple or range of distinct items (``what`` says what one item
    is, e.g. ``"integers >= 0"``); else ``ValueError`` naming ``name``. An empty list is
    refused, since it leaves nothing to run or measure, and a repeated item, since it would
    run twice under one name; a string is no list of names."""
    accepted = f"a non-empty list of {what}, each once"
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)) \
            or not values:
        raise _refuse(name, accepted, values, False)
    items = [check_item(f"{name}[{i}]", value) for i, value in enumerate(values)]
    if len(set(items)) < len(items):
        raise _refuse(name, accepted, values, False)
    return items
