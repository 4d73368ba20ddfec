"""The settings of ``torch.compile`` that the compiled decode step (``rollout.compiled``)
runs under: inductor's options for its graphs, and dynamo's recompile limit, which is a
setting of each thread."""
from __future__ import annotations

import threading

import torch

__all__ = ["inductor_options", "raise_recompile_limit", "RECOMPILE_LIMIT"]


def inductor_options(cpp_wrapper: bool) -> dict:
    """Inductor's options for the step. ``emulate_precision_casts``: round where eager
    rounds (the norms' float32 for a float64 model, as HF does), so that compiled states
    equal eager ones. ``size_asserts`` off: the wrapper's check of every input's sizes and
    strides (some 60 a call) repeats what dynamo's guards have just checked. ``cpp_wrapper``:
    the wrapper that calls the kernels compiled to C++, not run in Python."""
    return {"emulate_precision_casts": True, "size_asserts": False, "cpp_wrapper": cpp_wrapper}


RECOMPILE_LIMIT = 512


class _Raised(threading.local):
    done = False  # whether this thread's dynamo limit is raised


_RAISED = _Raised()


def raise_recompile_limit() -> None:
    """Let dynamo keep ``RECOMPILE_LIMIT`` graphs of the step (8 a function by default): every
    compiled forward of the process shares the step's code, so its graphs add up over keys,
    models and runs. Dynamo's settings are per thread (``side_by_side`` runs on threads of
    their own), and a call may recompile on a thread other than the one that compiled its key
    (a graph its warm-up made, a guard the real inputs fail), so every compile and every call
    raise them on their thread: once a thread, a flag read after. (Torch 2.13's names.)"""
    if _RAISED.done:
        return
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, RECOMPILE_LIMIT)
    _RAISED.done = True
