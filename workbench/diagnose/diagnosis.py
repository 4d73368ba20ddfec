"""The diagnosis: from a run's own logs, where its step time goes, whether SD can pay at the
batch its rollout runs at, and what each remedy would buy on these steps.

Why: "SD made the benchmark faster but not my RL run" has a handful of causes (a reward or
update that dominates the step, a live batch above where SD pays, lengths that changed with
SD, a short tail), and each one is a number the logs already hold or a prediction the
cluster simulator makes from them. The recipe:

1. **Step split** (logged times): rollout, reward, log-probs, update and the rest, each a
   share of the step; the Amdahl bound of any rollout remedy is step / (step - rollout).
2. **The rollout's long tail** (per-request lengths, where the logs hold them): each step's
   requests laid out on the workers (a workbench run: as recorded; a dump: round-robin over
   ``workers``, one batch per worker), replayed plain by ``cluster.simulate_rollout``; idle
   fraction and tail share are ``Timeline``'s, p99/p50 is of the lengths. A workbench run's
   own saved timelines give its measured ones instead.
3. **Live batch against SD's crossover**: the share of decode time (summed over workers) at
   a live batch at or above B, the smallest batch where the user's curve says SD stops paying.
4. **Remedies**: TLT with the threshold rule (SD below B) and with the bandit's limit,
   simulated on each step; the step's rollout time scales by the simulated ratio and the rest
   of the step stays as logged. The step costs: a workbench run's measured ones (its
   baseline's plain steps and static SD's); otherwise a plain step of relative cost
   1 + b / ``SATURATION`` at live batch b (decoding memory-bound below it) and an SD step
   that is ``speedup(b)`` times cheaper per token. Remedies the simulator does not model are
   listed as such, with no number. Each prediction carries the simulator's validated error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..checks import check_int, check_positive
from ..cluster.cost import StepCost
from ..cluster.importers import trace_from_timeline
from ..cluster.simulate import Layout, layout, simulate_rollout
from ..rollout.timeline import Timeline
from .logs import PARTS, StepLog
from .sd_curve import crossover, read_sd_curve, sd_speedup
from .validated import RESULTS, headline_error

__all__ = ["Diagnosis", "diagnose", "SATURATION", "SD_KIND", "NOT_SIMULATED"]

SATURATION = 64          # live batch at which a plain step costs twice a batch-1 step (assumed)
SD_KIND = "chain:k=4"    # the name the user's SD runs under in the synthetic step costs
MAX_STEPS = 40           # steps simulated at most (evenly spaced over the run)
REWARD_BOUND, TAIL_BOUND, LENGTH_CHANGE = 0.30, 0.30, 0.10
NOT_SIMULATED = {
    "over_provisioning": "over-provisioning (end the rollout when the target groups finish)",
    "april": "APRIL (active partial rollouts: over-provision, carry unfinished responses over)",
    "partial_rollouts": "partial rollouts (cap each step's tokens, resume next step)",
    "tail_batching": "tail batching (gather the long requests into a later round)"}


@dataclass
class Diagnosis:
    """What ``diagnose`` found: tables (``steps``: each step's parts and shares; ``tail``:
    the rollout's long tail per simulated step; ``batch``: decode time per live batch size;
    ``remedies``: each remedy's predicted end-to-end speedup, how it was got and its error),
    ``findings`` (each a ``cause`` code and its ``sentence``, the bottleneck first),
    ``undecided`` (what the logs could not decide, naming the missing field) and
    ``summary`` (the scalars of diagnosis.json)."""

    steps: pd.DataFrame
    tail: pd.DataFrame | None
    batch: pd.DataFrame | None
    remedies: pd.DataFrame
    findings: list[dict]
    undecided: list[str]
    summary: dict
    curve: pd.DataFrame | None = None
    live: pd.DataFrame | None = None  # one step's live batch per worker over time (a figure)
    measured: pd.DataFrame | None = None  # a workbench run: each variant's measured speedup
    notes: list[str] = field(default_factory=list)

    @property
    def causes(self) -> list[str]:
        return [f["cause"] for f in self.findings]

    @property
    def bottleneck(self) -> str | None:
        return self.findings[0]["cause"] if self.findings else None

    def reading(self) -> str:
        """The plain-language reading: one line per finding, then what stayed undecided."""
        lines = [f"- {f['sentence']}" for f in self.findings]
        lines += [f"- could not decide: {u}" for u in self.undecided]
        return "\n".join(lines)


# ---- step costs and layouts --------------------------------------------------------------
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


def _measured_curve(cost: StepCost) -> pd.DataFrame | None:
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


def _layouts(log: StepLog, workers: int | None) -> tuple[dict, dict, StepCost | None]:
    """step -> Layout, step -> measured Timeline (workbench runs), measured costs or None."""
    if log.timelines:
        from ..cluster.run_check import CALIBRATION_VARIANTS
        where = log.extra["timeline_dir"]
        calib = [Timeline.load(p) for v in CALIBRATION_VARIANTS for p in sorted(
            (log.extra["folder"] / where.format(variant=v, seed=log.extra["seed"])).glob("step*"))]
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


# ---- the parts of the diagnosis -------------------------------------------------------------
def _split(log: StepLog) -> pd.DataFrame:
    steps = log.steps.copy()
    for part in (*PARTS, "other_s"):
        steps[part.replace("_s", "_share")] = steps[part] / steps["step_s"]
    if steps["response_max"].notna().any():
        steps["max_over_mean"] = steps["response_max"] / steps["response_mean"]
    return steps


def _decode_rows(t: Timeline) -> pd.DataFrame:
    s = t.steps[t.steps["kind"].isin(["decode", "verify"])]
    return pd.DataFrame({"batch_size": s["batch_size"].to_numpy(),
                         "seconds": (s["end_s"] - s["start_s"]).to_numpy()})


def _simulate(log, lays, measured, cost, curve, threshold, drafter_step_s):
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


def _e2e(steps: pd.DataFrame, tail: pd.DataFrame, ratio: str) -> float:
    """Summed logged steps over summed predicted ones (the rollout scaled by the simulated
    ratio, the rest as logged), over the simulated steps."""
    s = steps.set_index("step").loc[tail["step"]]
    rest = s["step_s"] - s["rollout_s"]
    return float(s["step_s"].sum() / (s["rollout_s"] * tail[ratio].to_numpy() + rest).sum())


def _remedies(split, tail, threshold, error, sd_known) -> pd.DataFrame:
    err = error["error"] if error else np.nan
    where = f"{error['figure']} of {error['result']}" if error else "no validation recorded"
    rows = []
    if tail is not None and "tlt_ratio" in tail:
        rows.append({"remedy": "tlt_threshold", "predicted_e2e_speedup": _e2e(split, tail, "tlt_ratio"),
                     "method": f"simulated: SD below live batch {threshold}, drafter in idle windows",
                     "error": err, "error_source": where})
        rows.append({"remedy": "tlt_bandit", "predicted_e2e_speedup": _e2e(split, tail, "bandit_ratio"),
                     "method": "simulated: the bandit's limit (cheapest arm per token at each batch)",
                     "error": err, "error_source": where})
    else:
        why = ("needs per-request lengths" if tail is None else "needs SD's speedup per batch")
        for name in ("tlt_threshold", "tlt_bandit"):
            rows.append({"remedy": name, "predicted_e2e_speedup": np.nan,
                         "method": f"not predicted: {why}", "error": np.nan, "error_source": ""})
    total, rollout = split["step_s"].sum(), split["rollout_s"].sum()
    if np.isfinite(rollout) and 0 < rollout < total:  # the rest of the step known
        rows.append({"remedy": "any_rollout_remedy_bound", "predicted_e2e_speedup": total / (total - rollout),
                     "method": "Amdahl bound from the logged times: a rollout of zero seconds",
                     "error": 0.0, "error_source": "arithmetic on the logs"})
        rows.append({"remedy": "async_one_step", "predicted_e2e_speedup":
                     total / np.maximum(split["rollout_s"], split["step_s"] - split["rollout_s"]).sum(),
                     "method": "bound from the logged times (not simulated): the rollout of step "
                               "t+1 beside the rest of step t, each step the longer of the two",
                     "error": 0.0, "error_source": "arithmetic on the logs"})
    for name, what in NOT_SIMULATED.items():
        rows.append({"remedy": name, "predicted_e2e_speedup": np.nan,
                     "method": f"not modelled by the cluster simulator: {what}; notebook 11 "
                               "measures it on the small model", "error": np.nan, "error_source": ""})
    return pd.DataFrame(rows)


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


# ---- findings ------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _findings(log, split, tail, batch, curve, threshold, remedies, baseline) -> list[dict]:
    out = []
    m = split[[c for c in split if c.endswith("_share")]].mean()
    bound = remedies.set_index("remedy")["predicted_e2e_speedup"].get("any_rollout_remedy_bound")
    if curve is not None and curve["speedup"].iloc[0] < 1:
        out.append({"cause": "sd_slower_at_batch1", "sentence":
                    f"SD is slower than plain decoding already at batch {curve['batch_size'].iloc[0]} "
                    f"on your hardware ({curve['speedup'].iloc[0]:.2f}x): it cannot pay at any "
                    "live batch, so TLT's rollout gain is nil until the drafter or kernel is fixed"})
    if baseline is not None and baseline.has("response_mean") and log.has("response_mean"):
        base, mine = baseline.steps["response_mean"].mean(), log.steps["response_mean"].mean()
        if abs(mine / base - 1) > LENGTH_CHANGE:
            out.append({"cause": "lengths_changed_with_sd", "sentence":
                        f"with SD the mean response is {mine:.0f} tokens against {base:.0f} "
                        f"without ({100 * (mine / base - 1):+.0f}%): the rollouts changed length, "
                        "so the end-to-end times compare different work, not SD's speed"})
    for part, cause in (("reward", "reward_bound"), ("update", "update_bound"),
                        ("logprob", "logprob_bound")):
        share = m.get(f"{part}_share", np.nan)
        rest = [m.get(f"{p}_share", 0) for p in ("rollout", "reward", "logprob", "update")]
        if np.isfinite(share) and (share >= REWARD_BOUND or share >= np.nanmax(rest)):
            out.append({"cause": cause, "sentence":
                        f"the {part.replace('logprob', 'log-prob pass')} is {_pct(share)} of the "
                        f"step (the rollout {_pct(m.get('rollout_share', np.nan))})"
                        + (f": no rollout remedy can buy more than {bound:.2f}x"
                           if bound is not None else "")})
    if batch is not None and curve is not None and threshold > 0:
        above = float(batch.loc[batch["batch_size"] >= threshold, "share"].sum())
        if above >= 0.5:
            out.append({"cause": "sd_loses_at_live_batch", "sentence":
                        f"the live batch stays at or above {threshold} for {_pct(above)} of the "
                        "rollout's decode time, where SD loses on your hardware"})
    if tail is not None and tail["tail_share"].mean() >= TAIL_BOUND:
        gain = remedies.set_index("remedy")["predicted_e2e_speedup"].get("tlt_threshold")
        span = "on the rollout alone" if "step_s" in log.missing else "end to end"
        buys = f": TLT would buy about {gain:.2f}x {span}" if np.isfinite(gain) else ""
        out.append({"cause": "tail_bound", "sentence":
                    f"the tail holds {_pct(tail['tail_share'].mean())} of the rollout (idle "
                    f"fraction {_pct(tail['idle_fraction'].mean())}){buys}"})
    share = m.get("rollout_share", np.nan)
    if not out and np.isfinite(share) and bound is not None:
        out.append({"cause": "rollout_bound", "sentence":
                    f"the rollout is {_pct(share)} of the step: rollout remedies can buy up to "
                    f"{bound:.2f}x"})
    return out


def _undecided(log, curve, tail, workers) -> list[str]:
    out = []
    for part in PARTS:
        if part in log.missing:
            out.append(f"the {part[:-2]} share of the step: {part} is missing "
                       f"({log.missing[part]})")
    if tail is None:
        why = (f"requests is missing ({log.missing['requests']})" if "requests" in log.missing
               else "workers is missing: give the rollout's workers")
        out.append(f"the rollout's long tail (idle fraction, tail share, p99/p50) and the "
                   f"simulated remedies: {why}")
    if curve is None:
        out.append("where SD stops paying: SD's speedup per batch size on your hardware is the "
                   "missing fact; give a table (batch_size, speedup) or notebook 02's curve.csv")
    if workers is None and "workers" in log.missing and log.requests is not None:
        out.append(f"the layout of the requests: workers is missing ({log.missing['workers']})")
    return out


def diagnose(log: StepLog, sd_curve=None, workers: int | None = None,
             baseline: StepLog | None = None, drafter_step_s: float | None = None,
             results: str = RESULTS) -> Diagnosis:
    """Diagnose one run's logs (module docstring). ``sd_curve``: SD's speedup per batch
    size (``read_sd_curve``'s inputs; a workbench run's measured costs give one where none is
    passed). ``workers``: the rollout's workers (default: what the logs tell). ``baseline``:
    the same run without SD, whose lengths the SD run's are compared with. ``drafter_step_s``:
    one drafter training step's seconds (the drafter steps the idle windows hold)."""
    workers = check_int("workers", workers, 1, optional="from the logs")
    drafter_step_s = check_positive("drafter_step_s", drafter_step_s, optional="not counted")
    curve = read_sd_curve(sd_curve) if sd_curve is not None else None
    workers = workers or log.workers
    drafter_step_s = drafter_step_s or log.extra.get("drafter_step_s")
    lays, measured, cost = _layouts(log, workers)
    if curve is None and cost is not None:
        curve = _measured_curve(cost)
    threshold = crossover(curve) if curve is not None else 0
    split = _split(log)
    tail = batch = live = None
    if lays:
        if cost is None:
            cost = synthetic_cost(curve, max(int((lay.response > 0).sum(1).max())
                                             for lay in lays.values()))
        tail, batch, live = _simulate(log, lays, measured, cost, curve, threshold, drafter_step_s)
        workers = workers or int(tail["workers"].max())
    error = headline_error(results)
    remedies = _remedies(split, tail, threshold, error, curve is not None)
    findings = _findings(log, split, tail, batch, curve, threshold, remedies, baseline)
    undecided = _undecided(log, curve, tail, workers)
    means = log.means()
    summary = {"format": log.format, "source": log.source, "steps": int(len(split)),
               "workers": workers, "bottleneck": findings[0]["cause"] if findings else None,
               "causes": [f["cause"] for f in findings], "sd_threshold": threshold,
               **{f"mean_{k}": v for k, v in means.items()},
               **{f"{k}_share": float(split[f"{k}_share"].mean()) for k in
                  ("rollout", "reward", "logprob", "update", "other")},
               "missing": dict(log.missing), "undecided": undecided, "notes": list(log.notes),
               "simulator_error": error}
    if tail is not None:
        summary.update({k: float(tail[k].mean()) for k in ("idle_fraction", "tail_share",
                                                            "p99_over_p50")})
        if "drafter_steps" in tail:
            summary["drafter_steps_per_step"] = float(tail["drafter_steps"].mean())
    for _, r in remedies.iterrows():
        summary[f"predicted_{r['remedy']}"] = (None if pd.isna(r["predicted_e2e_speedup"])
                                              else float(r["predicted_e2e_speedup"]))
    measured_table = measured_speedups(log)
    if measured_table is not None:  # each SD variant against the simulator's TLT (bandit)
        predicted = summary.get("predicted_tlt_bandit")
        sd = measured_table["variant"] != log.extra["variant"]
        measured_table["predicted_e2e_speedup"] = np.where(sd, predicted or np.nan, np.nan)
        for col, of in (("error", "measured_e2e_speedup"), ("error_seed", "measured_e2e_speedup_seed")):
            measured_table[col] = (measured_table["predicted_e2e_speedup"] / measured_table[of] - 1)
        for _, r in measured_table.iterrows():
            summary[f"measured_e2e_speedup_{r['variant']}"] = r["measured_e2e_speedup"]
            summary[f"measured_e2e_speedup_{r['variant']}_seed"] = r["measured_e2e_speedup_seed"]
    return Diagnosis(split, tail, batch, remedies, findings, undecided, summary, curve, live,
                     measured_table, list(log.notes))
