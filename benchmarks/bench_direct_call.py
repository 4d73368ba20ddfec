"""What the compiled step gains by calling its graphs past dynamo's frame wrappers
(``CompiledDecode.direct``, ``rollout.graph_call.DirectGraph``) against every call through
dynamo (``direct=False``): the same graphs, the same guards evaluated, the same tokens.

The default policy twice (two copies, so each has its compiled step of its own, compiled in
the warm-up), greedy, one torch thread, ``--prompts`` held-out prompts at each of
``--batch-sizes``; plain decoding, and SD with the shipped EAGLE head (chain of ``--k``,
whose draft steps are compiled graphs too). The two alternate inside each repeat; ratio =
median of the per-repeat ratios of the rollout's seconds through dynamo over direct (above
1: direct calls are faster), tokens checked equal.

    python benchmarks/bench_direct_call.py --batch-sizes 1 8 --repeats 9 --warmup 1
"""
from __future__ import annotations

import argparse
import copy

import pandas as pd
import torch
from common import (add_common, add_result, disturbed_of, header, print_table, ratio_cells,
                    record)

from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.compiled import compiled_decode_for
from workbench.rollout.forward import policy_forward
from workbench.speculative.defaults import default_drafters
from workbench.speedup import interleave, summarize
from workbench.tasks import HELDOUT_SEED, get_problems

DIRECT, THROUGH = "direct calls", "through dynamo"


def engines(policy, tok) -> dict:
    """``{DIRECT | THROUGH: (engine, its EAGLE drafter)}`` over two copies of ``policy``,
    the policy's compiled step and the head's compiled draft step calling each way."""
    out = {}
    for name, model in ((DIRECT, policy), (THROUGH, copy.deepcopy(policy))):
        drafter = default_drafters(model, tok, names=("eagle",))["eagle"]
        drafter.check_compatible(model, tok)  # binds it: its compiled draft step is made
        for compiled in (compiled_decode_for(policy_forward(model), True), drafter.compiled):
            compiled.direct = name == DIRECT
        out[name] = (RolloutEngine(model, tok), drafter)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompts", type=int, default=6, help="prompts per row of a batch")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="the EAGLE head's draft depth")
    add_common(ap, repeats=9)
    add_result(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy, tok = load_model("default", device="cpu", dtype=torch.float32)
    both = engines(policy, tok)
    print(header(ap, args, "Compiled graph calls past dynamo's frame wrappers, or through it"))
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
            outs = [t for name in systems for t in runs.outputs[name]]
            if any(t != outs[0] for t in outs):
                raise SystemExit(f"batch {bs}, {steps}: the two paths' tokens differ")
            stats = summarize(runs, baseline=THROUGH, wide=args.wide).set_index("system")
            summaries.append(stats.reset_index())
            s = stats.loc[DIRECT]  # its ratio: seconds through dynamo over direct
            rows.append({"steps": steps, "batch": bs, **ratio_cells(s),
                         "direct s": f"{s['value']:.3f}",
                         "through s": f"{stats.loc[THROUGH, 'value']:.3f}"})
            figures[f"direct_speedup_{steps}_b{bs}"] = figure_from_stats(s, "x")
    print_table("Rollout seconds through dynamo over direct (median of per-repeat ratios)",
                pd.DataFrame(rows))
    disturbed = disturbed_of(*summaries)
    print(f"\nDisturbed share: {disturbed if disturbed is None else f'{disturbed:.0%}'}")
    record(args, "What the compiled decode step gains by calling its graphs past dynamo's "
           "frame wrappers (CompiledDecode.direct) against every call through dynamo: "
           "rollout seconds through dynamo over direct, median of per-repeat ratios, plain "
           "and SD with the EAGLE head (k=4), the default policy, greedy, one thread. Note: "
           "[docs/lab-notes/2026-12-05-compiled-decode-step.md]"
           "(docs/lab-notes/2026-12-05-compiled-decode-step.md).", figures, "wall",
           disturbed)


if __name__ == "__main__":
    main()
