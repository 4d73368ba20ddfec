"""Where a compiled plain decode step's time goes (issue 41): the default policy, float32,
one torch thread, a rollout of ``--batch-size`` prompts decoding ``--max-new-tokens`` tokens
a row with ``compile=True`` (a warm-up rollout compiles first). Each step's thread CPU time
is split into the Python preparation of the call (``CompiledDecode.prepare``), the graph call
and the bookkeeping after it (the cache views set, the batch's rows taken); a
``torch.profiler`` pass over one more rollout gives dynamo's guard check (``TorchDynamo
Cache Lookup``; inductor's C++ wrapper calls its kernels out of the profiler's sight), and
the step's matmuls run alone at its shapes (every layer's fused q/k/v, output, gate/up and
down projections and the LM head, ``F.linear`` on the batch's rows) give the part of the
graph call no compiling removes. Medians over the steps of ``--repeats`` rollouts; the
eager step's decode row beside it.

    python benchmarks/profile_compiled_step.py --batch-size 1
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from workbench.models import load_model
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.compiled import CompiledDecode
from workbench.tasks import HELDOUT_SEED, get_problems


def decode_us(res) -> float:
    """The median decode row of a rollout's steps table, in microseconds."""
    steps = res.timeline.steps
    dec = steps[steps["kind"] == "decode"]
    return statistics.median(dec["end_s"] - dec["start_s"]) * 1e6


class SplitTimer:
    """A :class:`CompiledDecode` subclass's hooks timing prepare, the graph call and the
    bookkeeping after it on this thread's CPU clock (seconds per step, appended)."""

    def __init__(self):
        self.parts = {"prepare": [], "graph": [], "after": []}

    def patch(self):
        parts, prepare = self.parts, CompiledDecode.prepare

        def timed_prepare(c, *args, **kwargs):
            t = time.thread_time()
            call = prepare(c, *args, **kwargs)
            parts["prepare"].append(time.thread_time() - t)
            return call

        def timed_run(c, call):
            t0 = time.thread_time()
            out = call.fn(*call.args)
            t1 = time.thread_time()
            for layer in call.layers:
                layer.set_views(call.rows, call.width)
            rows = tuple(t[:call.rows] for t in out)
            parts["graph"].append(t1 - t0)
            parts["after"].append(time.thread_time() - t1)
            return rows
        return timed_prepare, timed_run


def matmul_us(model, rows: int, repeats: int = 50) -> float:
    """Microseconds of a step's matmuls alone (thread CPU, median of ``repeats``): every
    layer's projections and the LM head on ``[rows, 1, H]``-shaped inputs."""
    from workbench.rollout.forward import policy_forward
    forward = policy_forward(model)
    weights = [w for p in forward._plans() for w in (p.w_qkv, p.w_o, p.w_gate_up, p.w_down)]
    weights.append(model.lm_head.weight.detach())
    inputs = [torch.randn(rows, 1, w.shape[1]) for w in weights]
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            t = time.thread_time()
            for x, w in zip(inputs, weights):
                torch.nn.functional.linear(x, w)
            times.append(time.thread_time() - t)
    return statistics.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model("default", device="cpu", dtype=torch.float32)
    engine = RolloutEngine(model, tok)
    prompts = [p.prompt for p in get_problems("running_sum", args.batch_size,
                                              seed=HELDOUT_SEED)]
    cfg = RolloutConfig(max_new_tokens=args.max_new_tokens, max_batch_size=args.batch_size,
                        ignore_eos=True)
    rollout = lambda compile_: engine.rollout(prompts, cfg, compile=compile_, progress=False)
    rollout(True)  # compiles
    rollout(False)
    eager = statistics.median(decode_us(rollout(False)) for _ in range(args.repeats))
    timer = SplitTimer()
    saved = CompiledDecode.prepare, CompiledDecode.run
    CompiledDecode.prepare, CompiledDecode.run = timer.patch()
    try:
        compiled = statistics.median(decode_us(rollout(True)) for _ in range(args.repeats))
    finally:
        CompiledDecode.prepare, CompiledDecode.run = saved
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        rollout(True)
    ops = {e.key: e for e in prof.key_averages()}
    calls = ops["TorchDynamo Cache Lookup"].count
    per = lambda name: ops[name].self_cpu_time_total / calls if name in ops else 0.0
    print(f"batch {args.batch_size}: decode row eager {eager:.0f} us, compiled "
          f"{compiled:.0f} us; compiled step split (thread CPU, median): " + ", ".join(
              f"{k} {statistics.median(v) * 1e6:.0f} us" for k, v in timer.parts.items()))
    print(f"the step's {len(model.model.layers) * 4 + 1} matmuls alone: "
          f"{matmul_us(model, args.batch_size):.0f} us; under torch.profiler (its own "
          f"overhead included), dynamo's guard check per call "
          f"{per('TorchDynamo Cache Lookup'):.0f} us")


if __name__ == "__main__":
    main()
