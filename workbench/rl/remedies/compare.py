"""The remedies compared the way a practitioner picks one: how much faster each step is, how
much of the data is stale, what accuracy it ends at, and how soon it reaches the accuracy the
baseline ends at.

Every function reads an ablation's two tables (``Ablation.history``: one row per variant,
seed and RL step, with ``step_s`` on the sim clock and, for the remedies,
``offpolicy_token_share``; ``Ablation.evals``: held-out greedy accuracy per variant, seed and
step, the step counting the RL steps done before it), so the measures redraw from a run's
files alone.

Glossary:

speedup              per (seed, RL step) the baseline's step time over the variant's, the
                     variants having run that step side by side; the median of these ratios
                     (``Ablation.paired_speedups``: a stall of the machine in one of them
                     moves one ratio, not the median).
off-policy share     the mean over the variant's RL steps of the share of trained tokens an
                     older policy version sampled (0 for a variant that trains on-policy
                     only: the baseline and TLT's).
noise                a final accuracy's cost against the baseline's is read against the
                     standard error of the difference of the two means over seeds,
                     sqrt(sd_v^2 / n_v + sd_b^2 / n_b): within 2 of them it is noise. So
                     is the baseline's own gain (its final mean against its start's): a gain
                     within noise is no target to race to, and time to accuracy then
                     decides nothing.
time to accuracy     the first point of the variant's accuracy curve (mean over seeds) at or
                     above ``target`` (the baseline's final accuracy), on the cumulative time
                     axis: the mean over seeds of the summed step times before that
                     evaluation; None where the curve never gets there. Only the evaluated
                     steps count (``eval_every``), so the times are as fine as the curve.
"""
from __future__ import annotations

import math

import pandas as pd

__all__ = ["accuracy_vs_time", "accuracy_over_seeds", "time_to_accuracy", "remedy_metrics",
           "remedy_table", "reading"]


def accuracy_vs_time(history: pd.DataFrame, evals: pd.DataFrame) -> pd.DataFrame:
    """Per variant and evaluated step: ``time_s`` (the mean over seeds of the sim seconds of
    the RL steps before that evaluation), ``accuracy`` and ``accuracy_sd`` (mean and
    standard deviation over seeds) and ``seeds`` (how many were evaluated there), in run
    order and by step."""
    h = history.sort_values(["variant", "seed", "step"])
    done = h.assign(time_s=h.groupby(["variant", "seed"])["step_s"].cumsum(),
                    step=h["step"] + 1)[["variant", "seed", "step", "time_s"]]
    start = h[h["step"] == h["step"].min()][["variant", "seed"]].assign(step=0, time_s=0.0)
    clock = pd.concat([start, done], ignore_index=True)
    e = evals.merge(clock, on=["variant", "seed", "step"], how="left")
    missing = e[e["time_s"].isna()]
    if len(missing):
        row = missing.iloc[0]
        raise ValueError(f"evaluation of {row['variant']!r} seed {row['seed']} after "
                         f"{row['step']} steps has no step times in the history; accepted: "
                         "evals and history of one ablation")
    return accuracy_over_seeds(e, list(dict.fromkeys(history["variant"])),
                               time_s=("time_s", "mean"))


def accuracy_over_seeds(evals: pd.DataFrame, order: list[str], **more) -> pd.DataFrame:
    """Per variant and evaluated step of ``evals`` (variant, seed, step, accuracy):
    ``accuracy`` and ``accuracy_sd`` (mean and standard deviation over the seeds evaluated
    there), ``seeds`` (how many) and ``accuracy_se`` (the mean's standard error, sd /
    sqrt(seeds): what the noise rule and the figures' bands read; NaN with one seed), and
    any ``more`` aggregations (pandas named aggregations), in the variants' ``order`` and by
    step."""
    out = evals.groupby(["variant", "step"]).agg(**more, accuracy=("accuracy", "mean"),
                                                 accuracy_sd=("accuracy", "std"),
                                                 seeds=("accuracy", "count")).reset_index()
    out["variant"] = pd.Categorical(out["variant"], order, ordered=True)
    out = out.sort_values(["variant", "step"]).reset_index(drop=True)
    out["variant"] = out["variant"].astype(str)
    out["accuracy_se"] = out["accuracy_sd"] / out["seeds"] ** 0.5
    return out


def time_to_accuracy(curves: pd.DataFrame, target: float) -> dict[str, float | None]:
    """Per variant of ``curves`` (``accuracy_vs_time``): the time its accuracy first reached
    ``target`` (within 1e-9), None where it never did."""
    out = {}
    for v, c in curves.groupby("variant", sort=False):
        reached = c[c["accuracy"] >= target - 1e-9]
        out[v] = float(reached["time_s"].iloc[0]) if len(reached) else None
    return out


def remedy_metrics(history: pd.DataFrame, evals: pd.DataFrame, speedups: dict) -> dict:
    """The flat scalars of notebook 11. Per variant ``v``: ``speedup_<v>`` (``speedups[v]``,
    the median of its paired step-time ratios over the baseline), ``offpolicy_share_<v>``,
    ``accuracy_final_<v>`` and ``accuracy_final_sd_<v>`` (mean and sd over seeds),
    ``accuracy_cost_se_<v>`` (the standard error of its difference from the baseline's,
    glossary; None with fewer than 2 seeds on either side), ``reward_final_<v>`` and
    ``reward_final_sd_<v>`` (the training reward of the last RL step, mean and sd over seeds,
    the sd None with one seed; with a ``reward`` column), ``response_len_<v>`` (the mean
    length of the responses it trained, over its steps and seeds; with a ``response_len``
    column: an early stop trains the groups that finish first, a bias toward short
    responses that this shows),
    ``time_to_accuracy_<v>`` (glossary), ``groups_per_step_<v>``
    (the mean groups trained a step, for a variant that records it: a remedy's step that
    trains fewer groups is cheaper for that alone); and
    ``accuracy_final_baseline``, ``accuracy_start``, ``accuracy_gain_se_baseline`` (the
    standard error of the baseline's gain from its first evaluation to its last, glossary:
    noise; None with fewer than 2 seeds), ``best_time_to_accuracy`` (the variant,
    the baseline among them, that first reached the baseline's final accuracy: the least
    time, ties to the first in run order; the baseline reaches it at the latest at its end)
    and ``best_time_to_accuracy_s``. The baseline must have run and been evaluated."""
    if "baseline" not in set(evals.get("variant", ())):
        raise ValueError("remedy_metrics compares with the baseline, which has no held-out "
                         f"evaluation here (evaluated: {sorted(set(evals.get('variant', ())))})"
                         "; accepted: an ablation with 'baseline' and eval_problems")
    curves = accuracy_vs_time(history, evals)
    first, last = (curves.groupby("variant", sort=False).nth(0).set_index("variant"),
                   curves.groupby("variant", sort=False).last())
    final = last["accuracy"]
    target = float(final["baseline"])
    se2, se2_first = last["accuracy_se"].fillna(0.0) ** 2, first["accuracy_se"].fillna(0.0) ** 2
    reach = time_to_accuracy(curves, target)
    base = history[history["variant"] == "baseline"]
    out = {"accuracy_start": float(curves.loc[curves["step"] == 0, "accuracy"].mean()),
           "accuracy_final_baseline": target,
           "accuracy_gain_se_baseline": float((se2["baseline"] + se2_first["baseline"]) ** 0.5)
           if last.loc["baseline", "seeds"] > 1 else None,
           "rollout_fraction_baseline": float(base["rollout_s"].sum() / base["step_s"].sum()),
           "idle_fraction_baseline": float(base["idle_fraction"].mean())}
    for v in curves["variant"].unique():
        out[f"speedup_{v}"] = float(speedups[v]) if v in speedups else 1.0
        out |= _trained(history[history["variant"] == v], v)
        out[f"accuracy_final_{v}"] = float(final[v])
        out[f"accuracy_final_sd_{v}"] = float(last.loc[v, "accuracy_sd"]) \
            if pd.notna(last.loc[v, "accuracy_sd"]) else 0.0
        out[f"accuracy_cost_se_{v}"] = float((se2[v] + se2["baseline"]) ** 0.5) \
            if min(last.loc[v, "seeds"], last.loc["baseline", "seeds"]) > 1 else None
        out[f"time_to_accuracy_{v}"] = reach[v]
    reached = [(t, v) for v, t in reach.items() if t is not None]
    best = min(reached, key=lambda tv: tv[0])  # min keeps the first of equal times
    out["best_time_to_accuracy"], out["best_time_to_accuracy_s"] = best[1], best[0]
    return out


def _trained(h: pd.DataFrame, v: str) -> dict:
    """What variant ``v`` trained on, from its rows ``h`` of the history: the groups a step
    (where recorded: the remedies'; the others train P), the off-policy share (0 where
    unrecorded: on-policy only), the last step's training reward (mean, and sd over seeds:
    None with one) and the trained responses' mean length, where those columns exist."""
    out = {}
    if "groups_trained" in h and pd.notna(h["groups_trained"].mean()):
        out[f"groups_per_step_{v}"] = float(h["groups_trained"].mean())
    stale = h["offpolicy_token_share"].mean() if "offpolicy_token_share" in h else None
    out[f"offpolicy_share_{v}"] = float(stale) if pd.notna(stale) else 0.0
    if "reward" in h:
        end = h.loc[h["step"] == h["step"].max(), "reward"]
        out[f"reward_final_{v}"] = float(end.mean())
        out[f"reward_final_sd_{v}"] = float(end.std()) if len(end) > 1 else None
    if "response_len" in h:
        out[f"response_len_{v}"] = float(h["response_len"].mean())
    return out


def _variants(m: dict) -> list[str]:
    """The variants of ``m`` (``remedy_metrics``), in run order: each has a ``speedup_``."""
    return [k.removeprefix("speedup_") for k in m if k.startswith("speedup_")]


def remedy_table(m: dict) -> pd.DataFrame:
    """``m`` (``remedy_metrics``) as one row per variant, in run order: ``speedup``,
    ``offpolicy_share``, ``groups_per_step`` (NaN for a variant that trains P groups a
    step), ``accuracy_final`` and ``accuracy_final_sd``, ``accuracy_cost`` (against the
    baseline's final accuracy) and ``accuracy_cost_se`` (glossary: noise),
    ``time_to_accuracy_s`` (NaN: never reached), ``reward_final`` and ``reward_final_sd``
    (NaN without rewards, or ``reward_final_sd`` with one seed), ``response_len`` (trained;
    NaN without lengths): the table to pick a remedy from, beside the accuracy-against-time
    figure."""
    variants = _variants(m)
    target = m["accuracy_final_baseline"]

    def value(key):
        return float("nan") if m.get(key) is None else m[key]
    return pd.DataFrame([{
        "variant": v, "speedup": m[f"speedup_{v}"],
        "offpolicy_share": m[f"offpolicy_share_{v}"],
        "groups_per_step": value(f"groups_per_step_{v}"),
        "accuracy_final": m[f"accuracy_final_{v}"],
        "accuracy_final_sd": m[f"accuracy_final_sd_{v}"],
        "accuracy_cost": m[f"accuracy_final_{v}"] - target,
        "accuracy_cost_se": value(f"accuracy_cost_se_{v}"),
        "time_to_accuracy_s": value(f"time_to_accuracy_{v}"),
        "reward_final": value(f"reward_final_{v}"),
        "reward_final_sd": value(f"reward_final_sd_{v}"),
        "response_len": value(f"response_len_{v}")} for v in variants])


def reading(m: dict) -> list[str]:
    """What ``m`` (``remedy_metrics``) says, sentence by sentence, from its numbers alone:
    the fastest step, who first reached the baseline's final accuracy (and whether that
    means anything: a baseline that gained nothing, or within noise, is no target), how much
    time the baseline's step left to take back, what each variant paid or gained in accuracy
    and whether that is beyond the seeds' noise, whether TLT's final training reward stayed
    within 2 sd of the run it speeds (it is lossless), whether TLT still pays beside a
    variant it ran with (Seer's scheduling, a remedy), whether TLT drafting with the
    model-free suffix drafter (``tlt_suffix``) pays against TLT with its EAGLE head, how
    they fare against TLT alone, and how much other work disturbed the run."""
    variants = _variants(m)
    others = [v for v in variants if v != "baseline"]
    lines = []
    if others:
        fast = max(others, key=lambda v: m[f"speedup_{v}"])
        lines.append(f"Fastest step: {fast}, {m[f'speedup_{fast}']:.2f}x the baseline's "
                     "(median of paired per-step ratios).")
    rf, idle = m["rollout_fraction_baseline"], m["idle_fraction_baseline"]
    lines.append(f"The baseline's rollout is {rf:.0%} of its step and its workers sit idle "
                 f"{idle:.0%} of it: the tail is what over-provisioning, partial rollouts and "
                 f"tail batching cut; async can hide at most the update ({1 - rf:.0%} of the "
                 "step) behind the next rollout.")
    decided, target_line = _target(m)
    lines.append(target_line)
    lines += [_variant_line(m, v) for v in others]
    lines += _lossless(m, variants)
    lines += _tlt_beside(m, variants)
    lines += _suffix_against_eagle(m, variants)
    if "tlt" in variants:
        lines += _against_tlt(m, others, decided)
    return lines + _disturbed(m)


def _disturbed(m: dict) -> list[str]:
    """How much other work disturbed the run (``workbench.clock``), and what that does to its
    figures: nothing on the sim clock (each worker's own thread CPU time), the figures
    themselves on the wall clock; nothing where the metrics do not say."""
    share = m.get("disturbed_share")
    if share is None or math.isnan(share):  # not measured (a history without usage columns)
        return []
    moved = ("the sim clock counts each worker's own CPU time, so the times above hold" if
             m.get("clock") == "sim" else "these are wall-clock times, which it stretched")
    return [f"Other work disturbed {share:.0%} of the run's measured seconds (CPU share "
            f"{m.get('cpu_share', float('nan')):.2f}): {moved}."]


def _target(m: dict) -> tuple[bool, str]:
    """Whether the baseline's final accuracy is a target worth racing to (it gained, beyond
    its seeds' noise where there are seeds to tell), and the line that says so."""
    target, start = m["accuracy_final_baseline"], m["accuracy_start"]
    gain_se = m.get("accuracy_gain_se_baseline")
    if target <= start:
        return False, (f"The baseline gained no held-out accuracy here ({start:.3f} to "
                       f"{target:.3f}), so every variant reaches it at once and time to "
                       "accuracy says nothing: the final accuracies below, and the "
                       "accuracy-against-time figure, are what tell the variants apart.")
    if gain_se is not None and _within_noise(target - start, gain_se):
        return False, (f"The baseline's held-out gain ({start:.3f} to {target:.3f}, "
                       f"{target - start:+.3f}) is within its seeds' noise (standard error "
                       f"{gain_se:.3f}): who first reaches it is noise as well, so time to "
                       "accuracy decides nothing here, and the choice rests on the speed per "
                       "step against what each variant pays, below.")
    return True, (f"First to the baseline's final accuracy {target:.3f}: "
                  f"{m['best_time_to_accuracy']}, after {m['best_time_to_accuracy_s']:.1f} s "
                  f"(the baseline: {m['time_to_accuracy_baseline']:.1f} s).")


def _within_noise(difference: float, se: float) -> bool:
    """The glossary's noise rule: a difference within 2 standard errors is noise."""
    return abs(difference) <= 2 * se


def _variant_line(m: dict, v: str) -> str:
    """What ``v`` bought and paid: speed per step, what it trained, its final accuracy
    against the baseline's and whether that is noise."""
    cost = m[f"accuracy_final_{v}"] - m["accuracy_final_baseline"]
    groups = m.get(f"groups_per_step_{v}")
    trains = "" if groups is None else f"{groups:.1f} groups trained a step, "
    if f"response_len_{v}" in m:
        trains += (f"trained responses {m[f'response_len_{v}']:.1f} tokens long on average "
                   f"(the baseline's {m['response_len_baseline']:.1f}), ")
    se = m.get(f"accuracy_cost_se_{v}")
    noise = "" if se is None else f", standard error {se:.3f}: " + (
        "within noise" if _within_noise(cost, se) else "beyond 2 standard errors")
    never = m[f"time_to_accuracy_{v}"] is None
    return (f"{v}: {m[f'speedup_{v}']:.2f}x per step, {trains}"
            f"{m[f'offpolicy_share_{v}']:.0%} of trained tokens off-policy, final accuracy "
            f"{m[f'accuracy_final_{v}']:.3f} ({cost:+.3f} against the baseline{noise})"
            + ("; never reached the baseline's final accuracy." if never else "."))


def _against_tlt(m: dict, others: list[str], decided: bool) -> list[str]:
    """The issue's question: does a remedy, or TLT beside one, beat TLT alone? On time to
    the baseline's final accuracy where that is a target (``_target``); otherwise on where
    they ended (above the baseline beyond noise) and on the speed per step."""
    if decided:
        t = m["time_to_accuracy_tlt"]
        if t is None:
            return []
        sooner = [v for v in others if v != "tlt" and m[f"time_to_accuracy_{v}"] is not None
                  and m[f"time_to_accuracy_{v}"] < t]
        return [f"Against TLT alone ({t:.1f} s to the target): "
                + (f"sooner: {', '.join(sooner)}." if sooner else
                   "no remedy or combination got there sooner in this run.")]
    cost = {v: m[f"accuracy_final_{v}"] - m["accuracy_final_baseline"] for v in others}
    above = [v for v in others if m.get(f"accuracy_cost_se_{v}") is not None and cost[v] > 0
             and not _within_noise(cost[v], m[f"accuracy_cost_se_{v}"])]
    quicker = [v for v in others if m[f"speedup_{v}"] > m["speedup_tlt"]]
    return ["Against TLT alone: no verdict on time to accuracy (above); ended above the "
            "baseline beyond 2 standard errors: " + (", ".join(above) or "none")
            + ("" if "tlt" in above else " (TLT did not)") + f"; per step faster than TLT's "
            f"{m['speedup_tlt']:.2f}x: " + (", ".join(quicker) or "none") + "."]


def _tlt_beside(m: dict, variants: list[str]) -> list[str]:
    """Whether TLT still pays beside each variant it ran with (``tlt+<v>`` and ``<v>`` both
    in the run: Seer's scheduling, a remedy): the ratio of their speedups per step over the
    baseline (medians of paired per-step ratios, so the ratio is approximate)."""
    lines = []
    for v in variants:
        inner = v.removeprefix("tlt+")
        if v == inner or inner not in variants:
            continue
        both, alone = m[f"speedup_{v}"], m[f"speedup_{inner}"]
        ratio = both / alone if alone > 0 else float("nan")
        verdict = "still pays" if ratio > 1 else "does not pay"
        lines.append(f"TLT beside {inner}: {v} {both:.2f}x per step against {inner}'s "
                     f"{alone:.2f}x (both over the baseline): TLT {verdict} beside it here "
                     f"({ratio:.2f}x).")
    return lines


def _suffix_against_eagle(m: dict, variants: list[str]) -> list[str]:
    """Whether TLT drafting with the suffix drafter over the rollout history (``tlt_suffix``:
    no weights, nothing trained on idle workers) pays against TLT drafting with its EAGLE head
    (``tlt``), both in the run: the ratio of their speedups per step over the baseline
    (medians of paired per-step ratios, so the ratio is approximate), and whether it pays
    against plain decoding at all."""
    if not {"tlt", "tlt_suffix"} <= set(variants):
        return []
    suffix, eagle = m["speedup_tlt_suffix"], m["speedup_tlt"]
    ratio = suffix / eagle if eagle > 0 else float("nan")
    return [f"TLT's drafter: with the suffix drafter (tlt_suffix) {suffix:.2f}x per step, with "
            f"the EAGLE head (tlt) {eagle:.2f}x (both over the baseline): the suffix drafter "
            f"{'pays' if ratio > 1 else 'does not pay'} against the EAGLE head here "
            f"({ratio:.2f}x), and {'pays' if suffix > 1 else 'does not pay'} against plain "
            "decoding."]


def _lossless(m: dict, variants: list[str]) -> list[str]:
    """TLT is lossless: its final training reward (with the EAGLE head, ``tlt``, or the
    suffix drafter, ``tlt_suffix``) against the baseline's, and each ``tlt+<remedy>``'s
    against its remedy's, within 2 of the reference's sd over seeds, where the rewards were
    recorded. With one seed there is no sd: only equality is read."""
    lines = []
    for v in [v for v in variants if v in ("tlt", "tlt_suffix") or v.startswith("tlt+")]:
        ref = v.removeprefix("tlt+") if v.startswith("tlt+") else "baseline"
        if f"reward_final_{v}" not in m or f"reward_final_{ref}" not in m:
            continue
        r, base, sd = m[f"reward_final_{v}"], m[f"reward_final_{ref}"], \
            m[f"reward_final_sd_{ref}"]
        head = f"{v} (lossless SD): final training reward {r:.3f} against {ref}'s {base:.3f}"
        if sd is None:
            lines.append(head + (": equal." if r == base else
                                 ": one seed, no spread to read the difference against."))
            continue
        verdict = "within" if abs(r - base) <= 2 * sd else "beyond"
        lines.append(f"{head} ± {sd:.3f} (sd over seeds): {verdict} 2 sd.")
    return lines
