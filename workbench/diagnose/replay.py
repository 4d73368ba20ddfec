"""The logged steps replayed on the cluster simulator: each step's requests laid out on the
workers (a workbench run: as its saved timelines recorded them; a dump: dealt round-robin over
``workers``, one batch per worker) and simulated plain, with TLT's threshold rule and with the
bandit's limit, at measured step costs where the run saved them, else at synthetic ones.

Why synthetic costs are shaped so: a plain step of relative cost 1 + b / ``SATURATION`` at
live batch b (decoding is memory-bound below it, so a larger batch costs little more) and an
SD step ``speedup(b)`` times cheaper per token, ``speedup`` being the user's own curve; the
prediction then rests on the one fact the logs lack and the user gives.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..cluster.cost import StepCost
from ..cluster.importers import trace_from_timeline
from ..cluster.simulate import Layout, layout, simulate_rollout
from ..rollout.timeline import Timeline
from .sd_curve import sd_speedup
from .steplog import StepLog

__all__ = ["synthetic_cost", "measured_curve", "layouts", "simulate", "SATURATION", "SD_KIND"]

SATURATION = 64          # live batch at which a plain step costs twice a batch-1 step (assumed)
SD_KIND = "chain:k=4"    # the name the user's SD runs under in the synthetic step costs
MAX_STEPS = 40           # steps simulated at most (evenly spaced over the run)


def synthetic_cost(curve: pd.DataFrame | None, max_batch: int) -> StepCost:
    """Relative step costs at every batch 1..max_batch: plain 1 + b / SATURATION; with a
    curve, ``SD_KIND`` at plain(b) / speedup(b) (tau 1: the speedup carries it)."""
    b = np.arange(1, max(2, max_batch) + 1)
    plain = 1.0 + b / SATURATION
    rows = [pd.DataFrame({"batch_size": b, "kind": "plain", "seconds": plain, "tau": 1.0})]
    if curve is not None:
        rows.append(pd.DataFrame({"batch_size": b, "kind": SD_KIND,
                                  "seconds": plain / sd_speedup(curve, b), "tau": 1.0}))
    return StepCost(pd.concat(rows, ignore_index=True))


def measured_curve(cost: StepCost) -> pd.DataFrame | None:
    """SD's speedup per batch from measured step costs: plain's seconds per token over the
    best speculative kind's, at every batch size either measured."""
    sd = [k for k in cost.arms if k != "plain"]
    if not sd:
        return None
    sizes = np.unique(cost.table.loc[cost.table["kind"].isin(["plain", *sd]), "batch_size"])
    best = np.min([cost.seconds(k, sizes) / cost.tau(k, sizes) for k in sd], axis=0)
    return pd.DataFrame({"batch_size": sizes.astype(int),
                         "speedup": cost.seconds("plain", sizes) / best})


def _deal(lengths: np.ndarray, workers: int) -> Layout:
    """Requests dealt round-robin (request i to worker i mod N), one batch per worker."""
    per = int(np.ceil(len(lengths) / workers))
    response = np.zeros(workers * per, np.int64)
    response[:len(lengths)] = lengths
    response = response.reshape(per, workers).T.copy()
    return Layout(response, np.zeros_like(response))


def _chosen(steps: pd.Series) -> list[int]:
    """At most MAX_STEPS step numbers, evenly spaced over the run."""
    s = sorted(steps.unique())
    return [s[i] for i in np.unique(np.linspace(0, len(s) - 1, min(len(s), MAX_STEPS)).astype(int))]


def _calibration(log: StepLog) -> list[Timeline]:
    """The timelines the step costs are measured on: notebook 04's baseline and static SD
    (``cluster.run_check.CALIBRATION_VARIANTS``), or, where static SD did not run (notebook
    11), the baseline and TLT (its adaptive engine's plain and speculative steps)."""
    from ..cluster.run_check import CALIBRATION_VARIANTS
    where, folder, seed = log.extra["timeline_dir"], log.extra["folder"], log.extra["seed"]

    def saved(variant):
        return sorted((folder / where.format(variant=variant, seed=seed)).glob("step*"))
    sd = next((v for v in (*CALIBRATION_VARIANTS[1:], "tlt") if saved(v)), None)
    return [Timeline.load(p) for v in (CALIBRATION_VARIANTS[0], sd) if v for p in saved(v)]


def layouts(log: StepLog, workers: int | None) -> tuple[dict, dict, StepCost | None]:
    """step -> Layout, step -> measured Timeline (workbench runs), measured costs or None."""
    if log.timelines:
        calib = _calibration(log)
        measured = {int(p.name.removeprefix("step")): Timeline.load(p) for p in log.timelines}
        keep = set(_chosen(pd.Series(list(measured))))
        measured = {s: t for s, t in measured.items() if s in keep}
        lays = {s: layout(trace_from_timeline(t)) for s, t in measured.items()}
        try:  # timelines saved without the schedule's plan columns measure no step cost
            cost = StepCost.from_timelines(calib) if calib else None
        except ValueError:
            cost = None
        return lays, measured, cost
    if log.requests is None or workers is None:
        return {}, {}, None
    r = log.requests
    return ({int(s): _deal(r.loc[r["step"] == s, "response_tokens"].to_numpy(), workers)
             for s in _chosen(r["step"])}, {}, None)


def _decode_rows(t: Timeline) -> pd.DataFrame:
    s = t.steps[t.steps["kind"].isin(["decode", "verify"])]
    return pd.DataFrame({"batch_size": s["batch_size"].to_numpy(),
                         "seconds": (s["end_s"] - s["start_s"]).to_numpy()})


def simulate(log, lays, measured, cost, curve, threshold, drafter_step_s):
    """Per simulated step: the plain makespan, TLT's (threshold rule, bandit) ratios, the
    long-tail measures and the drafter steps its idle windows hold (seconds scaled to the
    logged rollout time)."""
    rows, decode, live = [], [], None
    logged = log.steps.set_index("step")["rollout_s"]
    sd = cost is not None and len(cost.arms) > 1
    strategy = (SD_KIND if SD_KIND in cost.arms else cost.arms[1]) if sd else None
    for step, lay in lays.items():
        plain = simulate_rollout(lay, cost)
        shown = measured.get(step, plain)  # measured tail figures where the run saved them
        row = {"step": step, "workers": lay.workers, "requests": int((lay.response > 0).sum()),
               "idle_fraction": shown.idle_fraction(), "tail_share": shown.tail_share(),
               "p99_over_p50": _p99_p50(lay.response[lay.response > 0]),
               "measured": step in measured}
        if sd and plain.makespan_s > 0:
            tlt = (simulate_rollout(lay, cost, threshold=threshold, strategy=strategy)
                   if threshold > 0 else plain)
            bandit = simulate_rollout(lay, cost, rule="bandit")
            row.update(tlt_ratio=tlt.makespan_s / plain.makespan_s,
                       bandit_ratio=bandit.makespan_s / plain.makespan_s)
            scale = (logged.get(step, np.nan) / plain.makespan_s)
            if drafter_step_s is not None and np.isfinite(scale):
                row["drafter_steps"] = int(sum(np.floor(w.seconds * scale / drafter_step_s + 1e-9)
                                               for w in tlt.idle_windows()))
        rows.append(row)
        decode.append(_decode_rows(plain))
        if live is None or step == list(lays)[len(lays) // 2]:
            live = plain.steps[plain.steps["kind"].isin(["decode", "verify"])][
                ["worker", "start_s", "end_s", "batch_size"]].assign(step=step)
    tail = pd.DataFrame(rows)
    d = pd.concat(decode, ignore_index=True)
    batch = d.groupby("batch_size", as_index=False)["seconds"].sum()
    batch["share"] = batch["seconds"] / batch["seconds"].sum()
    return tail, batch, live


def _p99_p50(lengths: np.ndarray) -> float:
    p50 = np.percentile(lengths, 50)
    return float(np.percentile(lengths, 99) / p50) if p50 > 0 else float("nan")
