"""A drafter's acceptance on an RL step's own rollout, exactly, without re-running the step.

SD is lossless: with coupled verification a speculative rollout reproduces the plain coupled
rollout token for token (docs/design.md, "Lossless means lossless"). So the trajectory's own
plain rollout needs no drafter, and any drafter's acceptance length tau on that step is
measured by decoding a few of the step's prompt groups again, speculatively, on one worker:
the same prompts in the same order under the same ``rl_step`` make the same requests (the
same uids, hence the same coupled draws), and the tokens must come out equal to the
trajectory's. That comparison is a free losslessness check at every step
(:class:`NotLosslessError` when it fails).

Glossary:

reference   the trajectory's outputs of the measured groups (``RequestOutput``s, in request
            order), what the speculative decode must reproduce.
position    a verify step's place in its response: the response tokens committed before it
            (its first emitted token's offset). Bucketed by ``bucket`` tokens, the emitted
            tokens per verify step by position are tau against response position.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from ..checks import check_int
from ..rollout import RolloutConfig, StaticSchedule
from ..speculative.measure import acceptance_length
from ..speedup import disturbed_share, interleave, per_repeat_ratios, spread_stats

__all__ = ["NotLosslessError", "TauMeasure", "measure_tau", "position_table",
           "group_speedups"]

POSITION_COLUMNS = ("position", "verify_steps", "emitted")


class NotLosslessError(RuntimeError):
    """A speculative decode whose tokens differ from the plain coupled rollout it must
    reproduce: the drafter, or the verification it went through, is not lossless."""


@dataclass
class TauMeasure:
    """One drafter on one step's measured groups: ``tau`` (acceptance length, docs/design.md),
    ``rows`` decoded, ``diverged`` (rows whose tokens differ from the reference; 0 whenever
    the check is strict, since it raises) and ``positions`` (:func:`position_table`)."""

    tau: float
    rows: int
    diverged: int
    positions: pd.DataFrame


def position_table(requests, bucket: int) -> pd.DataFrame:
    """Per response-position bucket (``position``: its first token offset, a multiple of
    ``bucket``): ``verify_steps`` and the tokens they ``emitted`` (module docstring). A row's
    verify steps follow the tokens no verify step emitted (the prefill's first token)."""
    check_int("bucket", bucket, 1)
    rows = []
    for r in requests:
        pos = len(r.tokens) - sum(r.emitted_per_step)
        for emitted in r.emitted_per_step:
            rows.append((pos // bucket * bucket, emitted))
            pos += emitted
    table = pd.DataFrame(rows, columns=["position", "emitted"])
    return (table.groupby("position").agg(verify_steps=("emitted", "size"),
                                          emitted=("emitted", "sum"))
            .reset_index()[list(POSITION_COLUMNS)])


def _check_lossless(name: str, outputs, reference, strict: bool) -> int:
    """Rows of ``outputs`` whose tokens differ from ``reference``'s; raises on the first
    when ``strict``. The uids must match: the measure decodes the reference's requests."""
    uids = [r.uid for r in outputs]
    if uids != [r.uid for r in reference]:
        raise RuntimeError(f"drafter {name!r}: the measured requests (uids {uids[:4]} ...) are "
                           "not the trajectory's; the prompts or rl_step differ")
    diverged = 0
    for out, ref in zip(outputs, reference):
        if out.tokens == ref.tokens:
            continue
        diverged += 1
        if strict:
            at = next((i for i, (a, b) in enumerate(zip(out.tokens, ref.tokens)) if a != b),
                      min(len(out.tokens), len(ref.tokens)))
            raise NotLosslessError(
                f"drafter {name!r}: request uid {out.uid} decoded speculatively differs from "
                f"the plain coupled rollout at response token {at} (got "
                f"{out.tokens[at:at + 4]}, the rollout has {ref.tokens[at:at + 4]}); coupled "
                "verification must reproduce it token for token")
    return diverged


def measure_tau(engine, drafter, prompts, reference, config: RolloutConfig, rl_step: int,
                k: int, strict: bool, name: str = "", bucket: int = 16) -> TauMeasure:
    """Decode ``prompts`` again on ``engine`` with ``drafter`` (a chain of ``k`` drafts at
    every step, coupled verification, one worker) under ``config`` (the trajectory's rollout
    config) at RL step ``rl_step`` (the trajectory's step: its uids), check the tokens against ``reference`` (the trajectory's outputs
    of the same requests: every row when ``strict``, else counted), and return tau."""
    check_int("k", k, 1)
    cfg = replace(config, workers=1, spec_k=k, spec_mode="coupled")
    result = engine.rollout(prompts, cfg, progress=False, drafter=drafter,
                            schedule=StaticSchedule(k), rl_step=rl_step)
    diverged = _check_lossless(name, result.requests, reference, strict)
    return TauMeasure(acceptance_length(result), len(result.requests), diverged,
                      position_table(result.requests, bucket))


def _tokens_per_s(result, seconds) -> float:
    """tokens over the rollout's makespan, on its own clock (``sd_sweep``'s measure)."""
    return sum(len(t) for t in result.tokens) / result.timeline.makespan_s


def group_speedups(engine, drafter, prompts, config: RolloutConfig, k: int,
                   batch_sizes=(1, 32), repeats: int = 3, rl_step: int = 0) -> pd.DataFrame:
    """SD speedup of ``drafter`` over plain decoding on GRPO-shaped rollouts: ``prompts``
    with ``config.samples_per_prompt`` samples each (siblings, for a drafter that reads
    them) at RL step ``rl_step`` (its coupled draws), one worker, at each batch size. Measured as ``speculative.sweep.sd_sweep`` does:
    plain and SD alternate inside each of ``repeats`` repeats, and the speedup is the
    median of the per-repeat tokens/s ratios, with its extremes and spread. One row per batch
    size: ``batch_size``, ``speedup``, ``speedup_min``, ``speedup_max``, ``speedup_spread``,
    ``spread_wide``, ``disturbed_share`` (of the repeats, other work disturbed), ``tau`` and
    ``identical`` (SD's tokens equal plain's in every repeat)."""
    for bs in batch_sizes:
        check_int("batch size", bs, 1)
    rows = []
    for bs in batch_sizes:
        cfg = replace(config, workers=1, spec_k=k, spec_mode="coupled", max_batch_size=bs)
        runs = interleave({
            "plain": lambda c=cfg: engine.rollout(prompts, c, progress=False, rl_step=rl_step),
            "sd": lambda c=cfg: engine.rollout(prompts, c, progress=False, drafter=drafter,
                                               schedule=StaticSchedule(k), rl_step=rl_step)},
            repeats, measure=_tokens_per_s, higher_is_better=True)
        ratios = per_repeat_ratios(runs, "plain")
        stats = spread_stats(ratios[ratios["system"] == "sd"]["ratio"])
        plain, sd = runs.outputs["plain"], runs.outputs["sd"]
        rows.append({"batch_size": bs, "speedup": stats["ratio"],
                     "speedup_min": stats["ratio_min"], "speedup_max": stats["ratio_max"],
                     "speedup_spread": stats["spread"], "spread_wide": stats["spread_wide"],
                     "disturbed_share": disturbed_share(runs),
                     "tau": acceptance_length(pd.concat([r.timeline.requests for r in sd])),
                     "identical": all(p.tokens == s.tokens for p, s in zip(plain, sd))})
    return pd.DataFrame(rows)
