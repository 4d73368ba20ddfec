"""What the compiled step gains by calling its graphs past dynamo's frame wrappers
(``CompiledDecode.direct``, ``rollout.graph_call.DirectGraph``) against every call through
dynamo (``direct=False``): the same graphs, the same guards evaluated, the same tokens.

Rollouts side by side as ``compiled_ab`` runs them (the default policy twice, plain and SD
with the EAGLE head, alternating in each repeat); ratio = median of the per-repeat ratios of
the rollout's seconds through dynamo over direct (above 1: direct calls are faster), tokens
checked equal.

    python benchmarks/bench_direct_call.py --batch-sizes 1 8 --repeats 9 --warmup 1
"""
from __future__ import annotations

from common import header, print_table, record
from compiled_ab import ab_arguments, engines, run_pair

DIRECT, THROUGH = "direct calls", "through dynamo"


def main():
    ap = ab_arguments(__doc__)
    args = ap.parse_args()
    both = engines({DIRECT: lambda c: setattr(c, "direct", True),
                    THROUGH: lambda c: setattr(c, "direct", False)})
    print(header(ap, args, "Compiled graph calls past dynamo's frame wrappers, or through it"))
    table, figures, disturbed = run_pair(args, both, DIRECT, THROUGH, "direct_speedup", True)
    print_table("Rollout seconds through dynamo over direct (median of per-repeat ratios)",
                table)
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
