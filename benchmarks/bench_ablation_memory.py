"""How much memory do runs stepped in turn in one process hold, with and without handing freed
pages back after each step (``workbench.memory.release_memory``)? An ablation steps its runs so
(``rl.ablation.runs.lockstep``); run the script once each way (the allocator's state is the
process's, so the two cannot share one):

    OMP_NUM_THREADS=1 python benchmarks/bench_ablation_memory.py --release
    OMP_NUM_THREADS=1 python benchmarks/bench_ablation_memory.py --no-release

Prints the resident set after every run's step and the largest of them.
"""
from __future__ import annotations

import argparse

from common import add_result, command_line, record
from workbench.memory import release_memory, resident_bytes
from workbench.rl import GRPOConfig
from workbench.rl.setup import rl_setup
from workbench.rl.ablation.runs import build_run


def resident_gb() -> float:
    return resident_bytes() / 2**30


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--variants", nargs="+", default=["baseline", "overprovision", "async"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    add_result(ap)
    args = ap.parse_args()
    print(f"Command:\n\n```bash\n{command_line(ap, args)}\n```\n", flush=True)
    s = rl_setup("default", "running_sum", 4000, 8)
    grpo = GRPOConfig.flat(prompts_per_step=args.prompts, samples_per_prompt=args.samples,
                           max_new_tokens=args.max_new_tokens, workers=16, lr=5e-4,
                           kl_coef=0.05)
    runs = {v: build_run(v, 0, s.policy, s.tokenizer, s.pool, s.reward, grpo, None, None, {})
            for v in args.variants}
    print(f"{len(runs)} runs built: {resident_gb():.2f} GB resident", flush=True)
    largest = 0.0
    for step in range(args.steps):
        for name, run in runs.items():
            run.step()
            if args.release:
                release_memory()
            largest = max(largest, resident_gb())
            print(f"step {step} {name}: {resident_gb():.2f} GB resident", flush=True)
    print(f"release after each step: {args.release}; largest resident set between steps "
          f"{largest:.2f} GB")
    # one result per way (the two runs are two processes): <result>_release, <result>_no_release
    record(args, f"Largest resident set between the steps of {len(runs)} runs ({args.variants}) "
           f"stepped in turn in one process, {args.steps} steps each, freed pages handed back "
           f"after each step: {args.release}", {"largest_resident_gb": {
               "value": largest, "n": args.steps * len(runs), "unit": "GB"}}, "none", None,
           name=f"{args.result}_{'release' if args.release else 'no_release'}")


if __name__ == "__main__":
    main()
