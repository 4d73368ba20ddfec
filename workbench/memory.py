"""Handing freed memory back to the operating system between the steps of many runs.

Why: an ablation steps tens of RL runs in one process (``rl.ablation.runs.lockstep``). Each
run's policy update needs its activations at once (gigabytes at the lead setting, P 16 x G 16,
256 tokens), and glibc's malloc keeps the freed pages in its arenas, where the next run's
differently shaped tensors fragment them, so a process of many runs keeps growing. With
``malloc_trim(0)`` after each step, the resident set between steps falls back to about what
the runs hold (RESULTS.md, ``ablation_memory``: three runs of that setting stepped in turn,
with and without the trim).

A release costs a full garbage collection, which grows with the process's Python objects:
little beside a lead-setting RL step, but much of a tiny test run's step.
:class:`MemoryReleaser` therefore releases only after the resident set has grown by its
``threshold`` since the last release.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os

__all__ = ["release_memory", "resident_bytes", "MemoryReleaser"]


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def resident_bytes() -> int:
    """This process's resident set now (Linux ``/proc/self/statm``), in bytes: what
    :func:`release_memory` shrinks."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def release_memory() -> bool:
    """Collect garbage, then return malloc's free pages to the system (``malloc_trim(0)``);
    whether the C library could (False: only the collection ran)."""
    gc.collect()
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class MemoryReleaser:
    """``releaser()`` after each step: :func:`release_memory` when the resident set has
    grown by ``threshold`` bytes (256 MB by default) since the last release, or since the
    releaser was made; whether it released. The process then holds at most its resident
    set after the last release, plus ``threshold``, plus one step's peak."""

    def __init__(self, threshold: int = 256 * 2**20):
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise ValueError(f"threshold={threshold!r}: accepted a whole number of bytes >= 0")
        self.threshold, self.after = threshold, resident_bytes()

    def __call__(self) -> bool:
        if resident_bytes() - self.after < self.threshold:
            return False
        release_memory()
        self.after = resident_bytes()
        return True
