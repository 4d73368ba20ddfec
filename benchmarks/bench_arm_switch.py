"""What a decode step pays right after the engine switches arms (plain decoding <-> SD): the
adaptive engine's bandit explores an arm one step at a time between steps of its best arm,
so the reward it reads for an explored arm is that of a step right after a switch.

Batch 1, the default policy and the shipped EAGLE head, one torch thread, ``--prompts``
held-out prompts. Two schedules alternate inside each repeat: plain steps only, and runs of
``--run`` speculative steps (a chain of ``--k``) then ``--run`` plain steps, and so on. For
each position in a plain run (the 1st plain step after SD steps, the 2nd, ...) the figure is
the median of the per-repeat ratios of that position's median decode row to the plain-only
rollout's median decode row (1: no cost of switching); the same for the speculative steps
(draft + verify rows of a round) against the last round of their run. On the compiled path
(``RolloutConfig.compile=True``, compiled in the warm-up) and the eager one.

    python benchmarks/bench_arm_switch.py --paths compiled eager --run 4 --repeats 5
"""
from __future__ import annotations

import argparse
import statistics

import pandas as pd
import torch
from common import add_common, add_result, header, print_table, ratio_cells, record, sim_clock

from workbench.clock import DISTURBED_BELOW
from workbench.models import load_model
from workbench.provenance import disturbed, figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.schedule import PLAIN, StaticSchedule
from workbench.speculative.defaults import default_drafters
from workbench.speedup import spread_stats
from workbench.tasks import HELDOUT_SEED, get_problems


class RunsSchedule(StaticSchedule):
    """``run`` speculative steps (a chain of ``k``), then ``run`` plain steps, and so on."""

    def __init__(self, k: int, run: int):
        super().__init__(k)
        self.run, self.count = run, 0

    def plan(self, batch_size: int, worker: int):
        self.count += 1
        return PLAIN if (self.count - 1) % (2 * self.run) >= self.run else self.step


def positions(steps: pd.DataFrame) -> pd.DataFrame:
    """Each decode step's place in its run of plain steps (0: right after a speculative
    step), and each speculative round's (its draft and verify rows summed; 0: right after a
    plain step), from one worker's steps table in order. A run that did not start at a
    switch (the first, or one after a prefill: a request joined) is left out; ``compile``
    rows are skipped."""
    out, kind_before, place, clean = [], None, 0, False
    rows = (r for r in steps.sort_values("step").itertuples() if r.kind != "compile")
    for row in rows:
        if row.kind == "prefill":
            kind_before, clean = None, False
            continue
        seconds = row.end_s - row.start_s
        if row.kind == "draft":  # a round: its draft row now, its verify row next
            verify = next(rows)
            assert verify.kind == "verify", verify
            seconds += verify.end_s - verify.start_s
        kind = "plain" if row.kind == "decode" else "sd"
        if kind == kind_before:
            place += 1
        else:
            place, clean = 0, kind_before is not None
        kind_before = kind
        if clean:
            out.append({"kind": kind, "place": place, "us": seconds * 1e6,
                        "cpu_share": row.cpu_share})
    return pd.DataFrame(out)


def one_path(engine, drafter, prompts, cfg, args, compiled: bool) -> tuple[dict, list, list]:
    """Per repeat, the two rollouts alternating (order rotating): per-repeat ratios of each
    place's median step to the reference (plain-only rollout / the run's last SD round), the
    plain-only rollout's median step (us) per repeat, and every measured step's CPU share."""
    run = lambda sched: engine.rollout(prompts, cfg, drafter=drafter, schedule=sched,
                                       progress=False, compile=compiled).timeline.steps
    plain_only = lambda: engine.rollout(prompts, cfg, progress=False,
                                        compile=compiled).timeline.steps
    for _ in range(max(1, args.warmup)):  # compiles (compile=True) and warms caches
        run(RunsSchedule(args.k, args.run))
        plain_only()
    ratios, refs, shares = {}, [], []
    for rep in range(args.repeats):
        order = [0, 1] if rep % 2 == 0 else [1, 0]
        got = {}
        for which in order:
            got[which] = plain_only() if which == 0 else run(RunsSchedule(args.k, args.run))
        base = got[0][got[0]["kind"] == "decode"]
        shares += list(base["cpu_share"])
        ref = statistics.median(base["end_s"] - base["start_s"]) * 1e6
        placed = positions(got[1])
        shares += list(placed["cpu_share"])
        sd_last = statistics.median(
            placed[(placed["kind"] == "sd") & (placed["place"] == args.run - 1)]["us"])
        for (kind, place), group in placed.groupby(["kind", "place"]):
            denom = ref if kind == "plain" else sd_last
            ratios.setdefault((kind, place), []).append(statistics.median(group["us"]) / denom)
        refs.append(ref)
    return ratios, refs, shares


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="+", choices=("compiled", "eager"),
                    default=["compiled", "eager"])
    ap.add_argument("--run", type=int, default=4, help="steps per run of each arm (>= 2)")
    ap.add_argument("--k", type=int, default=4, help="the speculative steps' draft depth")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    add_common(ap, repeats=5)
    add_result(ap)
    args = ap.parse_args()
    if args.run < 2 or args.repeats < 3:
        raise SystemExit(f"--run {args.run} / --repeats {args.repeats}: need --run >= 2 and "
                         "--repeats >= 3")
    torch.set_num_threads(1)
    policy, tok = load_model("default", device="cpu", dtype=torch.float32)
    engine = RolloutEngine(policy, tok)
    drafter = default_drafters(policy, tok, names=("eagle",))["eagle"]
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=HELDOUT_SEED)]
    cfg = RolloutConfig(max_new_tokens=args.max_new_tokens, max_batch_size=1, spec_k=args.k)
    print(header(ap, args, "A step right after an arm switch, batch 1"))
    figures, shares = {}, []
    for path in args.paths:
        ratios, refs, path_shares = one_path(engine, drafter, prompts, cfg, args,
                                             path == "compiled")
        shares += path_shares
        table = [{"steps": "plain only (reference)", "place": "",
                  "ratio": f"{statistics.median(refs):.0f} us", "min-max": "", "spread": ""}]
        for (kind, place), values in sorted(ratios.items()):
            stats = spread_stats(values, args.wide)
            table.append({"steps": kind, "place": place + 1, **ratio_cells(stats)})
            figures[f"{path}_{kind}_{place + 1}"] = figure_from_stats(stats)
        print_table(f"{path}: each place's median step over the reference", pd.DataFrame(table))
    share = disturbed(shares, DISTURBED_BELOW)
    print(f"\nDisturbed: {share:.0%} of the measured steps got under {DISTURBED_BELOW} of a core")
    headline = [f for f in figures if f.endswith(("plain_1", "plain_2", "sd_1"))]
    record(args, "A decode step right after the engine switches arms, batch 1 (the default "
           "policy, the shipped EAGLE head, chain k=4): the median of per-repeat ratios of "
           "the n-th plain step after speculative steps to a plain-only rollout's step, and of "
           "the n-th speculative round after plain steps to the last round of its run, on the "
           "compiled and the eager path. Note: [docs/lab-notes/2026-12-05-compiled-decode-step"
           ".md](docs/lab-notes/2026-12-05-compiled-decode-step.md).", figures, sim_clock(),
           share, headline=headline)


if __name__ == "__main__":
    main()
