"""Does a busy machine stretch the sim clock? The same rollout's sim makespan, quiet and beside
CPU hogs, read as the working thread's CPU time with the work on one torch thread (the sim
clock's seconds: ``workbench.clock``) and as wall time on the process's threads (what the sim
clock read before, at the notebooks' default of one thread per core).

One rollout of the default policy on N local workers (sim clock, torch at ``--threads``, coupled
sampling: the same tokens every time, checked by digest), four ways in every repeat, the order
rotating: {cpu, wall} seconds x {quiet, loaded}. *Loaded*: ``--hogs`` processes spinning in
pure Python beside it (as many as the cores: a test suite, a second run). Per reader, the ratio
loaded / quiet of the makespan (median of the per-repeat ratios, min-max, spread); and the two
readers' quiet makespans against each other (one clock for the same work).

    python benchmarks/bench_sim_clock.py --repeats 5
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pandas as pd
import torch

import workbench.clock as clock
from common import CpuShares, add_common, add_result, header, print_table, ratio_cells, record
from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speedup import spread_stats
from workbench.tasks import RL_SEED, get_problems

SYSTEMS = [("cpu", "quiet"), ("wall", "quiet"), ("cpu", "loaded"), ("wall", "loaded")]


@contextmanager
def sim_read_as(reader: str):
    """The sim clock's seconds read as ``reader`` (``cpu``: thread CPU time; ``wall``) inside
    the scope (``clock.sim_seconds``)."""
    with clock.sim_seconds("thread_cpu" if reader == "cpu" else "wall"):
        yield


def rollout_once(engine, prompts, config, reader: str, hogs: int) -> dict:
    """One rollout with the sim clock reading ``reader`` seconds, beside ``hogs`` spinning
    processes; its sim makespan, wall seconds and token digest."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(hogs)]
    try:
        started = time.perf_counter()
        with sim_read_as(reader):
            result = engine.rollout(prompts, config, progress=False)
        wall_s = time.perf_counter() - started
    finally:
        for process in spinning:
            process.kill()
            process.wait()
    digest = hashlib.sha1(repr(result.tokens).encode()).hexdigest()[:12]
    return {"makespan_s": result.timeline.makespan_s, "wall_s": wall_s, "digest": digest}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2,
                    help="spinning processes beside a loaded rollout (default: the cores)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch threads of the process (default: torch's, one per core)")
    add_common(ap, repeats=5)
    add_result(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(header(ap, args, "Sim makespan quiet and loaded, CPU-time and wall readers"),
          flush=True)
    model, tokenizer = load_model("default")
    engine = RolloutEngine(model, tokenizer)
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, RL_SEED)]
    config = RolloutConfig(max_new_tokens=args.max_new_tokens, temperature=1.0,
                           samples_per_prompt=args.samples, workers=args.workers,
                           spec_mode="coupled", seed=0)
    rows, shares = [], CpuShares()  # CPU shares of the quiet rollouts (loaded ones are on purpose)
    for _ in range(args.warmup):
        rollout_once(engine, prompts, config, "cpu", 0)
    for repeat in range(args.repeats):
        order = SYSTEMS[repeat % 4:] + SYSTEMS[:repeat % 4]
        for reader, load in order:
            run = rollout_once if load == "loaded" else shares.wrap(rollout_once)
            row = run(engine, prompts, config, reader, args.hogs if load == "loaded" else 0)
            rows.append({"repeat": repeat, "reader": reader, "load": load, **row})
            print(rows[-1], flush=True)
    runs = pd.DataFrame(rows)
    assert runs["digest"].nunique() == 1, "coupled sampling: every rollout decodes the same tokens"
    wide = runs.pivot(index="repeat", columns=["reader", "load"], values="makespan_s")
    table, figures = [], {}
    for reader in ("cpu", "wall"):
        stats = spread_stats(wide[(reader, "loaded")] / wide[(reader, "quiet")], wide=args.wide)
        figures[f"loaded_over_quiet_{reader}"] = figure_from_stats(stats, "x")
        quiet = wide[(reader, "quiet")]
        figures[f"quiet_makespan_s_{reader}"] = {
            "value": float(quiet.median()), "q25": float(quiet.quantile(0.25)),
            "q75": float(quiet.quantile(0.75)), "min": float(quiet.min()),
            "max": float(quiet.max()), "n": int(quiet.size), "unit": "s"}
        table.append({"sim seconds read as": reader,
                      "quiet makespan s (median)": f"{wide[(reader, 'quiet')].median():.3f}",
                      "loaded makespan s (median)": f"{wide[(reader, 'loaded')].median():.3f}",
                      **{f"loaded / quiet {k}": v for k, v in ratio_cells(stats).items()}})
    agree = spread_stats(wide[("cpu", "quiet")] / wide[("wall", "quiet")], wide=args.wide)
    print_table(f"Sim makespan of one rollout ({args.prompts} x {args.samples} requests, "
                f"{args.max_new_tokens} tokens, {args.workers} workers), quiet and beside "
                f"{args.hogs} spinning processes", pd.DataFrame(table))
    cells = ratio_cells(agree, digits=3)
    print(f"\nquiet, CPU-time / wall makespan: {cells['ratio']} ({cells['min-max']}, spread "
          f"{cells['spread']}); wall seconds of a rollout, quiet / loaded (median): "
          f"{runs[runs.load == 'quiet'].wall_s.median():.2f} / "
          f"{runs[runs.load == 'loaded'].wall_s.median():.2f}")
    figures["cpu_over_wall_quiet"] = figure_from_stats(agree, "x")
    record(args, f"Does a busy machine stretch the sim clock? One rollout's sim makespan beside "
           f"{args.hogs} spinning processes over quiet, read as thread CPU time (cpu) and as "
           f"wall time (wall); {args.prompts} x {args.samples} requests, "
           f"{args.max_new_tokens} tokens, {args.workers} workers, torch on one thread "
           "(disturbed: the quiet rollouts)", figures, "sim-thread-cpu", shares.disturbed(),
           headline=["loaded_over_quiet_cpu", "loaded_over_quiet_wall", "cpu_over_wall_quiet"])


if __name__ == "__main__":
    main()
