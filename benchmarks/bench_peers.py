"""The engine beside llama.cpp and HF at batch 1, greedy, one thread each, same prompt token
ids, tokens checked equal (issue 41).

Systems, all alternating inside each of ``--repeats`` repeats (the order rotating), wall clock
of this process, batch 1, greedy, ``--max-new-tokens`` (the engine's default, 256) or EOS:

- the engine (``RolloutEngine``, its lean forward): plain; SD with the shipped EAGLE head;
  SD with the shipped small LM (k = ``--k``); and on its compiled path
  (``RolloutConfig.compile=True``: ``rollout.compiled``, compiled in the untimed first call)
  plain and SD with the EAGLE head.
- HF ``generate``: eager (dynamic cache); a static cache with ``torch.compile`` (inductor on
  CPU, compiled once before timing); assisted generation with the same small LM; prompt
  lookup (``prompt_lookup_num_tokens=k``).
- llama.cpp through ``llama-cpp-python`` (``pip install -e '.[peers]'``; skipped, with the
  reason printed, when it is not installed), on the policy written as a float32 GGUF by
  ``gguf_export.py`` (float32 KV cache too), ``n_threads=1``: plain; with the API's
  ``draft_model`` hook driving a second llama.cpp context on the small LM written the same way
  (greedy chain of k); and with the API's own drafter, ``LlamaPromptLookupDecoding``.

Every system gets the same prompt token ids (the HF tokenizer's, BOS included; llama.cpp's GGUF
has a synthetic vocabulary and is fed ids). Every system's responses, cut after EOS, must equal
the engine's plain ones in every repeat: a mismatch stops the run. Before timing, llama.cpp's
logits on one prompt are compared with HF's (max abs difference printed).
Ratio: median of the per-repeat ratios of tokens/s to the engine's plain (same tokens, so
seconds over seconds), with min-max and spread. Torch runs on one thread
(``torch.set_num_threads(1)``). Also printed: the share of llama.cpp's time inside its C decode
calls (``llama_perf_context``) and the share of the engine's decode-step time inside its forward,
and llama.cpp's plain tok/s over the compiled engine's (median of per-repeat ratios, figure
``llamacpp_over_engine_compiled``: issue 41 asks for at most 1.5), and SD with the EAGLE head
over plain, both compiled (``eagle_compiled_over_compiled``: it asks for 2x), with its bound
tau * T1 / (k * Td + Tv) from the same runs' steps beside it (``eagle_compiled_bound``).

    python benchmarks/bench_peers.py --prompts 12 --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from common import add_common, add_result, disturbed_of, header, print_table, ratio_cells, record
from workbench.models import load_model
from workbench.provenance import figure_from_stats
from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.speculative.defaults import default_drafters
from workbench.speculative.measure import acceptance_length, sd_bound, step_times
from workbench.speedup import interleave, summarize
from workbench.tasks import HELDOUT_SEED, get_problems

ENGINE_PLAIN = "engine, plain (eager)"
ENGINE_COMPILED, LLAMA_PLAIN = "engine, compiled", "llama.cpp, plain"
ENGINE_EAGLE_COMPILED = "engine, compiled, SD with EAGLE"


def llama_cpp_missing() -> str | None:
    """Why llama.cpp cannot run here (None when it can)."""
    try:
        import llama_cpp  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as e:
        return (f"{e.name} is not installed (pip install -e '.[peers]'; llama-cpp-python builds "
                "from source with cmake and a C++ compiler)")
    return None


def cut(tokens: list[int], eos: int) -> list[int]:
    return tokens[:tokens.index(eos) + 1] if eos in tokens else list(tokens)


# ---- HF ---------------------------------------------------------------------------------

def hf_batch1(model, ids: list[list[int]], max_new_tokens: int, eos: int, pad: int,
              static_cache=None, **kw) -> list[list[int]]:
    out = []
    for p in ids:
        x = torch.tensor([p])
        if static_cache is not None:
            static_cache.reset()
            kw["past_key_values"] = static_cache
        gen = model.generate(input_ids=x, attention_mask=torch.ones_like(x),
                             max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                             pad_token_id=pad, **kw)
        out.append(gen[0, len(p):].tolist())
    return out


def hf_compiled(model, max_cache_len: int):
    """``generate`` kwargs for a static cache compiled with inductor on CPU (transformers
    compiles the decode forward only on accelerators unless ``_compile_all_devices``), and
    the one preallocated cache every prompt reuses (reset per prompt: one shape, one graph)."""
    from transformers import CompileConfig, StaticCache
    cc = CompileConfig(dynamic=False, mode="default")
    cc._compile_all_devices = True
    return StaticCache(config=model.config, max_cache_len=max_cache_len), {"compile_config": cc}


# ---- llama.cpp --------------------------------------------------------------------------

def llama_context(path: Path, n_ctx: int, logits_all: bool = False, draft_model=None):
    """A llama.cpp context on one thread, float32 KV cache (the weights are float32 too)."""
    import llama_cpp
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=1,
                           n_threads_batch=1, type_k=llama_cpp.GGML_TYPE_F32,
                           type_v=llama_cpp.GGML_TYPE_F32, logits_all=logits_all,
                           draft_model=draft_model, verbose=False, seed=0)


def last_logits(llm) -> np.ndarray:
    """The logits of the last token of the last ``eval`` (a context without logits_all)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


class LlamaCppDraft:
    """``llama_cpp.Llama(draft_model=...)``'s hook driving a second llama.cpp context (the
    small LM): its cache keeps the longest prefix it shares with the ids it is given, then k
    greedy draft tokens (the last one not fed back). llama-cpp-python ships only prompt lookup
    as a drafter; this is the draft-model SD its API allows."""

    def __init__(self, llm, k: int, eos: int):
        self.llm, self.k, self.eos = llm, k, eos

    def __call__(self, input_ids, /, **kwargs):
        llm, ids = self.llm, input_ids.tolist()
        n, cached = 0, llm.input_ids[:llm.n_tokens].tolist()
        limit = min(len(ids) - 1, len(cached))
        while n < limit and cached[n] == ids[n]:
            n += 1
        llm.n_tokens = n          # eval drops the cache from n on
        llm.eval(ids[n:])
        drafts = []
        for i in range(self.k):
            t = int(np.argmax(last_logits(llm)))
            drafts.append(t)
            if t == self.eos or i == self.k - 1:
                break
            llm.eval([t])
        return np.array(drafts, dtype=np.intc)


def llama_generate(llm, ids: list[list[int]], max_new_tokens: int, eos: int) -> list[list[int]]:
    """Greedy (llama.cpp's greedy sampler) from each prompt's ids, to EOS or the cap."""
    out = []
    for p in ids:
        llm.reset()
        toks = []
        for t in llm.generate(p, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            toks.append(int(t))
            if t == eos or len(toks) >= max_new_tokens:
                break
        out.append(toks)
    return out


def llama_perf(llm) -> tuple[float, int, float, int]:
    """(prompt eval s, prompt tokens, decode s, decode calls) since the last reset."""
    import llama_cpp
    d = llama_cpp.llama_perf_context(llm._ctx.ctx)
    return d.t_p_eval_ms / 1e3, d.n_p_eval, d.t_eval_ms / 1e3, d.n_eval


def llama_perf_reset(llm) -> None:
    import llama_cpp
    llama_cpp.llama_perf_context_reset(llm._ctx.ctx)


def logits_check(policy, llm, ids: list[int]) -> float:
    """Max |HF logits - llama.cpp logits| over every position of one prompt."""
    with torch.inference_mode():
        ref = policy(torch.tensor([ids])).logits[0].float().numpy()
    llm.reset()
    llm.eval(ids)
    got = np.asarray(llm.scores[:len(ids)])
    return float(np.abs(ref - got).max())


# ---- the run ----------------------------------------------------------------------------

def systems_of(args, policy, tok, engine, drafters, ids, prompts, llama) -> dict:
    n, eos, pad, k = args.max_new_tokens, tok.eos_token_id, tok.pad_token_id, args.k
    cfg = RolloutConfig(max_new_tokens=n, max_batch_size=1, spec_k=k)
    out = {}

    def engine_run(d, compiled=False):
        res = engine.rollout(prompts, cfg, drafter=d, progress=False, compile=compiled)
        return res.tokens, res.timeline
    out[ENGINE_PLAIN] = lambda: engine_run(None)
    out[ENGINE_COMPILED] = lambda: engine_run(None, compiled=True)
    out["engine, SD with EAGLE"] = lambda: engine_run(drafters["eagle"])
    out[ENGINE_EAGLE_COMPILED] = lambda: engine_run(drafters["eagle"], True)
    out["engine, SD with the small LM"] = lambda: engine_run(drafters["small_lm"])
    out["HF `generate`, eager"] = lambda: hf_batch1(policy, ids, n, eos, pad)
    if args.hf_compile:
        cache, kw = hf_compiled(policy, policy.config.max_position_embeddings)
        out["HF `generate`, static cache + compile"] = lambda: hf_batch1(
            policy, ids, n, eos, pad, static_cache=cache, **kw)
    small_lm = drafters["small_lm"].model
    out["HF assisted generation, small LM"] = lambda: hf_batch1(
        policy, ids, n, eos, pad, assistant_model=small_lm)
    out[f"HF prompt lookup (k={k})"] = lambda: hf_batch1(policy, ids, n, eos, pad,
                                                          prompt_lookup_num_tokens=k)
    if llama:
        for name, llm in llama.items():
            out[name] = (lambda m=llm: (llama_perf_reset(m), llama_generate(m, ids, n, eos),
                                        llama_perf(m))[1:])
    return out


SHORT = {ENGINE_PLAIN: "engine_plain", "engine, SD with EAGLE": "engine_eagle",
         "engine, compiled": "engine_compiled",
         "engine, compiled, SD with EAGLE": "engine_compiled_eagle",
         "engine, SD with the small LM": "engine_small_lm",
         "HF `generate`, eager": "hf_eager", "HF `generate`, static cache + compile": "hf_compiled",
         "HF assisted generation, small LM": "hf_assisted_small_lm",
         "llama.cpp, plain": "llamacpp_plain", "llama.cpp, SD with the small LM": "llamacpp_small_lm"}


def short(name: str) -> str:
    if name in SHORT:
        return SHORT[name]
    return "hf_prompt_lookup" if name.startswith("HF prompt") else "llamacpp_prompt_lookup"


def tokens_of(name: str, output) -> list[list[int]]:
    if name.startswith("engine"):
        return output[0]
    if name.startswith("llama.cpp"):
        return output[0]
    return output


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=RolloutConfig.max_new_tokens)
    ap.add_argument("--k", type=int, default=RolloutConfig.spec_k,
                    help="draft tokens per step (engine SD, llama.cpp SD, HF prompt lookup)")
    ap.add_argument("--hf-compile", action=argparse.BooleanOptionalAction, default=True,
                    help="HF generate with a static cache and torch.compile (compiles once, "
                    "minutes on 2 cores)")
    ap.add_argument("--llama-cpp", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--gguf-dir", default=None, help="where the GGUF files go (default: a "
                    "temporary folder)")
    add_common(ap, repeats=5)
    add_result(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)

    policy, tok = load_model("default", device="cpu", dtype=torch.float32)
    engine = RolloutEngine(policy, tok)
    drafters = default_drafters(policy, tok, names=("eagle", "small_lm"))
    prompts = [p.prompt for p in get_problems("running_sum", args.prompts, seed=HELDOUT_SEED)]
    ids = [tok(p)["input_ids"] for p in prompts]
    eos = tok.eos_token_id
    n_ctx = max(map(len, ids)) + args.max_new_tokens + args.k + 8

    llama, skipped = {}, llama_cpp_missing() if args.llama_cpp else "--no-llama-cpp"
    if skipped is None:
        import llama_cpp
        from gguf_export import export_gguf
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        folder = Path(args.gguf_dir or tempfile.mkdtemp(prefix="peers_"))
        gp = export_gguf(policy, tok, folder / "policy.gguf")
        gd = export_gguf(drafters["small_lm"].model, tok, folder / "small_lm.gguf",
                         name="workbench-drafter")
        plain = llama_context(gp, n_ctx)
        diff = logits_check(policy, llama_context(gp, n_ctx, logits_all=True), ids[0])
        print(f"llama.cpp {llama_cpp.__version__}: max |logits - HF logits| on prompt 0 "
              f"({len(ids[0])} tokens): {diff:.2e}", flush=True)
        llama[LLAMA_PLAIN] = plain
        llama["llama.cpp, SD with the small LM"] = llama_context(
            gp, n_ctx, draft_model=LlamaCppDraft(llama_context(gd, n_ctx), args.k, eos))
        llama[f"llama.cpp, prompt lookup (k={args.k})"] = llama_context(
            gp, n_ctx, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=args.k))
    else:
        print(f"llama.cpp skipped: {skipped}", flush=True)

    # every system once on the first prompt, untimed: lazy initialisation, and HF's compile
    import time
    for name, fn in systems_of(args, policy, tok, engine, drafters, ids[:1], prompts[:1],
                               llama).items():
        t0 = time.perf_counter()
        fn()
        print(f"first call of {name} (one prompt): {time.perf_counter() - t0:.1f} s", flush=True)
    systems = systems_of(args, policy, tok, engine, drafters, ids, prompts, llama)
    runs = interleave(systems, args.repeats, warmup=args.warmup)

    reference = [cut(t, eos) for t in tokens_of(ENGINE_PLAIN, runs.outputs[ENGINE_PLAIN][0])]
    for name, outs in runs.outputs.items():
        for r, out in enumerate(outs):
            got = [cut(t, eos) for t in tokens_of(name, out)]
            if got != reference:
                bad = [i for i, (a, b) in enumerate(zip(got, reference)) if a != b]
                raise SystemExit(f"{name}, repeat {r}: tokens differ from the engine's plain "
                                 f"on prompts {bad}")
    count = sum(len(t) for t in reference)
    stats = summarize(runs, baseline=ENGINE_PLAIN, wide=args.wide).set_index("system")

    rows, figures = [], {}
    for name in systems:
        s = stats.loc[name]
        cells = ratio_cells(s, baseline=name == ENGINE_PLAIN)
        note = ""
        if name.startswith("engine"):
            shares = [forward_share(timeline.steps) for _, timeline in runs.outputs[name]]
            note = f"forward {statistics.median(shares):.0%} of decode-step time"
        elif name.startswith("llama.cpp"):
            perf = [p for _, p in runs.outputs[name]]
            walls = runs.table[runs.table["system"] == name]["seconds"].tolist()
            inside = statistics.median((p[0] + p[2]) / w for p, w in zip(perf, walls))
            note = f"C decode {inside:.0%} of wall"
            if all(p[3] for p in perf):  # one-token decode calls (SD verifies count as prompt)
                per_call = statistics.median(p[2] / p[3] * 1e6 for p in perf)
                note += f"; {per_call:.0f} us per one-token decode"
        rows.append({"system": name, "tok/s": f"{count / s['value']:.1f}",
                     **{("vs engine plain" if c == "ratio" else c): v for c, v in cells.items()},
                     "same tokens": "yes", "where the time goes": note,
                     "spread_wide": bool(s["spread_wide"])})
        if name != ENGINE_PLAIN:
            figures[f"vs_engine_{short(name)}"] = figure_from_stats(s, "x")
        figures[f"tok_s_{short(name)}"] = {"value": count / s["value"], "n": args.repeats,
                                           "unit": "tok/s"}
    table = pd.DataFrame(rows)
    print("\n" + header(ap, args, f"default policy, batch 1, greedy, prompts={args.prompts}, "
                        f"{count} tokens, max_new_tokens={args.max_new_tokens}, k={args.k}, "
                        "torch and llama.cpp on one thread, float32, wall clock of this process"))
    if skipped:
        print(f"\nllama.cpp skipped: {skipped}")
    print_table("The engine beside HF and llama.cpp (same prompt ids, same tokens in every "
                "repeat); ratio = median of per-repeat tok/s ratios to the engine plain",
                table.drop(columns="spread_wide"), table["spread_wide"], args.wide, "systems")
    if LLAMA_PLAIN in systems:  # issue 41's target: the compiled engine within 1.5x of it
        behind = summarize(runs, baseline=ENGINE_COMPILED, wide=args.wide).set_index(
            "system").loc[LLAMA_PLAIN]
        figures["llamacpp_over_engine_compiled"] = figure_from_stats(behind, "x")
        print(f"\nllama.cpp plain over the engine compiled (median of per-repeat tok/s "
              f"ratios): {behind['ratio']:.2f}x (min-max {behind['ratio_min']:.2f}-"
              f"{behind['ratio_max']:.2f})")
    if ENGINE_EAGLE_COMPILED in systems:  # issue 41's target: at least 2x, its bound beside
        figures.update(eagle_over_compiled(runs, args))
    disturbed = disturbed_of(stats.reset_index())
    print(f"\nDisturbed share (repeats with a call under the CPU-share bound, after redos): "
          f"{disturbed if disturbed is None else f'{disturbed:.0%}'}")
    head = [f"vs_engine_{short(n)}" for n in systems
            if n != ENGINE_PLAIN and short(n) in ("llamacpp_plain", "engine_eagle",
                                                 "engine_compiled", "hf_assisted_small_lm",
                                                 "hf_eager")]
    head += [k for k in ("llamacpp_over_engine_compiled", "eagle_compiled_over_compiled",
                         "eagle_compiled_bound") if k in figures]
    record(args, f"The engine beside llama.cpp and HF at batch 1, greedy, one thread each, "
           f"same prompt ids and tokens: each system's tok/s over the engine's plain eager "
           f"(median of per-repeat ratios); {args.prompts} held-out prompts, "
           f"max_new_tokens={args.max_new_tokens}, k={args.k}, float32 CPU"
           + (f"; llama.cpp skipped ({skipped})" if skipped else "")
           + ". Note: [2026-12-05-engine-vs-llamacpp.md]"
             "(docs/lab-notes/2026-12-05-engine-vs-llamacpp.md).", figures, "wall",
           disturbed, headline=head)


def eagle_over_compiled(runs, args) -> dict:
    """SD with the EAGLE head over plain decoding, both compiled (median of per-repeat
    ratios), and beside it SD's bound tau * T1 / (k * Td + Tv) from the same runs' steps
    (``speculative.measure``: what SD would give if a round cost only its draft and verify
    steps); printed, and returned as figures."""
    over = summarize(runs, baseline=ENGINE_COMPILED, wide=args.wide).set_index(
        "system").loc[ENGINE_EAGLE_COMPILED]
    plain = pd.concat([t.steps for _, t in runs.outputs[ENGINE_COMPILED]])
    sd = runs.outputs[ENGINE_EAGLE_COMPILED]
    t1 = step_times(plain)["T1"]
    times = step_times(pd.concat([t.steps for _, t in sd]), args.k)
    tau = acceptance_length(pd.concat([t.requests for _, t in sd]))
    bound = sd_bound(tau, t1, times["Td"], times["Tv"], args.k)
    print(f"\nSD with the EAGLE head over plain, both compiled (median of per-repeat tok/s "
          f"ratios): {over['ratio']:.2f}x (min-max {over['ratio_min']:.2f}-"
          f"{over['ratio_max']:.2f}); its bound tau*T1/(k*Td+Tv) = {bound:.2f}x (tau {tau:.2f}, "
          f"T1 {t1 * 1e3:.3f} ms, k*Td {args.k * times['Td'] * 1e3:.3f} ms, "
          f"Tv {times['Tv'] * 1e3:.3f} ms, medians of steps)")
    return {"eagle_compiled_over_compiled": figure_from_stats(over, "x"),
            "eagle_compiled_bound": {"value": bound, "n": args.repeats, "unit": "x"},
            "eagle_compiled_tau": {"value": tau, "n": args.repeats, "unit": "tokens"}}


def forward_share(steps) -> float:
    dec = steps[steps["kind"] == "decode"]
    if dec.empty:
        dec = steps
    return float(dec["forward_s"].sum() / (dec["end_s"] - dec["start_s"]).sum())


if __name__ == "__main__":
    sys.exit(main())
