"""The CUDA checks, in one run sized for a short GPU loan: bf16, the rollout engine, SD, TLT.

1. Plain decoding of the default policy through the rollout engine in float32 and bfloat16:
   tokens/s at growing batch sizes (where the GPU stops gaining from batch).
2. SD with the EAGLE head (and, at batch 1, every default drafter) against plain decoding of
   the same engine, greedy, per dtype: speedup (median of per-repeat ratios, with spread), tau,
   and whether the SD tokens equal the plain ones (lossless; ``diverged_at`` otherwise).
3. A short TLT ablation (baseline against TLT, one seed) on the GPU: the sim-clock end-to-end
   speedup beside its Amdahl prediction, and the wall time per RL step.
4. The compiled decode step (``RolloutConfig.compile=True``: inductor's kernels, Triton's on
   CUDA) against the eager one, plain greedy float32 rollouts alternating in each repeat: the
   speedup per batch size, whether the tokens agree, and the compile seconds. CUDA graphs are
   not wired into the compiled step yet (they need the KV cache's buffers at static
   addresses), so this is the compiled step without them.

Each part is timed and skipped once ``--budget`` seconds are spent, so a loan's limit never
loses the tables already printed; they also go to ``--out`` as markdown.

    python benchmarks/gpu_check.py --out gpu_check.md
"""
from __future__ import annotations

import argparse
import platform
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

from common import command_line, ratio_cells, tokens_agree
from workbench.checks import check_choice, check_int, check_list, check_positive
from workbench.models import load_model
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.compiled import compiled_decode_for
from workbench.rollout.forward import policy_forward
from workbench.speculative.defaults import default_drafters
from workbench.speculative.sweep import sd_sweep
from workbench.speedup import interleave, markdown, summarize
from workbench.tasks import HELDOUT_SEED, get_problems


class Report:
    """Markdown sections printed as they come and rewritten to ``path`` after each one."""

    def __init__(self, path: Path):
        self.path, self.parts = path, []

    def add(self, text: str) -> None:
        print(text, flush=True)
        self.parts.append(text)
        self.path.write_text("\n\n".join(self.parts) + "\n")


def environment(device) -> str:
    import transformers
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return (f"device {device} ({name}), torch {torch.__version__}, transformers "
            f"{transformers.__version__}, python {platform.python_version()}")


def plain_throughput(device, prompts, batch_sizes, max_new_tokens) -> pd.DataFrame:
    """Tokens/s of plain greedy decoding per dtype and batch size (best of 2, after a warm-up)."""
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        policy, tok = load_model("default", device=device, dtype=dtype)
        engine = RolloutEngine(policy, tok)
        engine.rollout(prompts[:8], max_new_tokens=16, progress=False)  # warm-up
        for bs in batch_sizes:
            cfg = RolloutConfig(max_new_tokens=max_new_tokens, max_batch_size=bs)
            best = 0.0
            for _ in range(2):
                res = engine.rollout(prompts[:bs], cfg, progress=False)
                best = max(best, sum(map(len, res.tokens)) / res.timeline.makespan_s)
            rows.append({"dtype": str(dtype).removeprefix("torch."), "batch": bs,
                         "tokens/s": f"{best:,.0f}"})
    return pd.DataFrame(rows)


def sd_table(device, prompts, dtype, batch_sizes, repeats, max_new_tokens) -> pd.DataFrame:
    """sd_sweep with EAGLE over ``batch_sizes`` and every drafter at batch 1, one dtype."""
    policy, tok = load_model("default", device=device, dtype=dtype)
    engine = RolloutEngine(policy, tok)
    drafters = default_drafters(policy, tok)
    # one wave per batch size (at least 8 prompts): all prompts at batch 1 would take minutes
    parts = [sd_sweep(engine, prompts[:max(bs, 8)], drafters if bs == 1
                      else {"eagle": drafters["eagle"]}, ks=[4], batch_sizes=[bs],
                      repeats=repeats, max_new_tokens=max_new_tokens, progress=False)
             for bs in batch_sizes]
    rows = []
    for r in pd.concat(parts).itertuples():
        cells = ratio_cells({"ratio": r.speedup, "ratio_min": r.speedup_min,
                             "ratio_max": r.speedup_max, "spread": r.speedup_spread,
                             "spread_wide": r.spread_wide})
        rows.append({"dtype": str(dtype).removeprefix("torch."), "batch": r.batch_size,
                     "drafter": r.drafter, "k": r.k, "tau": f"{r.tau:.2f}",
                     "plain tok/s": f"{r.plain_tok_s:,.0f}", "SD tok/s": f"{r.sd_tok_s:,.0f}",
                     "speedup": cells["ratio"], "min-max": cells["min-max"],
                     "spread": cells["spread"], "identical": bool(r.identical),
                     "diverged_at": getattr(r, "diverged_at", None)})
    return pd.DataFrame(rows)


def compiled_table(device, prompts, batch_sizes, repeats, max_new_tokens) -> pd.DataFrame:
    """The compiled step against the eager one in plain greedy float32 rollouts of the default
    policy, alternating inside each repeat (its graphs compiled in the warm-up): per batch size
    (a wave of that many prompts) the median of per-repeat ratios of eager's rollout seconds
    over compiled's, the share of requests whose tokens agree (float32 kernels may round a
    near-tie differently) and the seconds its graphs took to compile."""
    policy, tok = load_model("default", device=device, dtype=torch.float32)
    engine, rows = RolloutEngine(policy, tok), []
    compiled = compiled_decode_for(policy_forward(policy), True)
    for bs in batch_sizes:
        cfg = RolloutConfig(max_new_tokens=max_new_tokens, max_batch_size=bs)
        systems = {name: (lambda on=on: engine.rollout(prompts[:bs], cfg, compile=on,
                                                       progress=False).tokens)
                   for name, on in (("compiled", True), ("eager", False))}
        before = sum(compiled.compiles.values())
        runs = interleave(systems, repeats, warmup=1)
        stats = summarize(runs, baseline="eager").set_index("system")
        agree = tokens_agree(runs, "compiled", "eager")
        rows.append({"batch": bs, **ratio_cells(stats.loc["compiled"]),
                     "eager s": f"{stats.loc['eager', 'value']:.3f}",
                     "compiled s": f"{stats.loc['compiled', 'value']:.3f}",
                     "tokens agree": f"{agree:.0%}",
                     "compile s": f"{sum(compiled.compiles.values()) - before:.1f}"})
    return pd.DataFrame(rows)


TLT_VARIANTS = ("baseline", "tlt")
PARTS = (0, 1, 2, 3, 4)


def tlt_grpo(prompts_per_step, samples, max_new_tokens):
    """The GRPO config of the TLT part (16 workers on the sim clock)."""
    from workbench.rl import GRPOConfig
    return GRPOConfig.flat(prompts_per_step=prompts_per_step, samples_per_prompt=samples,
                           max_new_tokens=max_new_tokens, workers=16, lr=2e-4)


def tlt_table(device, steps, prompts_per_step, samples, max_new_tokens) -> tuple:
    """Baseline against TLT for ``steps`` RL steps on ``device``: docs/design.md's measures."""
    from workbench.rl.ablation.runner import run_ablation
    from workbench.rl.setup import rl_setup
    setup = rl_setup()
    assert setup.policy.device.type == device.type, setup.policy.device
    grpo = tlt_grpo(prompts_per_step, samples, max_new_tokens)
    t0 = time.perf_counter()
    abl = run_ablation(setup.policy, setup.tokenizer, setup.pool, grpo, steps,
                       variants=TLT_VARIANTS, drafter_head=setup.drafter_head,
                       reward=setup.reward, progress=False)
    wall = time.perf_counter() - t0
    pv = abl.per_variant()
    cols = ["variant", "step_s", "rollout_s", "rollout_fraction", "e2e_speedup",
            "rollout_speedup", "amdahl_prediction", "accept_len", "reward_final"]
    return pv[cols].round(3), wall / (2 * steps)


def check_args(args) -> None:
    """Refuse a bad argument (a ValueError naming it and what is accepted) before the report
    is written or anything runs: a loan's minutes are not spent on a run that fails late."""
    for name in ("prompts", "max_new_tokens", "repeats", "rl_steps", "rl_prompts", "rl_samples"):
        check_int(f"--{name.replace('_', '-')}", getattr(args, name), 1)
    check_list("--batch-sizes", args.batch_sizes, lambda n, b: check_int(n, b, 1, args.prompts),
               f"integers in [1, {args.prompts}] (--prompts)")
    check_list("--parts", args.parts, lambda n, p: check_choice(n, p, PARTS), f"of {PARTS}")
    check_positive("--budget", args.budget)
    if 3 in args.parts:
        from workbench.rl.ablation.runner import check_ablation
        check_ablation(args.rl_steps, TLT_VARIANTS, (0,),
                       tlt_grpo(args.rl_prompts, args.rl_samples, args.max_new_tokens))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.md"))
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rl-steps", type=int, default=3)
    ap.add_argument("--rl-prompts", type=int, default=16)
    ap.add_argument("--rl-samples", type=int, default=8)
    ap.add_argument("--parts", type=int, nargs="+", default=list(PARTS),
                    help="which parts to run: 0 plain, 1 SD float32, 2 SD bfloat16, 3 TLT, "
                         "4 compiled against eager")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds; parts not started by then are skipped")
    args = ap.parse_args()
    check_args(args)
    device = torch.device(args.device)
    start = time.perf_counter()
    report = Report(args.out)
    report.add(f"# GPU check\n\n{environment(device)}\n\nCommand:\n\n```bash\n"
               f"{command_line(ap, args)}\n```")
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=HELDOUT_SEED)]
    parts = [("Plain decoding, greedy, tokens/s (best of 2)",
              lambda: plain_throughput(device, prompts, args.batch_sizes, args.max_new_tokens))]
    for dtype in (torch.float32, torch.bfloat16):
        parts.append((f"SD against plain decoding, greedy, {str(dtype).removeprefix('torch.')}, k 4, "
                      f"{args.repeats} repeats",
                      lambda d=dtype: sd_table(device, prompts, d, args.batch_sizes,
                                               args.repeats, args.max_new_tokens)))
    parts.append((f"TLT against the baseline, {args.rl_steps} RL steps, P {args.rl_prompts} x "
                  f"G {args.rl_samples}, {args.max_new_tokens} tokens, 16 workers, float32",
                  lambda: tlt_table(device, args.rl_steps, args.rl_prompts, args.rl_samples,
                                    args.max_new_tokens)))
    parts.append((f"The compiled decode step against the eager one, plain, greedy, float32, "
                  f"{args.repeats} repeats",
                  lambda: compiled_table(device, prompts, args.batch_sizes, args.repeats,
                                         args.max_new_tokens)))
    parts = [p for i, p in enumerate(parts) if i in args.parts]
    for title, part in parts:
        spent = time.perf_counter() - start
        if spent > args.budget:
            report.add(f"## {title}\n\nskipped: {spent:.0f} s of the {args.budget:.0f} s "
                       "budget spent")
            continue
        t0 = time.perf_counter()
        try:
            out = part()
        except Exception:
            report.add(f"## {title}\n\nFAILED:\n\n```\n{traceback.format_exc()}```")
            continue
        table, extra = out if isinstance(out, tuple) else (out, None)
        note = f"\n\nwall per RL step and variant: {extra:.1f} s" if extra else ""
        report.add(f"## {title}\n\n{markdown(table)}{note}\n\n"
                   f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
