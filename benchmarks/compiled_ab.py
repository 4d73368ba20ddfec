"""Two settings of the compiled decode step side by side in rollouts (``bench_direct_call``,
``bench_few_rows``): the default policy twice (two copies, so each has its compiled step of
its own, compiled in the warm-up), greedy, one torch thread, ``--prompts`` held-out prompts
a row at each of ``--batch-sizes``; plain decoding, and SD with the shipped EAGLE head
(chain of ``--k``, whose draft steps are compiled graphs too). The two alternate inside each
repeat; ratio = median of the per-repeat ratios of the baseline's rollout seconds over the
other's (above 1: the other is faster)."""
from __future__ import annotations

import argparse
import copy

import pandas as pd
import torch
from common import add_common, add_result, disturbed_of, ratio_cells, tokens_agree

from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.compiled import compiled_decode_for
from workbench.rollout.forward import policy_forward
from workbench.speculative.defaults import default_drafters
from workbench.speedup import interleave, summarize
from workbench.tasks import HELDOUT_SEED, get_problems


def ab_arguments(doc: str) -> argparse.ArgumentParser:
    """The options both benchmarks take."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompts", type=int, default=6, help="prompts per row of a batch")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="the EAGLE head's draft depth")
    add_common(ap, repeats=9)
    add_result(ap)
    return ap


def engines(settings: dict) -> dict:
    """``{name: (engine, its EAGLE drafter)}``, one copy of the default policy (float32, CPU)
    per name, ``settings[name](compiled)`` applied to the policy's compiled step and to the
    head's compiled draft step before either compiles."""
    torch.set_num_threads(1)
    policy, tok = load_model("default", device="cpu", dtype=torch.float32)
    out = {}
    for i, (name, configure) in enumerate(settings.items()):
        model = policy if i == 0 else copy.deepcopy(policy)
        drafter = default_drafters(model, tok, names=("eagle",))["eagle"]
        drafter.check_compatible(model, tok)  # binds it: its compiled draft step is made
        for compiled in (compiled_decode_for(policy_forward(model), True), drafter.compiled):
            configure(compiled)
        out[name] = (RolloutEngine(model, tok), drafter)
    return out


def run_pair(args, both: dict, faster: str, baseline: str, figure: str,
             same_tokens: bool) -> tuple[pd.DataFrame, dict, float | None]:
    """Rollouts of ``both``'s two engines alternating, plain and EAGLE, at each batch size:
    the printed table's rows, ``{f"{figure}_{steps}_b{bs}": figure}`` (``baseline``'s seconds
    over ``faster``'s) and the disturbed share. ``same_tokens``: stop if the tokens differ;
    else the share of requests whose tokens agree goes in the table (float32 arithmetic of
    two kernels may round a near-tie differently)."""
    rows, figures, summaries = [], {}, []
    for bs in args.batch_sizes:
        prompts = [p.prompt for p in get_problems("running_sum", args.prompts * bs,
                                                  seed=HELDOUT_SEED)]
        cfg = RolloutConfig(max_new_tokens=args.max_new_tokens, max_batch_size=bs,
                            spec_k=args.k, compile=True)
        for steps in ("plain", "eagle"):
            systems = {name: (lambda e=e, d=d: e.rollout(
                prompts, cfg, drafter=d if steps == "eagle" else None, progress=False).tokens)
                for name, (e, d) in both.items()}
            runs = interleave(systems, args.repeats, warmup=max(1, args.warmup))
            agree = tokens_agree(runs, faster, baseline)
            if same_tokens and agree < 1:
                raise SystemExit(f"batch {bs}, {steps}: the two paths' tokens differ")
            stats = summarize(runs, baseline=baseline, wide=args.wide).set_index("system")
            summaries.append(stats.reset_index())
            s = stats.loc[faster]
            rows.append({"steps": steps, "batch": bs, **ratio_cells(s),
                         f"{faster} s": f"{s['value']:.3f}",
                         f"{baseline} s": f"{stats.loc[baseline, 'value']:.3f}",
                         "tokens agree": f"{agree:.0%}"})
            figures[f"{figure}_{steps}_b{bs}"] = figure_from_stats(s, "x")
    return pd.DataFrame(rows), figures, disturbed_of(*summaries)
