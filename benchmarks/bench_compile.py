"""The compiled decode step against the eager one (issue 41), side by side.

The default policy, greedy, ``ignore_eos`` (every row decodes ``--max-new-tokens``, so the
batch stays at its size and one graph serves every step), the engine's rollout, plain,
(``--sd-batch-sizes``) speculative with the shipped small LM drafting (its own steps eager),
and (``--eagle-batch-sizes``) speculative with the shipped EAGLE head (its draft step
compiled too), with
``RolloutConfig(compile=False)`` and ``compile=True`` (``rollout.compiled``) alternating
inside each of ``--repeats`` repeats (order rotating) at each batch size; ``--warmup`` untimed
rounds first compile the graphs (their compile seconds are printed, from
``CompiledDecode.compiles``; a warm on-disk inductor cache shortens them). The measure is the
seconds of the rollout's decode steps on the worker's clock (the timeline's ``decode`` rows:
the sim clock, this thread's CPU time), per token; the ratio is eager over compiled (above 1:
compiled is faster), the median of the per-repeat ratios with its min-max and spread.
Tokens are compared in every repeat: float32 compiled and eager arithmetic may round a
near-tie differently, so a mismatch is counted and printed, not fatal (float64 equality is
tests/test_compiled_decode.py's and tests/test_compiled_lossless.py's). The prefill's share
of an eager rollout's prefill and decode seconds is recorded too (``prefill_share_*``: why
the prefill stays eager, ``rollout.compiled``).

    python benchmarks/bench_compile.py --batch-sizes 1 8 32 --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch

from common import (add_common, add_result, disturbed_of, header, print_table, ratio_cells,
                    record, sim_clock)
from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.compiled import row_bucket
from workbench.rollout.forward import policy_forward
from workbench.models import DEFAULT_EAGLE
from workbench.speculative import EagleDrafter, EagleHead, LMDrafter
from workbench.speedup import interleave, summarize
from workbench.tasks import HELDOUT_SEED, get_problems


STEP_NAMES = {"": "plain", "sd_": "SD, small LM", "eagle_": "SD, EAGLE"}  # by figure prefix


def decode_seconds(steps) -> float:
    """Seconds of the rollout's decode work: plain steps, and a speculative step's draft and
    verify rows (prefills and compile rows left out)."""
    dec = steps[steps["kind"].isin(["decode", "draft", "verify"])]
    return float((dec["end_s"] - dec["start_s"]).sum())


def prefill_share(steps) -> float:
    """The prefill rows' share of the rollout's prefill and decode seconds."""
    pre = steps[steps["kind"] == "prefill"]
    prefill_s = float((pre["end_s"] - pre["start_s"]).sum())
    return prefill_s / (prefill_s + decode_seconds(steps))


def prealloc_mib(model, rows: int, length: int) -> float:
    """MiB of the compiled path's preallocated KV cache for ``rows`` rows (rounded up to
    their bucket) of ``length`` columns: keys and values of every layer, the model's dtype."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_row_col = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim
    return row_bucket(rows) * length * per_row_col * model.dtype.itemsize / 2 ** 20


def measure(engine, prompts, bs, args, drafter=None, sd=""):
    """Eager against compiled at batch ``bs``: plain steps, or with ``drafter`` speculative
    steps of ``--spec-k`` drafts (the verify pass compiled; an EAGLE head's draft step too,
    a small LM's eager); ``sd``: the figures' prefix (``""``: plain)."""
    cfg = RolloutConfig(max_new_tokens=args.max_new_tokens, max_batch_size=bs,
                        ignore_eos=True, spec_k=args.spec_k)

    def run(compile_):
        res = engine.rollout(prompts, cfg, compile=compile_, drafter=drafter, progress=False)
        return res.tokens, res.timeline.steps

    t0 = time.perf_counter()
    runs = interleave({"eager": lambda: run(False), "compiled": lambda: run(True)},
                      args.repeats, warmup=args.warmup,
                      measure=lambda out, s: decode_seconds(out[1]))
    warm_s = time.perf_counter() - t0
    mismatched = sum(a != b for (ta, _), (tb, _) in zip(runs.outputs["eager"],
                                                        runs.outputs["compiled"])
                     for a, b in zip(ta, tb))
    stats = summarize(runs, baseline="eager", wide=args.wide).set_index("system")
    n_tokens = sum(len(t) for t in runs.outputs["eager"][0][0])
    kinds = runs.outputs["eager"][0][1]["kind"]
    steps = int(kinds.isin(["decode", "verify"]).sum())
    c = policy_forward(engine.model).compiled_decodes[True]
    compile_s = sum(s for k, s in c.compiles.items() if k[0] == bs and (k[3] > 1) == bool(sd))
    if isinstance(drafter, EagleDrafter):
        compile_s += sum(s for k, s in drafter.compiled.compiles.items() if k[0] == bs)
    us = {n: stats.loc[n, "value"] / steps * 1e6 for n in ("eager", "compiled")}
    share = statistics.median(prefill_share(out[1]) for out in runs.outputs["eager"])
    figures = {f"{sd}compiled_over_eager_bs{bs}": figure_from_stats(stats.loc["compiled"], "x"),
               f"{sd}eager_step_us_bs{bs}": {"value": us["eager"], "n": args.repeats,
                                             "unit": "us"},
               f"{sd}compiled_step_us_bs{bs}": {"value": us["compiled"], "n": args.repeats,
                                                "unit": "us"},
               f"{sd}compile_s_bs{bs}": {"value": compile_s, "n": 1, "unit": "s"},
               f"{sd}prefill_share_bs{bs}": {"value": share, "n": args.repeats,
                                             "unit": "share"}}
    row = {"steps": STEP_NAMES[sd], "batch size": bs,
           "decode steps": steps, "tokens": n_tokens,
           "eager us/step": f"{us['eager']:.0f}", "compiled us/step": f"{us['compiled']:.0f}",
           **ratio_cells(stats.loc["compiled"]),
           "disturbed": f"{stats.loc['compiled', 'disturbed_share']:.0%}",
           "compile s": f"{compile_s:.1f}", "prefill share": f"{share:.0%}",
           "requests differing": mismatched,
           "spread_wide": bool(stats.loc["compiled", "spread_wide"])}
    print(row, f"(all rounds {warm_s:.0f} s)", flush=True)
    return row, figures, stats


def plans_of(args, model, tok) -> list[tuple]:
    """``(batch size, drafter or None, figure prefix)`` of each measured configuration."""
    drafter = eagle = None
    if args.sd_batch_sizes:
        small, _ = load_model("default-drafter", device="cpu", dtype=torch.float32)
        drafter = LMDrafter(small, tok)
    if args.eagle_batch_sizes:
        eagle = EagleDrafter(EagleHead.from_pretrained(DEFAULT_EAGLE, model), model)
    return ([(bs, None, "") for bs in args.batch_sizes]
            + [(bs, drafter, "sd_") for bs in args.sd_batch_sizes]
            + [(bs, eagle, "eagle_") for bs in args.eagle_batch_sizes])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sd-batch-sizes", type=int, nargs="*", default=[1],
                    help="batch sizes also measured with speculative steps (the shipped "
                    "small LM drafting --spec-k tokens; the verify pass compiled)")
    ap.add_argument("--eagle-batch-sizes", type=int, nargs="*", default=[1],
                    help="batch sizes also measured with speculative steps drafted by the "
                    "shipped EAGLE head (its draft step and the verify pass compiled)")
    ap.add_argument("--spec-k", type=int, default=4)
    add_common(ap, repeats=5)
    ap.set_defaults(warmup=1)
    add_result(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, device="cpu", dtype=torch.float32)
    engine = RolloutEngine(model, tok)
    rows, figures, summaries = [], {}, []
    for bs, d, sd in plans_of(args, model, tok):
        prompts = [p.prompt for p in get_problems("running_sum", bs, seed=HELDOUT_SEED)]
        row, mine, stats = measure(engine, prompts, bs, args, d, sd)
        rows.append(row)
        figures.update(mine)
        summaries.append(stats)
    table = pd.DataFrame(rows)
    context = int(model.config.max_position_embeddings)
    for rows_ in (32, 256):
        figures[f"prealloc_mib_bs{rows_}"] = {"value": prealloc_mib(model, rows_, context),
                                              "n": 1, "unit": "MiB"}
    memory = ", ".join(f"batch {r}: {figures[f'prealloc_mib_bs{r}']['value']:.0f} MiB"
                       for r in (32, 256))
    print("\n" + header(ap, args, f"model={args.model} cpu float32, greedy, ignore_eos, "
                        f"max_new_tokens={args.max_new_tokens}, one rollout of batch-size "
                        "prompts; measure: decode-step seconds on the sim clock (thread CPU)"))
    print_table("Compiled decode step vs eager (ratio = eager seconds over compiled; "
                "above 1: compiled is faster; SD rows: draft and verify seconds, the verify "
                "pass compiled, and EAGLE's draft step)", table.drop(columns="spread_wide"),
                table["spread_wide"], args.wide, "rows")
    print(f"\nThe preallocated KV cache at the model's context ({context} columns): {memory}")
    record(args, "Plain decode step, torch.compile (inductor, CPU, preallocated KV cache, "
           "power-of-two row buckets, the width a symbolic size) over eager: eager decode "
           "seconds over compiled "
           f"(median of per-repeat ratios) at batch sizes {args.batch_sizes}, default policy, "
           f"float32, {args.threads} thread(s), max_new_tokens={args.max_new_tokens}; "
           f"sd_*: speculative steps with the shipped small LM (k={args.spec_k}) at batch "
           f"sizes {args.sd_batch_sizes}, draft and verify seconds, the verify pass compiled; "
           f"eagle_*: the same with the shipped EAGLE head at batch sizes "
           f"{args.eagle_batch_sizes}, its draft step compiled too; prefill_share_*: the "
           "prefill's share of an eager rollout's prefill and decode seconds. "
           "Note: [2026-12-05-compiled-decode-step.md]"
           "(docs/lab-notes/2026-12-05-compiled-decode-step.md).",
           figures, sim_clock(), disturbed_of(*summaries),
           headline=[f"compiled_over_eager_bs{bs}" for bs in args.batch_sizes]
           + [f"sd_compiled_over_eager_bs{bs}" for bs in args.sd_batch_sizes]
           + [f"eagle_compiled_over_eager_bs{bs}" for bs in args.eagle_batch_sizes])


if __name__ == "__main__":
    main()
