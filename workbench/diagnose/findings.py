"""The diagnosis's reading: its findings (each a ``cause`` code and a plain sentence, the
bottleneck first) and what the logs could not decide, each naming the missing field.

Why thresholds and not a score: each cause is one number the logs hold or the simulator
predicts, set against a bound a reader can check (a reward or update at least
``REWARD_BOUND`` of the step, a tail at least ``TAIL_BOUND`` of the rollout, lengths that
moved by more than ``LENGTH_CHANGE`` with SD), so every sentence can be verified from the
report's own tables.
"""
from __future__ import annotations

import numpy as np

from .steplog import PARTS

__all__ = ["findings_of", "undecided_of", "REWARD_BOUND", "TAIL_BOUND", "LENGTH_CHANGE",
           "PADDED_UPDATE"]

REWARD_BOUND, TAIL_BOUND, LENGTH_CHANGE = 0.30, 0.30, 0.10
PADDED_UPDATE = ("; one that trains fewer or shorter responses (as over-provisioning does) "
                 "cuts the padded update too and can pass it")
"""What the Amdahl bound's sentence adds for a workbench run, whose update pads its batch to
the longest response (``diagnose.remedies.remedy_ratios``)."""


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def findings_of(log, split, tail, batch, curve, threshold, remedies, baseline) -> list[dict]:
    """Each cause the numbers show, as ``{"cause", "sentence"}``, the bottleneck first; the
    rollout itself when no other cause shows and the rest of the step is known."""
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
                           if bound is not None else "")
                        + (PADDED_UPDATE if part == "update" and bound is not None
                           and log.format == "workbench" else "")})
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
                    f"fraction {_pct(tail['idle_fraction'].mean())}){buys}{_best_cut(remedies)}"})
    share = m.get("rollout_share", np.nan)
    if not out and np.isfinite(share) and bound is not None:
        out.append({"cause": "rollout_bound", "sentence":
                    f"the rollout is {_pct(share)} of the step: rollout remedies can buy up to "
                    f"{bound:.2f}x" + (PADDED_UPDATE if log.format == "workbench" else "")})
    return out


CUTS = {"over_provisioning": "over-provisioning", "april": "APRIL",
        "partial_rollouts": "partial rollouts", "tail_batching": "tail batching"}
STALE = ("april", "partial_rollouts")  # they train on tokens an older policy sampled


def _best_cut(remedies) -> str:
    """``"; of the remedies that cut the tail, <name> would buy about <x>"``: the replayed
    remedy with the largest predicted gain, where one was predicted; "" otherwise."""
    r = remedies.set_index("remedy")["predicted_e2e_speedup"].reindex(list(CUTS)).dropna()
    if not len(r):
        return ""
    best = r.idxmax()
    return (f"; of the remedies that cut the tail, {CUTS[best]} would buy about {r[best]:.2f}x"
            + (" (training on tokens an older policy sampled)" if best in STALE else ""))


def undecided_of(log, curve, tail, workers) -> list[str]:
    """What the logs could not decide, each naming the missing field and where it is read."""
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
