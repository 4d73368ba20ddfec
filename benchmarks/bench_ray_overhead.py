"""Ray's overhead on a rollout of notebook 01's default shard, with nothing else to compare.

64 prompts x 4 samples, 384 tokens, batch 32, T=1, the default policy, 2 Ray actors x 1 torch
thread (a local Ray on loopback). Per rollout: the wall makespan (the driver's submit to the
last worker's last step), the results back (the driver's time minus the makespan) and the
weights out (``update_weights``: one ``ray.put``, read by both actors); the overhead is their
sum over the makespan.

    python benchmarks/bench_ray_overhead.py
"""
import time
from dataclasses import replace

from workbench.models import load_model
from workbench.rollout import RayBackend, RolloutConfig, RolloutEngine
from workbench.tasks import HELDOUT_SEED, get_problems


def main():
    policy, tok = load_model("default")
    problems = get_problems("running_sum", 64, seed=HELDOUT_SEED)
    cfg = RolloutConfig(max_new_tokens=384, temperature=1.0, samples_per_prompt=4, workers=2,
                        max_batch_size=32)
    backend = RayBackend(threads_per_worker=1)
    engine = RolloutEngine(policy, tok, backend=backend)
    engine.start(2)
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
    backend.close()


if __name__ == "__main__":
    main()
