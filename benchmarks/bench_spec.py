"""Speculative decoding vs plain decoding of the same engine, and vs HF's own SD at batch 1.

Part 1 (``sd_sweep``): EAGLE at k draft tokens, batch sizes 1..32, greedy and temperature 1,
plus every drafter at batch 1: speedup, acceptance length tau, and the bound
tau*T1/(k*Td+Tv) from step times measured in the same runs. At each (temperature, batch size)
plain decoding and every drafter alternate inside each repeat; the speedup is the median of
the per-repeat tokens/s ratios (makespans on the engine's clock), with min-max and spread.
Part 2 (batch 1, greedy, same prompts, tokens must agree): HF ``generate`` plain, HF
``generate(assistant_model=<small LM>)`` (assisted generation), HF
``generate(prompt_lookup_num_tokens=k)``, and this engine plain / with the same small LM /
with n-gram / with EAGLE, all seven alternating inside each repeat, wall clock of this
process; ratio = median of the per-repeat ratios against HF ``generate``.
A spread (max-min)/median above ``--wide`` is flagged WIDE in the tables.

``--compile`` runs part 1 on the compiled decode path (``RolloutConfig.compile=True``: the
plain step, the verify pass and the EAGLE head's drafting compiled), plain decoding too, so
its speedups are SD's over compiled plain decoding; ``--ks`` sweeps several draft lengths
there, each with its bound.

    python benchmarks/bench_spec.py --prompts 16 --repeats 3
    python benchmarks/bench_spec.py --compile --ks 2 4 6 8 --batch-sizes 1 8 --skip-hf
"""
from __future__ import annotations

import argparse
import math

import pandas as pd
import torch

from common import (add_common, add_result, disturbed_of, header, print_table, ratio_cells,
                    record, sim_clock)
from workbench.checks import check_int
from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative.defaults import default_drafters
from workbench.speculative.sweep import sd_sweep
from workbench.speedup import interleave, summarize
from workbench.tasks import HELDOUT_SEED, get_problems


def hf_batch1(model, tok, prompts, max_new_tokens, **kw):
    out = []
    for p in prompts:
        enc = tok(p, return_tensors="pt")
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **kw)
        out.append(gen[0, enc["input_ids"].shape[1]:].tolist())
    return out


def sweep_table(table: pd.DataFrame, with_batch: bool = True) -> pd.DataFrame:
    """The printed columns of an sd_sweep table (as docs/lab-notes/ quotes them), the speedup with its spread."""
    rows = []
    for r in table.itertuples():
        stats = {"ratio": r.speedup, "ratio_min": r.speedup_min, "ratio_max": r.speedup_max,
                 "spread": r.speedup_spread, "spread_wide": r.spread_wide}
        cells = ratio_cells(stats)
        rows.append({"temperature": f"{r.temperature:g}",
                     **({"batch": r.batch_size} if with_batch else {}), "drafter": r.drafter,
                     "k": r.k, "tau": f"{r.tau:.2f}", "plain tok/s": f"{r.plain_tok_s:.1f}",
                     "SD tok/s": f"{r.sd_tok_s:.1f}", "speedup": cells["ratio"],
                     "min-max": cells["min-max"], "spread": cells["spread"],
                     "bound": f"{r.bound:.2f}", "identical": bool(r.identical)})
    return pd.DataFrame(rows)


def sweep_figures(table: pd.DataFrame, prefix: str = "") -> dict:
    """The result file's figures of an sd_sweep table: per temperature, batch size and drafter
    the speedup (median of per-repeat ratios, with its range), tau and the bound
    tau*T1/(k*Td+Tv) from the same runs' steps, named
    ``<prefix>speedup_t<temperature>_bs<batch>_<drafter>_k<k>``, ``<prefix>tau_...`` and
    ``<prefix>bound_...``."""
    figures = {}
    for r in table.itertuples():
        key = f"t{r.temperature:g}_bs{r.batch_size}_{r.drafter}_k{r.k}"
        figures[f"{prefix}speedup_{key}"] = {"value": float(r.speedup), "min": float(r.speedup_min),
                                     "max": float(r.speedup_max), "n": int(r.repeats),
                                     "unit": "x"}
        figures[f"{prefix}tau_{key}"] = {"value": float(r.tau)}
        if math.isfinite(r.bound):  # no step times to bound with: no figure
            figures[f"{prefix}bound_{key}"] = {"value": float(r.bound), "unit": "x"}
    return figures


# the lab note a result links, by path (--compile)
NOTES = {False: "2026-11-30-speculative-decoding.md", True: "2026-12-05-compiled-decode-step.md"}


def note_link(compiled: bool) -> str:
    """The sentence ending a result's question that links its lab note (:data:`NOTES`)."""
    name = NOTES[compiled]
    return f"Note: [{name}](docs/lab-notes/{name})."

# the result file's names of part 2's systems, in hf_systems' order
SHORT = ["hf_generate", "hf_assisted_small_lm", "hf_prompt_lookup", "engine_plain",
         "engine_small_lm", "engine_ngram", "engine_eagle"]


def hf_systems(policy, tok, drafters, engine, prompts, k, n) -> dict:
    """Part 2's seven systems, each a callable returning responses (token lists)."""
    small_lm = drafters["small_lm"].model
    runs = {
        "HF `generate`": lambda: hf_batch1(policy, tok, prompts, n),
        "HF `generate(assistant_model=small LM)`": lambda: hf_batch1(
            policy, tok, prompts, n, assistant_model=small_lm),
        f"HF `generate(prompt_lookup_num_tokens={k})`": lambda: hf_batch1(
            policy, tok, prompts, n, prompt_lookup_num_tokens=k),
    }
    cfg = RolloutConfig(max_new_tokens=n, max_batch_size=1, spec_k=k)
    for name, label in (("plain", "engine, plain"), ("small_lm", "engine, SD with the same "
                        "small LM"), ("ngram", "engine, SD with n-gram"),
                        ("eagle", "engine, SD with EAGLE")):
        drafter = None if name == "plain" else drafters[name]
        runs[label] = (lambda d=drafter: engine.rollout(prompts, cfg, drafter=d,
                                                        progress=False).tokens)
    return runs


def against_hf(systems: dict, eos: int, args) -> tuple[pd.DataFrame, dict, float | None]:
    """Part 2: the systems interleaved; tok/s, ratio to HF generate with spread, same tokens;
    the result file's figures (each system's ratio to HF generate) and disturbed share."""
    runs = interleave(systems, args.repeats, warmup=args.warmup)
    cut = [[t[:t.index(eos) + 1] if eos in t else t for t in out]
           for outs in runs.outputs.values() for out in outs]
    reference = cut[0]
    stats = summarize(runs, wide=args.wide).set_index("system")  # baseline: HF generate
    count = sum(len(t) for t in reference)
    rows, figures = [], {}
    for i, name in enumerate(systems):
        if i:
            figures[f"vs_hf_{SHORT[i]}"] = figure_from_stats(stats.loc[name], "x")
        mine = cut[i * args.repeats:(i + 1) * args.repeats]
        rows.append({"system": name, "tok/s": f"{count / stats.loc[name, 'value']:.1f}",
                     **{("vs HF generate" if c == "ratio" else c): v
                        for c, v in ratio_cells(stats.loc[name], baseline=i == 0).items()},
                     "same tokens": all(m == reference for m in mine),
                     "spread_wide": bool(stats.loc[name, "spread_wide"])})
    return pd.DataFrame(rows), figures, disturbed_of(stats)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--ks", type=int, nargs="+", default=None,
                    help="part 1's draft lengths (default: --k; part 2 drafts --k)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                    help="part 1 on the compiled decode path (RolloutConfig.compile=True), "
                    "plain and SD alike; part 2 stays eager (bench_peers.py compares the "
                    "compiled engine with HF and llama.cpp)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--skip-hf", action="store_true", help="part 1 only")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's own, one a core)")
    add_common(ap, repeats=3)
    add_result(ap)
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(check_int("threads", args.threads, 1))

    policy, tok = load_model("default", device=args.device, dtype=getattr(torch, args.dtype))
    engine = RolloutEngine(policy, tok)
    drafters = default_drafters(policy, tok)
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=HELDOUT_SEED)]
    ks = args.ks or [args.k]
    common = dict(repeats=args.repeats, max_new_tokens=args.max_new_tokens, progress=False,
                  wide=args.wide, compile=args.compile)
    path = "the compiled decode path" if args.compile else "the eager decode path"
    print(header(ap, args, f"default policy, device={args.device} dtype={args.dtype} "
                           f"prompts={args.prompts} k={ks} compile={args.compile} "
                           f"max_new_tokens={args.max_new_tokens}"), flush=True)
    curve = sd_sweep(engine, prompts, {"eagle": drafters["eagle"]}, ks=ks,
                     batch_sizes=args.batch_sizes, temperatures=[0.0, 1.0], **common)
    print_table(f"EAGLE vs plain decoding, by batch size ({path}, engine clock, median of "
                "per-repeat tokens/s ratios)", sweep_table(curve), curve["spread_wide"],
                args.wide, "configurations")
    at1 = sd_sweep(engine, prompts, drafters, ks=ks, batch_sizes=[1],
                   temperatures=[0.0, 1.0], **common)
    print_table(f"Every drafter at batch 1 ({path})", sweep_table(at1, with_batch=False),
                at1["spread_wide"], args.wide, "configurations")
    curve_figures = sweep_figures(curve)
    record(args, f"Where does SD pay? EAGLE (k={', '.join(map(str, ks))}) against plain "
           f"decoding of the same engine, both on {path}, at batch sizes {args.batch_sizes}, "
           f"and every drafter at batch 1, greedy and temperature 1: speedup (median of "
           f"per-repeat tokens/s ratios, engine clock) and tau; {args.prompts} held-out "
           f"prompts, max_new_tokens={args.max_new_tokens}. {note_link(args.compile)}",
           {**curve_figures, **sweep_figures(at1, "drafters_")}, sim_clock(), None,
           headline=[k for k in curve_figures if k.startswith(("speedup_t0_", "bound_t0_"))])
    if args.skip_hf:
        return
    table, figures, disturbed = against_hf(hf_systems(policy, tok, drafters, engine, prompts,
                                                      args.k, args.max_new_tokens),
                                           tok.eos_token_id, args)
    print_table("Against HF at batch 1, greedy (wall clock; ratio = median of per-repeat "
                "ratios to HF generate)", table.drop(columns="spread_wide"),
                table["spread_wide"], args.wide, "systems")
    record(args, f"Against HF at batch 1, greedy: each system's tokens/s over HF generate's "
           f"(median of per-repeat ratios), {args.prompts} held-out prompts, k={args.k}, "
           f"max_new_tokens={args.max_new_tokens}. {note_link(False)}",
           figures, "wall", disturbed,
           name=f"{args.result}_vs_hf")


if __name__ == "__main__":
    main()
