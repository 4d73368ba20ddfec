"""Where a compiled plain decode step's time goes (issue 41): the default policy, float32,
one torch thread, rollouts of each of ``--batch-sizes`` prompts decoding
``--max-new-tokens`` tokens a row with ``compile=True`` (a warm-up rollout compiles first).
Each step's thread CPU time is split into the Python preparation of the call
(``CompiledDecode.prepare``), the graph call and the bookkeeping after it (the cache views
set, the batch's rows taken); the step's matmuls run alone at its shapes (every layer's
fused q/k/v, output, gate/up and down projections and the LM head, ``F.linear`` on the
batch's rows) right after each step, so that they see the same load, give the part of the
graph call no compiling removes; a ``torch.profiler`` pass over one more rollout gives
dynamo's guard check (``TorchDynamo Cache Lookup``, the profiler's overhead included;
inductor's C++ wrapper calls its kernels out of the profiler's sight). Medians over the
steps of ``--repeats`` rollouts; the decode rows of eager and compiled rollouts
(alternating, without the split's hooks) beside.

    python benchmarks/profile_compiled_step.py --batch-sizes 1 8 --metrics m.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

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

    def __init__(self, matmuls):
        self.parts = {"prepare": [], "graph": [], "after": [], "matmuls": []}
        self.matmuls = matmuls  # a call running the step's matmuls alone, after each step

    def patch(self):
        parts, prepare, matmuls = self.parts, CompiledDecode.prepare, self.matmuls

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
            t2 = time.thread_time()
            matmuls()  # at the same moment as the step: the load swings
            parts["matmuls"].append(time.thread_time() - t2)
            return rows
        return timed_prepare, timed_run


def matmuls_of(model, rows: int):
    """A call running a step's matmuls alone: every layer's projections and the LM head,
    ``F.linear`` on ``[rows, 1, H]``-shaped inputs."""
    from workbench.rollout.forward import policy_forward
    forward = policy_forward(model)
    weights = [w for p in forward._plans() for w in (p.w_qkv, p.w_o, p.w_gate_up, p.w_down)]
    weights.append(model.lm_head.weight.detach())
    inputs = [torch.randn(rows, 1, w.shape[1]) for w in weights]

    @torch.no_grad()
    def run():
        for x, w in zip(inputs, weights):
            torch.nn.functional.linear(x, w)
    return run


def split(engine, model, bs: int, args) -> dict:
    """The figures of one batch size: ``{name_bs<bs>: microseconds}``."""
    prompts = [p.prompt for p in get_problems("running_sum", bs, seed=HELDOUT_SEED)]
    cfg = RolloutConfig(max_new_tokens=args.max_new_tokens, max_batch_size=bs, ignore_eos=True)
    rollout = lambda compile_: engine.rollout(prompts, cfg, compile=compile_, progress=False)
    rollout(True)  # compiles
    rollout(False)
    rows = [(decode_us(rollout(False)), decode_us(rollout(True))) for _ in range(args.repeats)]
    timer = SplitTimer(matmuls_of(model, bs))
    saved = CompiledDecode.prepare, CompiledDecode.run
    CompiledDecode.prepare, CompiledDecode.run = timer.patch()
    try:  # the decode rows of these include the matmuls run alone: no step time read here
        for _ in range(args.repeats):
            rollout(True)
    finally:
        CompiledDecode.prepare, CompiledDecode.run = saved
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        rollout(True)
    lookup = {e.key: e for e in prof.key_averages()}["TorchDynamo Cache Lookup"]
    figures = {"eager_step_us": statistics.median(e for e, _ in rows),
               "compiled_step_us": statistics.median(c for _, c in rows),
               **{f"{k}_us": statistics.median(v) * 1e6 for k, v in timer.parts.items()},
               "guard_check_profiled_us": lookup.self_cpu_time_total / lookup.count}
    print(f"batch {bs}: " + ", ".join(f"{k} {v:.0f}" for k, v in figures.items()), flush=True)
    return {f"{k}_bs{bs}": v for k, v in figures.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--metrics", help="write the figures here (JSON), for "
                    "`workbench results record`")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model("default", device="cpu", dtype=torch.float32)
    engine = RolloutEngine(model, tok)
    figures = {"clock": "sim-thread-cpu"}
    for bs in args.batch_sizes:
        figures.update(split(engine, model, bs, args))
    if args.metrics:
        Path(args.metrics).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
