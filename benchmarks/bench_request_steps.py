"""What does recording the timeline's third table cost? The same rollout with and without
``request_steps=True`` (``rollout.request_steps``: a row per request per emitting step, built
into a validated table at the rollout's end), side by side.

One rollout of the default policy (sim clock, local backend, coupled sampling at temperature 1:
the same tokens every time, checked), plain decoding and SD (n-gram drafter, chain of k), each
with the table off and on, alternating inside every repeat (the order rotating). Per mode, the
ratio on / off of the rollout call's seconds (``--timer``: this thread's CPU time, which other
processes on a busy machine do not stretch, or wall time; the call is what the caller waits
for: the recording on the workers and the table's build and checks after) and of the
timeline's sim makespan (the workers' clocks: the recording inside the steps), as the median
of the per-repeat ratios with min-max and spread. Writes ``--metrics`` (flat scalars: ``x``,
``x_min``, ``x_max``, ``x_n``) for ``workbench results record``.

    python benchmarks/bench_request_steps.py --repeats 7
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch

from common import add_common, header, print_table, ratio_cells
from workbench.clock import sim_seconds_kind
from workbench.models import load_model
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative import NGramDrafter
from workbench.speedup import interleave, spread_stats
from workbench.tasks import RL_SEED, get_problems


def systems_of(engine, prompts, config, drafter_of):
    """``{"<mode> <off|on>": rollout}`` for plain and SD, the table off and on."""
    def run(mode, on):
        drafter = drafter_of() if mode == "sd" else None
        return engine.rollout(prompts, config, drafter=drafter, progress=False,
                              request_steps=on)
    return {f"{mode} {'on' if on else 'off'}": (lambda m=mode, o=on: run(m, o))
            for mode in ("plain", "sd") for on in (False, True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2, help="samples per prompt")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--timer", choices=["cpu", "wall"], default="cpu",
                    help="the call's seconds: this thread's CPU time, or wall time")
    ap.add_argument("--metrics", default="runs/bench_request_steps/metrics.json")
    add_common(ap, repeats=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy, tok = load_model("default", device="cpu")
    engine = RolloutEngine(policy, tok)
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=RL_SEED)]
    config = RolloutConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=1,
                           samples_per_prompt=args.samples, max_batch_size=args.batch_size,
                           spec_k=args.k)
    print(header(ap, args, f"default policy, CPU, 1 torch thread, {args.prompts} prompts x "
                           f"{args.samples}, batch {args.batch_size}, max_new_tokens="
                           f"{args.max_new_tokens}, SD: n-gram chain k={args.k}"), flush=True)
    systems = systems_of(engine, prompts, config, NGramDrafter)
    timer = time.thread_time if args.timer == "cpu" else time.perf_counter
    runs = interleave(systems, args.repeats, warmup=args.warmup, clock=timer)
    seconds = runs.table.pivot(index="repeat", columns="system", values="value")
    rows, metrics = [], {"sim_seconds": sim_seconds_kind()}  # the makespans' clock
    for mode in ("plain", "sd"):
        off, on = runs.outputs[f"{mode} off"], runs.outputs[f"{mode} on"]
        assert all(a.tokens == b.tokens for a, b in zip(off, on)), "recording changed tokens"
        assert all(r.timeline.request_steps is None for r in off)
        rows_recorded = len(on[0].timeline.request_steps)
        for what, ratios in (
                (f"call_{args.timer}", seconds[f"{mode} on"] / seconds[f"{mode} off"]),
                ("makespan", [b.timeline.makespan_s / a.timeline.makespan_s
                              for a, b in zip(off, on)])):
            stats = spread_stats(ratios, args.wide)
            key = f"{mode}_{what}_ratio"
            metrics |= {key: stats["ratio"], f"{key}_min": stats["ratio_min"],
                        f"{key}_max": stats["ratio_max"], f"{key}_n": stats["repeats"]}
            rows.append({"mode": mode, "time": what, "rows recorded": rows_recorded,
                         "off s": float(seconds[f"{mode} off"].median())
                         if what.startswith("call") else off[0].timeline.makespan_s,
                         **{("on / off" if c == "ratio" else c): v
                            for c, v in ratio_cells(stats, digits=3).items()}})
        metrics[f"{mode}_rows"] = rows_recorded
    metrics["disturbed_share"] = float(runs.table["disturbed"].mean())
    print_table("Recording request_steps: on / off (median of per-repeat ratios)",
                pd.DataFrame(rows))
    path = Path(args.metrics)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=1))
    print(f"\nmetrics: {path}")


if __name__ == "__main__":
    main()
