"""Environment variables set for one block: what processes started inside inherit.

The pipeline's kernels take their torch threads from ``OMP_NUM_THREADS``; a local Ray's
processes take the driver's path from ``PYTHONPATH``. Both set the variables while the
processes start, and put them back as they were afterwards.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

__all__ = ["environ"]


@contextmanager
def environ(**values: str):
    """``os.environ`` with ``values`` set while the block runs, as it was afterwards (a
    variable that was unset is unset again)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
