"""Each remedy's predicted end-to-end speedup on the logged steps, how it was got and its error;
and, for a workbench run, each variant's measured speedup to set beside the prediction.

Why end to end: a remedy speeds up the rollout alone, so the step's rollout time scales by the
simulated ratio and the rest of the step stays as logged; one bound needs no simulation at
all (the Amdahl bound of any rollout remedy).

Over-provisioning, APRIL, partial rollouts and tail batching are replayed over the logged
steps by ``cluster.remedies`` (``remedy_ratios``), and again at TLT's limit for TLT beside
each (``cluster.composed.bandit_cost``; those rows, async's and Seer's are
``diagnose.variants``'): the steps' groups, their response lengths as logged, are the stream
of prompts, and each remedy's step k is set beside the logged step k. Their error is the
remedy model's own, checked on a notebook 11 run (``cluster.remedy_check``,
``validated.remedy_error``); where none is recorded the row says so and names the check that
would give one. APRIL, partial rollouts and async buy their time by training on tokens an
older policy sampled: the row's method says how many (APRIL and partial, counted by the
replay) and that the lengths a changed policy would give are not modelled; a workbench run's
update on such tokens pays for their old log-probs (``cluster.composed.STALE_UPDATE``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..cluster.composed import bandit_cost, stale_update
from ..cluster.cost import StepCost
from ..cluster.remedies import (groups_of_timeline, inferred_max_batch, padded_work,
                                remedy_steps, update_fit)
from .steplog import StepLog
from .validated import RESULTS, remedy_error

__all__ = ["predict_remedies", "measured_speedups", "remedy_ratios", "e2e_speedup", "REPLAYED",
           "MEASURED_AS"]

REPLAYED = {
    "over_provisioning": ("overprovision", "over-provisioning: P + max(1, P // 2) groups, the "
                          "rollout ended when P finished, the rest aborted"),
    "april": ("april", "APRIL: over-provisioned as above, the unfinished responses carried "
              "into the next step and resumed"),
    "partial_rollouts": ("partial", "partial rollouts: each response grows by at most a "
                         "quarter of the length cap per step, resumed next step"),
    "tail_batching": ("tail_batching", "tail batching: over-provisioned as above, the "
                      "unfinished prompts deferred to a long round of their own once P wait")}
"""The remedies the diagnosis replays on ``cluster.remedies``: its row name -> (notebook 11's
variant, what the replay does)."""
MEASURED_AS = {"tlt": "tlt_bandit", "overprovision": "over_provisioning", "april": "april",
               "partial": "partial_rollouts", "tail_batching": "tail_batching",
               "async": "async_one_step", "seer_schedule": "seer_schedule",
               "seer_divided": "seer_divided", "tlt+overprovision": "tlt+over_provisioning",
               "tlt+april": "tlt+april", "tlt+partial": "tlt+partial_rollouts",
               "tlt+tail_batching": "tlt+tail_batching", "tlt+async": "tlt+async_one_step",
               "tlt+seer_divided": "tlt+seer_divided"}
"""A workbench run's variant -> the row of the diagnosis's remedies its measured speedup is
set beside (any other variant that is not the diagnosed one, notebook 04's: TLT's bandit
row)."""
STALE = ("off-policy: it trains on tokens an older policy sampled ({share:.0%} of the trained "
         "tokens in the replay), which the time leaves out; the lengths a changed policy would "
         "give are not modelled")


def _groups(log: StepLog, lays: dict, measured: dict) -> tuple[list, int, int | None]:
    """Per simulated step its groups' response lengths, the workers, the rows a worker
    decodes at once (a workbench run's timelines: as they show; a dump: no cap)."""
    if measured:
        steps = [measured[s] for s in lays]
        caps = {inferred_max_batch(t) for t in steps} - {None}
        return ([groups_of_timeline(t) for t in steps], steps[0].num_workers,
                max(caps) if caps else None)
    r = log.requests
    out = []
    for step in lays:
        mine = r[r["step"] == step]
        key = mine["group"] if "group" in mine else pd.Series(np.arange(len(mine)), mine.index)
        out.append([g["response_tokens"].to_numpy(np.int64)
                    for _, g in mine.groupby(key.to_numpy(), sort=False)])
    return out, next(iter(lays.values())).workers, None


def remedy_ratios(log: StepLog, lays: dict, measured: dict, cost: StepCost) -> pd.DataFrame:
    """``cluster.remedies.remedy_steps`` on the simulated steps (``replay.layouts``' steps, in
    order), at ``cost`` and, where it measured SD, at TLT's limit (``cluster.composed.
    bandit_cost``: rows ``tlt`` and ``tlt+<remedy>``): one row per step and remedy, its
    ``step`` the logged step it is set beside, ``ratio`` its rollout over the plain one at
    ``cost``, and ``rest_delta``: the seconds the rest of the step moves by. A workbench run's
    rest is its update, which pads its batch to the longest response: it moves by the slope
    of the logged rest against the plain step's padded batch (``cluster.remedies.
    update_fit``) x the change in that batch (``cluster.remedy_check``, ``update="padded"``),
    and a step that trains on stale tokens pays ``composed.STALE_UPDATE`` on it; other logs'
    rest stays as logged (0)."""
    groups, workers, max_batch = _groups(log, lays, measured)
    names = [v for v, _ in REPLAYED.values()]
    table = remedy_steps(groups, workers, cost, max_batch=max_batch, remedies=names)
    plain_s = table.loc[table["remedy"] == "plain", "rollout_s"].to_numpy()
    fast = bandit_cost(cost)
    if fast is not None:  # TLT beside each remedy: the same replay at TLT's step costs
        tlt = remedy_steps(groups, workers, fast, max_batch=max_batch, remedies=names)
        tlt["remedy"] = np.where(tlt["remedy"] == "plain", "tlt", "tlt+" + tlt["remedy"])
        tlt["ratio"] = tlt["rollout_s"].to_numpy() / plain_s[tlt["step"].to_numpy()]
        table = pd.concat([table, tlt], ignore_index=True)
    padded = log.format == "workbench"
    table["rest_delta"] = 0.0
    if padded:
        work, at = padded_work(table), table["step"].to_numpy()
        plain = work[(table["remedy"] == "plain").to_numpy()]  # one per step, in order
        s = log.steps.set_index("step").reindex(list(lays))
        rest = (s["step_s"] - s["rollout_s"]).to_numpy()
        _, slope = update_fit(plain, rest)
        moved = np.maximum(rest[at] + slope * (work - plain[at]), 0.0)
        table["rest_delta"] = stale_update(moved, table["offpolicy_token_share"]) - rest[at]
    table["step"] = np.asarray(list(lays))[table["step"].to_numpy()]
    table.attrs.update(workers=workers, max_batch=max_batch, padded=padded,
                       prompts_per_step=int(np.median([len(g) for g in groups])))
    return table


def e2e_speedup(steps: pd.DataFrame, tail: pd.DataFrame, ratio: str, rest_delta: str | None = None) -> float:
    """Summed logged steps over summed predicted ones (the rollout scaled by the simulated
    ratio, the rest as logged or moved by ``rest_delta`` seconds, never below 0), over the
    simulated steps the step log holds too (a rollout dump may hold steps the metrics do
    not); NaN where it holds none of them."""
    tail = tail[tail["step"].isin(steps["step"])]
    if not len(tail):
        return float("nan")
    s = steps.set_index("step").loc[tail["step"]]
    rest = (s["step_s"] - s["rollout_s"]).to_numpy()
    if rest_delta is not None:
        rest = np.maximum(rest + tail[rest_delta].to_numpy(), 0.0)
    return float(s["step_s"].sum() / (s["rollout_s"].to_numpy() * tail[ratio].to_numpy() + rest).sum())


def predict_remedies(split: pd.DataFrame, tail: pd.DataFrame | None, threshold: int,
                     error: dict | None, replayed: pd.DataFrame | None = None,
                     results=RESULTS) -> pd.DataFrame:
    """One row per remedy: ``remedy``, ``predicted_e2e_speedup`` (NaN where not predicted),
    ``method`` (how it was got, or why not), ``error`` and ``error_source`` (the simulator's
    validated error and the result that holds it; for the replayed remedies the remedy
    model's, from ``results``). ``replayed``: ``remedy_ratios``' table (None: the logs hold
    no per-request lengths)."""
    err = error["error"] if error else np.nan
    where = f"{error['figure']} of {error['result']}" if error else "no validation recorded"
    rows = []
    if tail is not None and "tlt_ratio" in tail:
        rows.append({"remedy": "tlt_threshold", "predicted_e2e_speedup": e2e_speedup(split, tail, "tlt_ratio"),
                     "method": f"simulated: SD below live batch {threshold}, drafter in idle windows",
                     "error": err, "error_source": where})
        rows.append({"remedy": "tlt_bandit", "predicted_e2e_speedup": e2e_speedup(split, tail, "bandit_ratio"),
                     "method": "simulated: the bandit's limit (cheapest arm per token at each batch)"
                               + (f", replayed at the run's {tail.attrs['bandit_cap']} rows a worker "
                                  "decodes at once" if tail.attrs.get("bandit_cap") else ""),
                     "error": err, "error_source": where})
    else:
        why = ("needs per-request lengths" if tail is None else "needs SD's speedup per batch")
        for name in ("tlt_threshold", "tlt_bandit"):
            rows.append({"remedy": name, "predicted_e2e_speedup": np.nan,
                         "method": f"not predicted: {why}", "error": np.nan, "error_source": ""})
    total, rollout = split["step_s"].sum(), split["rollout_s"].sum()
    if np.isfinite(rollout) and 0 < rollout < total:  # the rest of the step known
        rows.append({"remedy": "any_rollout_remedy_bound", "predicted_e2e_speedup": total / (total - rollout),
                     "method": "Amdahl bound from the logged times: a rollout of zero seconds, "
                               "the rest of the step as logged",
                     "error": 0.0, "error_source": "arithmetic on the logs"})
    rows += _replayed_rows(split, replayed, results)
    return pd.DataFrame(rows)


def _replayed_rows(split: pd.DataFrame, replayed: pd.DataFrame | None, results) -> list[dict]:
    """The rows of the remedies ``cluster.remedies`` replays (module docstring)."""
    rows = []
    for name, (variant, what) in REPLAYED.items():
        if replayed is None:
            rows.append({"remedy": name, "predicted_e2e_speedup": np.nan,
                         "method": f"not predicted: needs per-request lengths ({what})",
                         "error": np.nan, "error_source": ""})
            continue
        mine = replayed[replayed["remedy"] == variant]
        ratio = pd.DataFrame({"step": mine["step"].to_numpy(), "ratio": mine["ratio"].to_numpy(),
                              "rest": mine["rest_delta"].to_numpy()})
        P, padded = replayed.attrs.get("prompts_per_step"), replayed.attrs.get("padded")
        method = (f"simulated ({what}) over the logged steps' lengths, the rest of the step "
                  + ("moved with its padded batch (responses trained x the longest)" if padded
                     else "as logged")
                  + f": trains {mine['groups_trained'].mean():.3g} groups per step (P = {P})")
        if variant == "tail_batching":
            method += f", {mine['long_round'].mean():.0%} of the steps long rounds"
        if variant in ("april", "partial"):
            method += "; " + STALE.format(share=mine["offpolicy_token_share"].mean())
        err = remedy_error(variant, results, padded)
        rows.append({"remedy": name, "predicted_e2e_speedup": e2e_speedup(split, ratio, "ratio", "rest"),
                     "method": method, "error": err["error"] if err else np.nan,
                     "error_source": f"{err['figure']} of {err['result']}" if err else
                     f"not validated yet: cluster.remedy_check.check_remedies on a notebook 11 "
                     f"run folder holding the baseline's timelines and {variant!r} would give "
                     f"remedy_sim_error_{variant}" + ("_padded_update" if padded else "")})
    return rows


def measured_speedups(log: StepLog) -> pd.DataFrame | None:
    """A workbench run's measured end-to-end speedup of every variant over the diagnosed one:
    summed steps over summed steps (``Ablation``'s ``e2e_speedup``), of the diagnosed seed and
    over every seed."""
    h = log.extra.get("history")
    if h is None:
        return None
    base = h[h["variant"] == log.extra["variant"]]
    rows = []
    for variant, mine in h.groupby("variant", sort=False):
        seed = log.extra["seed"]
        rows.append({"variant": variant,
                     "measured_e2e_speedup_seed": float(
                         base.loc[base["seed"] == seed, "step_s"].sum()
                         / mine.loc[mine["seed"] == seed, "step_s"].sum()),
                     "measured_e2e_speedup": float(base["step_s"].sum() / mine["step_s"].sum()),
                     "seeds": int(mine["seed"].nunique())})
    return pd.DataFrame(rows)
