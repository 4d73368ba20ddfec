"""What the few-rows kernel (``rollout.few_rows``) gains: first the projection alone, the
kernel against the library's GEMM (``F.linear``) on the default policy's weights at each
``--rows``; then the compiled step with it (``CompiledDecode.few_rows``, the default)
against the step without (``few_rows=False``: inductor's own loops up to 6 rows, the GEMM
past them), in rollouts side by side as ``compiled_ab`` runs them (plain and SD with the
EAGLE head). Ratios: median of the per-repeat ratios of seconds without the kernel over
seconds with it (above 1: the kernel is faster). The two round differently in float32, so
the share of requests whose tokens agree is reported, not required.

    python benchmarks/bench_few_rows.py --rows 1 5 8 32 --batch-sizes 1 8 --repeats 9 --warmup 1
"""
from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F
from common import header, print_table, ratio_cells, record
from compiled_ab import ab_arguments, engines, run_pair

from workbench.provenance import figure_from_stats
from workbench.rollout.few_rows import few_rows_linear, few_rows_op
from workbench.rollout.forward import layer_plan
from workbench.speedup import interleave, summarize

KERNEL, LIBRARY = "few-rows kernel", "without"


def projections(model, rows_list: list[int], args) -> tuple[pd.DataFrame, dict]:
    """Every projection of ``model``'s layers once, on ``rows`` random rows, through the
    kernel and through ``F.linear``, alternating, at each of ``rows_list``."""
    plans = [layer_plan(layer) for layer in model.model.layers]
    weights = [w for p in plans for w in (p.w_qkv, p.w_o, p.w_gate_up, p.w_down)]
    packed = list(zip([w for p in plans for w in p.packed], [w.shape[0] for w in weights]))
    table, figures = [], {}
    for rows in rows_list:
        xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}

        def library(calls=50):
            for _ in range(calls):
                for w in weights:
                    F.linear(xs[w.shape[1]], w)

        def kernel(calls=50):
            for _ in range(calls):
                for w, n in packed:
                    few_rows_linear(xs[w.shape[1]], w, None, n)

        runs = interleave({KERNEL: kernel, LIBRARY: library}, args.repeats, warmup=1)
        s = summarize(runs, baseline=LIBRARY, wide=args.wide).set_index("system")
        flops = 2 * rows * sum(w.numel() for w in weights) * 50
        table.append({"rows": rows, **ratio_cells(s.loc[KERNEL]),
                      "kernel GFLOP/s": f"{flops / s.loc[KERNEL, 'value'] / 1e9:.0f}",
                      "F.linear GFLOP/s": f"{flops / s.loc[LIBRARY, 'value'] / 1e9:.0f}"})
        figures[f"projection_speedup_r{rows}"] = figure_from_stats(s.loc[KERNEL], "x")
    return pd.DataFrame(table), figures


def main():
    ap = ab_arguments(__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 5, 8, 32],
                    help="rows of the projection-alone comparison")
    args = ap.parse_args()
    op, why = few_rows_op()
    if op is None:
        raise SystemExit(f"the few-rows kernel is unavailable here: {why}")
    both = engines({KERNEL: lambda c: setattr(c, "few_rows", True),
                    LIBRARY: lambda c: setattr(c, "few_rows", False)})
    print(header(ap, args, "The few-rows kernel against the library's GEMM and inductor's "
                 "loops"))
    model = both[KERNEL][0].model
    table, figures = projections(model, args.rows, args)
    print_table("The default policy's projections, F.linear seconds over the kernel's",
                table)
    steps, step_figures, disturbed = run_pair(args, both, KERNEL, LIBRARY, "kernel_speedup",
                                              False)
    print_table("Rollout seconds without the kernel over with it (median of per-repeat "
                "ratios)", steps)
    print(f"\nDisturbed share: {disturbed if disturbed is None else f'{disturbed:.0%}'}")
    record(args, "What the few-rows kernel (rollout.few_rows) gains: the default policy's "
           "projections through it against F.linear at a few row counts, and the compiled "
           "decode step with it (CompiledDecode.few_rows) against without, rollout "
           "seconds without over with, median of per-repeat ratios, plain and SD with the "
           "EAGLE head (k=4), greedy, one thread. Note: "
           "[docs/lab-notes/2026-12-05-compiled-decode-step.md]"
           "(docs/lab-notes/2026-12-05-compiled-decode-step.md).",
           {**figures, **step_figures}, "wall", disturbed)


if __name__ == "__main__":
    main()
