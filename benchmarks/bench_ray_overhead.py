"""Ray's overhead on a rollout of notebook 01's default shard, with nothing else to compare.

64 prompts x 4 samples, 384 tokens, batch 32, T=1, the default policy, 2 Ray actors x 1 torch
thread (a local Ray on loopback). Per rollout: the wall makespan (the driver's submit to the
last worker's last step), the results back (the driver's time minus the makespan) and the
weights out (``update_weights``: one ``ray.put``, read by both actors); the overhead is their
sum over the makespan.

    python benchmarks/bench_ray_overhead.py
"""
import argparse
import time
from dataclasses import replace

import pandas as pd

from common import add_result, record
from workbench.models import load_model
from workbench.rollout import RayBackend, RolloutConfig, RolloutEngine
from workbench.tasks import HELDOUT_SEED, get_problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_result(ap)
    args = ap.parse_args()
    policy, tok = load_model("default")
    problems = get_problems("running_sum", 64, seed=HELDOUT_SEED)
    cfg = RolloutConfig(max_new_tokens=384, temperature=1.0, samples_per_prompt=4, workers=2,
                        max_batch_size=32)
    backend = RayBackend(threads_per_worker=1)
    engine = RolloutEngine(policy, tok, backend=backend)
    engine.start(2)
    rows = []
    for r in range(3):
        started = time.perf_counter()
        res = engine.rollout([p.prompt for p in problems], replace(cfg, seed=r), progress=False)
        wall = time.perf_counter() - started
        started = time.perf_counter()
        engine.update_weights(policy=policy.state_dict())
        weights = time.perf_counter() - started
        makespan = res.timeline.makespan_s
        print(f"rollout {r}: wall makespan {makespan:.2f} s, driver {wall:.2f} s, results back "
              f"{wall - makespan:.3f} s, weights out {weights:.3f} s, overhead "
              f"{(wall - makespan + weights) / makespan:.1%}", flush=True)
        rows.append({"overhead": (wall - makespan + weights) / makespan, "makespan_s": makespan,
                     "results_back_s": wall - makespan, "weights_out_s": weights})
    backend.close()
    figures = {name: {"value": float(v.median()), "min": float(v.min()), "max": float(v.max()),
                      "n": len(v), **({} if name == "overhead" else {"unit": "s"})}
               for name, v in pd.DataFrame(rows).items()}
    record(args, "Ray's overhead on a rollout of notebook 01's default shard (64 x 4, 384 "
           "tokens, 2 actors x 1 thread): results back plus weights out over the wall makespan "
           "(median of 3 rollouts)", figures, "wall", None, headline=["overhead"])


if __name__ == "__main__":
    main()
