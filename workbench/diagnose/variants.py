"""The diagnosis's composed and scheduled variants, each simulated over the logged steps as
notebook 11 runs it: one-step async (alone and with TLT), TLT beside each replayed remedy,
and Seer's scheduling (alone and with TLT).

Why apart from ``diagnose.remedies``: those rows scale each step's rollout by one replayed
ratio; these change how a step's parts line up (async), or decode the replay at other step
costs (TLT beside a remedy), or place the requests otherwise (Seer), each by a model of the
cluster package:

- ``async_one_step``: ``cluster.composed.async_step_times`` over the logged steps, each its
  logged rollout and the rest of its step (a workbench run: its update, which pays
  ``composed.STALE_UPDATE`` on every step after the first; other logs' rest as logged, their
  old log-probs' pass already in it). The steps are taken as consecutive.
- ``tlt+async_one_step``: the same over the simulated steps, each rollout scaled by TLT's
  bandit ratio (the ``tlt_bandit`` row's).
- ``tlt+<remedy>``: ``remedies.remedy_ratios``' rows of the remedy replayed at TLT's limit
  (``composed.bandit_cost``), its rest moved as the remedy's is.
- ``seer_schedule``, ``seer_divided``, ``tlt+seer_divided``: each simulated step's requests as
  drawn (its groups in order) replayed by ``cluster.dispatch.simulate_dispatch`` under
  ``cluster.seer_check.SEER_POLICIES``' policy (the lengths predicted from the siblings, as
  ``seer_check`` replays them), at the rows a worker decodes at once; each over the static
  layout of the same requests at the same costs; TLT with Seer: the divided policy under the
  bandit's rule. A re-prefill is charged at the run's own prefill seconds per prompt token
  (a workbench run), else at the costs' prefill of one row per prompt token, else not at all.

The errors: Seer's variants quote the dispatch model's makespan error (``seer_sim_error_<v>``,
``cluster.seer_check``); the others the diagnosis's own check of that prediction where the
variant ran (``diagnose_error_<v>``, ``benchmarks/check_remedy_model.py``), or say that none is
recorded.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..cluster.composed import STALE_UPDATE, async_step_times
from ..cluster.dispatch import predicted_lengths, simulate_dispatch
from ..cluster.seer_check import SEER_POLICIES, prefill_seconds_per_token
from .remedies import REPLAYED, e2e_speedup
from .steplog import StepLog
from .validated import (DIAGNOSE_ERROR, RESULTS, SEER_ERROR, diagnose_error, figure_name,
                        recorded_error)

__all__ = ["seer_ratios", "capped_bandit", "variant_rows", "SEER_ROWS"]

SEER_ROWS = {"seer_schedule": ("seer_schedule", "plain"), "seer_divided": ("seer_divided", "plain"),
             "tlt+seer_divided": ("seer_divided", "bandit")}
"""Seer's rows: name -> (the Seer variant whose policy places the requests, the decode rule)."""
CHECK = "benchmarks/check_remedy_model.py on a notebook 11 run folder holding {variant!r}"


def _requests(log: StepLog, step: int, measured: dict):
    """A simulated step's requests as drawn: response tokens, group labels, prompt tokens
    (None where the logs hold none)."""
    if step in measured:
        r = measured[step].requests.sort_values(["prompt_id", "sample_idx"], kind="stable")
        return (r["response_tokens"].to_numpy(np.int64), r["prompt_id"].to_numpy(),
                r["prompt_tokens"].to_numpy(float))
    r = log.requests[log.requests["step"] == step]
    groups = r["group"].to_numpy() if "group" in r else np.arange(len(r))
    prompts = r["prompt_tokens"].to_numpy(float) if "prompt_tokens" in r else None
    return r["response_tokens"].to_numpy(np.int64), groups, prompts


def _reprefill(measured: dict, cost) -> float | None:
    """A re-prefill's seconds per context token (module docstring); None: the costs' own."""
    if measured:
        try:
            return prefill_seconds_per_token(list(measured.values()))
        except ValueError:  # the saved timelines hold no prefill
            pass
    return None if cost.has("prefill") else 0.0


def seer_ratios(log: StepLog, lays: dict, measured: dict, cost, max_batch: int | None
                ) -> pd.DataFrame:
    """Per simulated step (``lays``' steps), each of ``SEER_ROWS``' makespan over the static
    layout's of the same requests (module docstring): columns ``step`` and one per row name
    (``tlt+seer_divided`` only where ``cost`` measured SD)."""
    rows = []
    per_token = _reprefill(measured, cost)
    sd = len(cost.arms) > 1
    for step, lay in lays.items():
        tokens, groups, prompts = _requests(log, step, measured)
        guess = predicted_lengths(tokens, groups, "siblings")
        static = simulate_dispatch(tokens, lay.workers, cost, max_batch).makespan
        row = {"step": step}
        for name, (variant, rule) in SEER_ROWS.items():
            if rule == "bandit" and not sd:
                continue
            run = simulate_dispatch(tokens, lay.workers, cost, max_batch, SEER_POLICIES[variant],
                                    guess, prompts, rule, per_token,
                                    schedule_queues=variant == "seer_schedule")
            row[name] = run.makespan / static if static > 0 else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def capped_bandit(tail: pd.DataFrame, replayed: pd.DataFrame) -> pd.DataFrame:
    """``tail`` with its ``bandit_ratio`` the replay's at TLT's limit (``remedy_ratios``'
    ``tlt`` rows) where the run capped the rows a worker decodes at once: the replay refills
    each freed row as the engine does, where ``simulate``'s layout decodes each worker's
    requests as one batch, at live batches the run never reached. ``tail.attrs["bandit_cap"]``
    names the cap (None: ``tail`` as it was)."""
    cap = replayed.attrs.get("max_batch")
    tlt = replayed[replayed["remedy"] == "tlt"]
    if cap is None or not len(tlt) or "bandit_ratio" not in tail:
        return tail
    out = tail.assign(bandit_ratio=tail["step"].map(tlt.set_index("step")["ratio"]))
    out.attrs["bandit_cap"] = cap
    return out


def _row(name, predicted, method, err, missing: str) -> dict:
    """A row of the table; ``missing``: what the error source says where none is recorded."""
    return {"remedy": name, "predicted_e2e_speedup": predicted, "method": method,
            "error": err["error"] if err else np.nan,
            "error_source": f"{err['figure']} of {err['result']}" if err else
            f"not validated yet: {missing}"}


def _unchecked(variant: str) -> str:
    return (f"{CHECK.format(variant=variant)} would give "
            f"{DIAGNOSE_ERROR.format(variant=figure_name(variant))}")


def _async(split: pd.DataFrame, stale: float, scale: pd.DataFrame | None = None) -> float:
    """Summed logged steps over summed async steps (``scale``: per step a ``ratio`` of the
    rollout, over its steps alone)."""
    s = split[split["rollout_s"].notna() & split["step_s"].notna()]
    rollout = s["rollout_s"].to_numpy()
    if scale is not None:
        s = s[s["step"].isin(scale["step"])]
        rollout = s["rollout_s"].to_numpy() * scale.set_index("step").loc[s["step"], "ratio"].to_numpy()
    if not len(s):
        return float("nan")
    return float(s["step_s"].sum() / async_step_times(rollout, (s["step_s"] - s["rollout_s"]).to_numpy(),
                                                      stale).sum())


def variant_rows(split: pd.DataFrame, tail: pd.DataFrame | None, replayed: pd.DataFrame | None,
                 seer: pd.DataFrame | None, workbench: bool, results=RESULTS) -> list[dict]:
    """The rows of ``diagnose.remedies.predict_remedies``' table for the variants of this
    module (module docstring), in order: async, TLT beside each remedy, Seer's;
    ``workbench``: the logs are a workbench run's (its rest of a step is the update, which
    pays for stale tokens' old log-probs)."""
    return (_async_rows(split, tail, workbench, results) + _tlt_remedy_rows(split, replayed, results)
            + _seer_rows(split, seer, results))


def _async_rows(split, tail, workbench: bool, results) -> list[dict]:
    stale = STALE_UPDATE if workbench else 1.0
    charge = (f"the update x {STALE_UPDATE:g} on the stale steps (their old log-probs' "
              "forward)" if workbench else "the rest as logged")
    known = np.isfinite(split["rollout_s"]).any() and np.isfinite(split["step_s"]).any()
    bandit = known and tail is not None and "bandit_ratio" in tail
    scale = tail[["step", "bandit_ratio"]].rename(columns={"bandit_ratio": "ratio"}) if bandit else None
    return [_row("async_one_step", _async(split, stale) if known else np.nan,
                 "simulated over the logged steps: the rollout of step k+1 beside the update of "
                 f"step k, each step the longer of the two, {charge}; off-policy: every step "
                 "after the first trains on tokens the policy one update older sampled"
                 if known else "not predicted: needs the logged rollout and step times",
                 diagnose_error("async", results), _unchecked("async")),
            _row("tlt+async_one_step", _async(split, stale, scale) if bandit else np.nan,
                 "simulated: async as above, each rollout scaled by TLT's bandit ratio" if bandit
                 else "not predicted: needs SD's speedup per batch and the logged times",
                 diagnose_error("tlt+async", results), _unchecked("tlt+async"))]


def _tlt_remedy_rows(split, replayed, results) -> list[dict]:
    rows = []
    for name, (variant, what) in REPLAYED.items():
        mine = (replayed[replayed["remedy"] == f"tlt+{variant}"] if replayed is not None
                else pd.DataFrame())
        ratio = pd.DataFrame({"step": mine.get("step", []), "ratio": mine.get("ratio", []),
                              "rest": mine.get("rest_delta", [])})
        rows.append(_row(f"tlt+{name}", e2e_speedup(split, ratio, "ratio", "rest") if len(mine)
                         else np.nan, f"simulated: {what}, the replay decoding at TLT's limit "
                         "(the fewest seconds per token of any arm at each live batch)" if len(mine)
                         else "not predicted: needs per-request lengths and SD's step costs",
                         diagnose_error(f"tlt+{variant}", results),
                         _unchecked(f"tlt+{variant}")))
    return rows


def _seer_rows(split, seer, results) -> list[dict]:
    rows = []
    for name, (variant, rule) in SEER_ROWS.items():
        ok = seer is not None and name in seer
        ratio = seer[["step", name]].rename(columns={name: "ratio"}) if ok else None
        figure = SEER_ERROR.format(variant=variant)
        err, missing = ((recorded_error(figure, results), f"cluster.seer_check.check_seer on a "
                         f"notebook 11 run folder holding {variant!r} would give {figure}")
                        if rule == "plain" else (diagnose_error(name, results), _unchecked(name)))
        how = (f"simulated: each step's requests placed by Seer's {SEER_POLICIES[variant]} policy "
               "(lengths predicted from their siblings), "
               + ("TLT's bandit decoding, " if rule == "bandit" else "")
               + "over the static layout of the same requests; the rest as logged")
        rows.append(_row(name, e2e_speedup(split, ratio, "ratio") if ok else np.nan,
                         how if ok else "not predicted: needs per-request lengths"
                         + (" and SD's step costs" if rule == "bandit" else ""), err, missing))
    return rows
