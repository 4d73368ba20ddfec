"""Measures over plain arrays that a timeline and a run's other work share: the one rule by
which work counts as disturbed (``usage_of``, ``usage_shares``) and response-length
percentiles. Kept apart from ``timeline`` so that work outside any timeline (a policy
update, an evaluation's lengths) is measured by the same functions."""
from __future__ import annotations

import numpy as np

from ..clock import DISTURBED_BELOW

__all__ = ["usage_of", "usage_shares", "length_percentiles"]


def usage_of(seconds, shares, below: float = DISTURBED_BELOW) -> dict[str, float]:
    """``measured_s``, ``disturbed_s`` and ``cpu_s`` (``Timeline.usage_s``) of pieces of work
    that took ``seconds`` and got ``shares`` of a core (``workbench.clock.cpu_share``): the
    one rule by which a piece under ``below`` counts as disturbed, for steps rows and for
    work outside them (a policy update)."""
    seconds = np.asarray(seconds, dtype=float)
    shares = np.asarray(shares, dtype=float)
    return {"measured_s": float(seconds.sum()),
            "disturbed_s": float(seconds[shares < below].sum()),
            "cpu_s": float((seconds * shares).sum())}


def usage_shares(usages: list[dict[str, float]]) -> dict[str, float]:
    """``disturbed_share`` (the share of the measured steps' seconds that were disturbed) and
    ``cpu_share`` (the CPU seconds they got over their seconds) of ``usages``
    (``Timeline.usage_s`` of each timeline of a run, or of one); NaN when no step recorded
    its share (tables saved before the column)."""
    measured = sum(u["measured_s"] for u in usages)
    if measured <= 0:
        return {"disturbed_share": float("nan"), "cpu_share": float("nan")}
    return {"disturbed_share": sum(u["disturbed_s"] for u in usages) / measured,
            "cpu_share": sum(u["cpu_s"] for u in usages) / measured}


def length_percentiles(lengths, qs=(50, 90, 99)) -> dict[str, float]:
    """``{"length_p50": ..., ...}`` of a sequence of token counts (NaN when empty)."""
    arr = np.asarray(list(lengths), dtype=float)
    if arr.size == 0:
        return {f"length_p{q}": float("nan") for q in qs}
    return {f"length_p{q}": float(np.percentile(arr, q)) for q in qs}
