"""The compiled plain decode step (``rollout.compiled``, ``RolloutConfig.compile``): lossless
against the eager step in float64 (Llama with rows leaving and joining, Mistral's sliding
window, Qwen2's mix of full and sliding layers), its compiles bounded and counted, and
``"auto"`` keeping the faster path per row bucket (a test double for the timings)."""
import numpy as np
import pandas as pd
import pytest
import torch

from workbench.rollout import RolloutConfig, RolloutEngine, StaticSchedule
from workbench.rollout.compiled import (StaticKVCache, check_compile, compiled_decode_for,
                                        row_bucket)
from workbench.rollout.forward import LeanForward, policy_forward

from .drafters import ScriptedDrafter, ScriptedTreeDrafter
from .helpers.models import (PROMPTS, StepClock, python_wrapped, tiny_model,
                             visible_cache_equals_fresh_recompute)

pytestmark = pytest.mark.compiles


# Compiled and eager float64 states agree to ~1e-8, not to the last bit: the norms compute in
# float32 (as HF's RMSNorm does, even for float64 models), and inductor's float32 reductions
# add in another order than eager's. Tokens are equal; states and logprobs within this.
STATES_ATOL = 1e-6


def test_row_buckets_and_the_switch_is_checked():
    from workbench.rollout.compiled import bucket_name
    assert [row_bucket(n) for n in (1, 2, 3, 5, 8, 9, 32, 33)] == [1, 2, 4, 8, 8, 16, 32, 64]
    assert bucket_name(5) == "8x1" and bucket_name(3, 5) == "4x5"
    assert RolloutConfig().compile is False  # today's eager step by default
    for ok in (False, True, "auto"):
        assert check_compile(ok) == ok
    for bad in ("yes", 1, None, "Auto"):
        with pytest.raises(ValueError, match="compile"):
            RolloutConfig(compile=bad)


def _compiled_of(model, mode=True):
    return compiled_decode_for(policy_forward(model), mode)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_compiled_tokens_equal_eager_with_rows_leaving_and_joining(tokenizer, temperature):
    """Greedy and coupled sampling; continuous batching (2 slots, 3 requests: one joins,
    then one row is left): the batch crosses row buckets 2 and 1, and the cache is copied
    back into its preallocated buffers after rows leave and join."""
    model = tiny_model("llama", tokenizer, seed=1)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=30, max_batch_size=2, refill_slots=1,
                        temperature=temperature, seed=3)
    prompts = PROMPTS[:3]
    eager = engine.rollout(prompts, cfg, progress=False)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    comp = engine.rollout(prompts, cfg, compile=True, progress=False)
    assert comp.tokens == eager.tokens
    np.testing.assert_allclose(np.concatenate(comp.logprobs), np.concatenate(eager.logprobs),
                               atol=STATES_ATOL, rtol=0)
    c = _compiled_of(model)
    assert c.steps["compiled"] > 0 and c.steps["eager"] == 0
    assert {key[0] for key in c.compiles} <= {1, 2}  # bounded: one graph per bucket here
    direct, through = c.direct_calls  # past dynamo's frame once a graph has run
    assert direct + through == c.steps["compiled"] + len(c.compiles)  # warm-ups too
    assert through <= 2 * len(c.compiles) and direct >= c.steps["compiled"] - len(c.compiles)
    # each warm-up compiled the graph its steps run (its scratch inputs as symbolic as
    # theirs): no step compiled another (none at all where an earlier test's graph served)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs <= len(c.compiles)
    assert len(engine.rollout(prompts, cfg, compile=True, progress=False).tokens) == 3
    assert len(c.compiles) <= 2  # a second rollout compiles nothing new
    assert policy_forward(model).compiled_decodes[True] is c  # kept on the forward


@pytest.mark.parametrize("arch", ["mistral", "qwen2_sw"])
def test_compiled_greedy_tokens_equal_eager_with_sliding_windows(tokenizer, arch):
    """Responses longer than the window (8): the compiled step's masks count positions."""
    model = python_wrapped(tiny_model(arch, tokenizer, seed=2))
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=24, ignore_eos=True)
    prompts = PROMPTS[1:3]
    eager = engine.rollout(prompts, cfg, progress=False)
    comp = engine.rollout(prompts, cfg, compile=True, progress=False)
    assert comp.tokens == eager.tokens
    assert all(len(t) == 24 for t in comp.tokens)
    np.testing.assert_allclose(np.concatenate(comp.logprobs), np.concatenate(eager.logprobs),
                               atol=STATES_ATOL, rtol=0)
    assert _compiled_of(model).steps["compiled"] == 23 * 1  # every decode step, one batch


def test_the_compiled_path_keeps_the_cache_preallocated(tokenizer):
    model = tiny_model("qwen2", tokenizer, seed=0)
    forward = policy_forward(model)
    assert isinstance(forward, LeanForward)
    assert compiled_decode_for(forward, False) is None
    assert compiled_decode_for(policy_forward(model, lean=False), True) is None  # HF forward
    cache = StaticKVCache(length=100, rows=3)
    k = torch.randn(3, 2, 5, 16, dtype=torch.float64)
    keys, _ = cache.update(k, k + 1, 0)
    layer = cache.layers[0]
    buf, _ = layer.buffers
    assert buf.shape == (4, 2, 100, 16)  # rows to a power of two, the length
    assert keys.data_ptr() == buf.data_ptr() and torch.equal(keys, k)
    layer.keys = layer.keys.index_select(0, torch.tensor([0, 2]))  # a row leaves
    layer.values = layer.values.index_select(0, torch.tensor([0, 2]))
    keys, _ = cache.update(k[:2, :, :1], k[:2, :, :1], 0)
    assert layer.buffers[0] is buf  # copied back into the same buffer
    assert torch.equal(keys[:, :, :5], k[[0, 2]]) and keys.shape == (2, 2, 6, 16)


@pytest.mark.parametrize("slower", ["compiled", "eager"])
def test_auto_keeps_the_faster_path_per_bucket(tokenizer, monkeypatch, slower):
    """``"auto"`` alternates the two paths on a bucket's first steps, timed by its timer,
    and keeps the faster; here the timer double says which is slower."""
    model = tiny_model("llama", tokenizer, seed=1)
    engine = RolloutEngine(model, tokenizer)
    c = compiled_decode_for(policy_forward(model), "auto")
    c.backend = "eager"  # dynamo alone: the choice, not inductor, is under test
    clock = c.timer = StepClock()
    charge = {"compiled": 5.0 if slower == "compiled" else 0.0,
              "eager": 5.0 if slower == "eager" else 0.0}

    def charged(fn):
        def compiled_step(*args):
            clock.pending += charge["compiled"]
            return fn(*args)
        return compiled_step
    c.step_wrapper = charged
    eager_call = LeanForward.__call__

    def eager_step(self, input_ids, *args, **kwargs):
        if input_ids.shape[1] == 1:  # a plain step (not a prefill)
            clock.pending += charge["eager"]
        return eager_call(self, input_ids, *args, **kwargs)
    monkeypatch.setattr(LeanForward, "__call__", eager_step)
    cfg = RolloutConfig(max_new_tokens=20, ignore_eos=True, compile="auto")
    res = engine.rollout(PROMPTS[:1], cfg, progress=False)
    faster = "eager" if slower == "compiled" else "compiled"
    assert c.choices == {"1x1": faster}
    assert c.steps[slower] == c.trials  # the compile is no part of a trial
    assert c.steps[faster] == 19 - c.trials
    assert sum(c.steps.values()) == 19
    eager = engine.rollout(PROMPTS[:1], cfg, compile=False, progress=False)
    assert res.tokens == eager.tokens  # float64: the same tokens whichever path ran
    before = dict(c.steps)
    engine.rollout(PROMPTS[:1], cfg, progress=False)  # the choice is kept: no more trials
    assert c.steps[faster] - before[faster] == 19 and c.steps[slower] == before[slower]


def test_auto_reuses_recorded_choices_without_timing(tokenizer):
    """A resumed run hands ``"auto"`` the choices it recorded: no bucket is timed again."""
    from workbench.rollout.compiled import compile_choices, use_compile_choices
    model = tiny_model("llama", tokenizer, seed=1)
    engine = RolloutEngine(model, tokenizer)
    with pytest.raises(ValueError, match="accepted"):
        use_compile_choices(model, {"1x1": "fast"})
    use_compile_choices(model, {"1x1": "eager"})
    assert compile_choices(model) == {"1x1": "eager"}
    cfg = RolloutConfig(max_new_tokens=10, ignore_eos=True, compile="auto")
    engine.rollout(PROMPTS[:1], cfg, progress=False)
    c = _compiled_of(model, "auto")
    assert c.steps == {"compiled": 0, "eager": 9} and not c.compiles


@pytest.mark.parametrize("clock", ["sim", "wall"])
def test_a_compile_is_a_timeline_row_of_its_own_kept_off_the_sim_clock(tokenizer, clock):
    """One ``compile`` row before the first step of each new graph: empty on the sim clock
    (sim figures never include a compile), as long as the compile on the wall clock; no
    plan; a rollout kind, so busy time and the idle window see it."""
    from workbench.rollout.backend import LocalBackend
    from workbench.rollout.timeline import ROLLOUT_KINDS, STEP_KINDS
    from workbench.viz.timeline import KIND_COLORS
    assert "compile" in STEP_KINDS and "compile" in ROLLOUT_KINDS and "compile" in KIND_COLORS
    model = tiny_model("llama", tokenizer, seed=1)
    backend = LocalBackend()
    backend.clock = clock
    engine = RolloutEngine(model, tokenizer, backend=backend)
    cfg = RolloutConfig(max_new_tokens=12, ignore_eos=True, compile=True)
    prompts = ["a1 b2?", "a9 b7?"]  # one prefill group
    first = engine.rollout(prompts, cfg, progress=False).timeline
    steps = first.steps
    kinds = steps["kind"].tolist()
    assert kinds == ["prefill", "compile"] + ["decode"] * 11
    row = steps.iloc[1]
    assert row["batch_size"] == 2 and row["tokens"] == 0 and pd.isna(row["decision"])
    assert row["start_s"] == steps.iloc[0]["end_s"] and steps.iloc[2]["start_s"] == row["end_s"]
    seconds = row["end_s"] - row["start_s"]
    assert (seconds == 0 and row["forward_s"] == 0) if clock == "sim" else seconds > 0
    again = engine.rollout(prompts, cfg, progress=False).timeline.steps
    assert "compile" not in set(again["kind"])  # the graph is there: nothing compiled
    if clock == "wall":  # the consumers of step kinds draw it and trace it
        import matplotlib
        matplotlib.use("Agg")
        from workbench.rollout.chrome_trace import chrome_trace
        from workbench.viz.timeline import gantt
        assert gantt(first) is not None
        names = {e.get("name") for e in chrome_trace({"run": first})["traceEvents"]}
        assert "compile" in names


def test_the_first_compiled_step_s_setup_is_compile_time_on_the_sim_clock(tokenizer,
                                                                           monkeypatch):
    """The step's one-time setup (its first prepare: the step function made, the compiler's
    modules imported, the few-rows kernel built, seconds on a process's first) runs inside
    the first graph's ``compile`` row, so the sim clock charges it to no decode step. The
    sim clock reads a tick double (each read a second later) that jumps 100 s while the step
    function is made."""
    import time as time_module
    model = tiny_model("llama", tokenizer, seed=5)
    c = _compiled_of(model)
    c.backend = "eager"  # before its first step
    clock = {"t": 0.0}

    def tick():
        clock["t"] += 1.0
        return clock["t"]

    def slow_setup(fn):
        clock["t"] += 100.0
        return fn
    c.step_wrapper = slow_setup
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=4, ignore_eos=True, compile=True)
    monkeypatch.setattr(time_module, "thread_time", tick)
    steps = engine.rollout(["a1 b2?"], cfg, progress=False).timeline.steps
    monkeypatch.undo()
    assert c.ready and clock["t"] > 100  # the setup ran, and jumped
    assert steps["kind"].tolist() == ["prefill", "compile"] + ["decode"] * 3
    took = steps["end_s"] - steps["start_s"]
    assert took[steps["kind"] == "compile"].tolist() == [0.0]
    assert took.max() < 100  # the jump is in no row: no step's, no compile's


@pytest.mark.parametrize("shape,temperature", [("chain", 0.0), ("tree", 0.0), ("chain", 1.0)])
def test_compiled_verify_passes_are_lossless(tokenizer, shape, temperature):
    """Speculative steps (a chain of 4 drafts, or a tree of depth 3, branch 2, 5 nodes
    verified) run their verify pass compiled, one graph per (row bucket, fed tokens, tree):
    greedy and coupled tokens and logprobs equal plain eager decoding's, rows accept 0..4 drafts, and
    the cache after the rollout's steps equals a fresh recompute."""
    model = python_wrapped(tiny_model("llama", tokenizer, seed=1))
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=20, max_batch_size=2, refill_slots=1,
                        temperature=temperature, seed=3)  # coupled at 1.0
    prompts = PROMPTS[:3]
    plain = engine.rollout(prompts, cfg, progress=False)
    continuations = {r.uid: r.tokens for r in plain.requests}
    wrong = {r.uid: i % 5 for i, r in enumerate(plain.requests)}
    if shape == "chain":
        drafter, schedule = ScriptedDrafter(continuations, wrong), StaticSchedule(4)
    else:
        drafter = ScriptedTreeDrafter(continuations, wrong)
        schedule = StaticSchedule(3, branch=2, verify_budget=5)
    res = engine.rollout(prompts, cfg, compile=True, drafter=drafter, schedule=schedule,
                         progress=False)
    assert res.tokens == plain.tokens
    np.testing.assert_allclose(np.concatenate(res.logprobs), np.concatenate(plain.logprobs),
                               atol=STATES_ATOL, rtol=0)
    assert max(a for r in res.requests for a in r.accepted_per_step) >= 2
    c = _compiled_of(model)
    fed = {key[3] for key in c.compiles}
    assert fed >= {1 + (4 if shape == "chain" else 5)}  # the verify graphs
    assert {key[4] for key in c.compiles if key[3] > 1} == {shape == "tree"}
    assert c.steps["compiled"] > 0 and c.steps["eager"] == 0


def test_sd_sweep_measures_both_sides_on_the_compiled_path(tokenizer):
    """``sd_sweep(compile=True)``: the plain rollouts' steps and the SD rollouts' verify
    passes both run compiled (dynamo's eager backend: the graphs' arithmetic is tested
    above), the tokens stay equal, and the table and its metrics say which path ran; a bad
    ``compile`` is refused before any rollout."""
    from workbench.speculative.sweep import sd_sweep, sweep_metrics
    model = tiny_model("llama", tokenizer, seed=4)
    c = _compiled_of(model)
    c.backend = "eager"  # before its first step
    engine = RolloutEngine(model, tokenizer)
    prompts = PROMPTS[:2]
    plain = engine.rollout(prompts, RolloutConfig(max_new_tokens=10), progress=False)
    drafter = ScriptedDrafter({r.uid: r.tokens for r in plain.requests},
                              {r.uid: 9 for r in plain.requests})  # every draft right
    table = sd_sweep(engine, prompts, {"scripted": drafter}, ks=(2,), batch_sizes=(2,),
                     repeats=3, max_new_tokens=10, progress=False, compile=True)
    assert table["compile"].tolist() == [True] and table["identical"].all()
    assert table["tau"].iloc[0] > 1  # drafts were verified
    assert {key[3] for key in c.compiles} == {1, 3}  # plain steps, verify passes of 2 drafts
    assert c.steps["compiled"] > 0 and c.steps["eager"] == 0
    assert sweep_metrics(table, table, table[:0], k=2)["compile"] is True
    ran = dict(c.steps)
    with pytest.raises(ValueError, match="compile is 'yes'; accepted"):
        sd_sweep(engine, prompts, {"scripted": drafter}, repeats=3, progress=False,
                 compile="yes")
    assert c.steps == ran


def test_calls_through_dynamo_give_the_direct_calls_tokens(tokenizer):
    """``CompiledDecode.direct=False`` sends every call through dynamo (``torch.compile``'s
    own function): the same tokens as the direct calls and as eager, in float64 (dynamo's
    graph on eager kernels: the calling is under test)."""
    models = [tiny_model("qwen2", tokenizer, seed=4) for _ in range(2)]
    cfg = RolloutConfig(max_new_tokens=24, max_batch_size=2, compile=True)
    tokens = []
    for model, direct in zip(models, (True, False)):
        c = _compiled_of(model)
        c.backend, c.direct = "eager", direct
        engine = RolloutEngine(model, tokenizer)
        tokens.append(engine.rollout(PROMPTS[:3], cfg, progress=False).tokens)
        assert (c.direct_calls[0] > 0) == direct and c.steps["compiled"] > 0
    assert tokens[0] == tokens[1] == engine.rollout(PROMPTS[:3], cfg, compile=False,
                                                    progress=False).tokens


def test_cache_after_compiled_steps_equals_a_fresh_recompute(tokenizer):
    """Compiled plain and verify steps over ragged rows leave every live row's visible
    cache equal to a fresh forward of its tokens (the preallocated buffers' views). The
    graphs run on eager kernels (the bookkeeping is under test here; inductor's kernels are
    the other tests'), which spares their cold compiles."""
    from workbench.rollout.decoder import BatchDecoder
    from workbench.rollout.request import RequestOutput
    from workbench.rollout.plan import StepPlan
    from workbench.rollout.worker import StepRecorder
    model = tiny_model("mistral", tokenizer, seed=3)
    engine = RolloutEngine(model, tokenizer)
    _compiled_of(model).backend = "eager"
    cfg = RolloutConfig(max_new_tokens=30, compile=True)
    plain = engine.rollout(PROMPTS[:4], cfg, compile=False, progress=False)
    drafter = ScriptedDrafter({r.uid: r.tokens for r in plain.requests},
                              {r.uid: i % 4 for i, r in enumerate(plain.requests)})
    drafter.check_compatible(model, tokenizer)
    reqs = [RequestOutput.of(q, 0)
            for q in engine.make_requests(engine.encode(PROMPTS[:4]), cfg)]
    dec = BatchDecoder(policy_forward(model), cfg, StepRecorder(0, "sim"),
                       tokenizer.eos_token_id, engine.pad_id, drafter)
    with torch.inference_mode():
        dec.admit(reqs)
        for i in range(8):
            plan = StepPlan("speculative", 3) if i % 2 else StepPlan()
            dec.step(plan, 0)
            if dec.size:
                visible_cache_equals_fresh_recompute(model, dec, atol=STATES_ATOL)
    assert isinstance(dec.batch.cache, StaticKVCache)


def test_static_column_buckets_are_lossless_across_bucket_edges(tokenizer):
    """With ``dynamic_cols=False`` every shape is static: the width is padded to a multiple
    of ``col_step`` (16 here, so the rollout crosses three buckets, a graph each, run on
    eager kernels: the bucketing is under test, and three cold inductor compiles are not)."""
    model = tiny_model("mistral", tokenizer, seed=2)
    engine = RolloutEngine(model, tokenizer)
    c = _compiled_of(model)
    c.dynamic_cols, c.col_step, c.backend = False, 16, "eager"
    cfg = RolloutConfig(max_new_tokens=24, ignore_eos=True)
    prompts = PROMPTS[1:3]
    eager = engine.rollout(prompts, cfg, progress=False)
    comp = engine.rollout(prompts, cfg, compile=True, progress=False)
    assert comp.tokens == eager.tokens
    np.testing.assert_allclose(np.concatenate(comp.logprobs), np.concatenate(eager.logprobs),
                               atol=STATES_ATOL, rtol=0)
    widths = {key[1] for key in c.compiles}
    assert len(widths) >= 3 and all(w % 16 == 0 for w in widths)


def test_step_inputs_are_rewritten_in_place_and_pad_rows_after_a_shrink():
    """A key's persistent inputs (``rollout.step_inputs``): a step writes the batch's rows
    into the same buffers; rows the batch no longer has become padding again (token 0 at
    position 0, seeing column 0 only, so no row is all masked); a tree's columns of an
    earlier step are open again; two keys' buffers share no storage."""
    from types import SimpleNamespace
    from workbench.rollout.step_inputs import StepInputs

    def rope(pos, bound):  # cos/sin [Bb, q, d] (their values are not under test)
        return pos[..., None].double(), -pos[..., None].double()

    def batch(rows, width):
        return SimpleNamespace(size=rows, width=width,
                               mask=torch.ones((rows, width), dtype=torch.long),
                               col_pos=torch.arange(width).repeat(rows, 1))
    data = torch.ones((3, 2, 5))
    buf = StepInputs.for_step(4, 2, 16, True, [data], "cpu")
    other = StepInputs.for_step(4, 2, 16, True, [data], "cpu")
    ptrs = lambda s: {t.data_ptr() for t in (s.ids, s.pos, s.vis, s.col_pos, s.col, s.tree,
                                             *s.data)}
    assert not ptrs(buf) & ptrs(other)
    tree = torch.zeros((3, 2, 2), dtype=torch.bool)
    fed, pos = torch.full((3, 2), 7), torch.full((3, 2), 9)
    ids, pos_in, vis, col_pos, col, cos, sin, full, hidden = buf.fill(
        batch(3, 10), fed, pos, tree, 10, rope, [data])
    assert ids is buf.ids and vis.data_ptr() == buf.vis.data_ptr() and vis.shape == (4, 10)
    assert ids[:3].eq(7).all() and ids[3].eq(0).all() and col.tolist() == [8, 9]
    assert vis[:3].all() and vis[3].tolist() == [True] + [False] * 9
    assert not full[:3, :, 8:].any() and full[:3, :, :8].all() and full[3].all()
    assert hidden[:3].eq(1).all() and hidden[3].eq(0).all() and cos.shape == (4, 2, 1, 1)
    # a step later the batch lost two rows and the columns are static (rounded up to 16)
    tree1 = torch.zeros((1, 2, 2), dtype=torch.bool)
    ids, _, vis, _, col, _, _, full, hidden = buf.fill(
        batch(1, 11), fed[:1], pos[:1] + 1, tree1, 16, rope, [data[:1]])
    assert ids is buf.ids and ids[1:].eq(0).all() and hidden[1:].eq(0).all()
    assert vis[0, :11].all() and not vis[0, 11:].any()  # past the width: hidden
    assert all(row.tolist() == [True] + [False] * 15 for row in vis[1:])
    assert full[0, :, 8].all() and not full[0, :, 9:11].any()  # the old tree column is open
    assert col.tolist() == [9, 10] and buf.padded_from == 1


def test_a_run_on_another_thread_compiles_past_dynamo_s_default_limit(tokenizer):
    """Dynamo's recompile limit (8 graphs a function) is a setting of each thread: a run side
    by side with another (``side_by_side``) compiles on a thread of its own, and every
    compiled step of the process shares one function's graphs. Static columns every 4 make
    more than 8 graphs here, compiled on a fresh thread (dynamo's traced graph on eager
    kernels: the limit is dynamo's)."""
    import threading
    model = tiny_model("llama", tokenizer, seed=4)
    engine = RolloutEngine(model, tokenizer)
    c = _compiled_of(model)
    c.dynamic_cols, c.col_step, c.backend = False, 4, "eager"
    cfg = RolloutConfig(max_new_tokens=40, ignore_eos=True)
    eager = engine.rollout(PROMPTS[:1], cfg, progress=False)
    out = {}

    def run():
        try:
            out["result"] = engine.rollout(PROMPTS[:1], cfg, compile=True, progress=False)
        except Exception as exc:  # noqa: BLE001 (reported below, with its message)
            out["error"] = exc
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert "error" not in out, repr(out.get("error"))
    assert out["result"].tokens == eager.tokens
    assert len(c.compiles) > 8


def test_a_thread_running_graphs_compiled_on_another_raises_its_own_recompile_limit(tokenizer):
    """A call may recompile on a thread that compiled nothing (its key's graph made on another
    thread, a guard the real inputs fail): notebook 04's TLT variant failed so, at dynamo's
    default limit of 8 on its thread. A thread's first compiled call raises that thread's
    limit, before any call of its can recompile."""
    import threading

    from workbench.rollout.compile_settings import RECOMPILE_LIMIT
    model = tiny_model("llama", tokenizer, seed=4)
    engine = RolloutEngine(model, tokenizer)
    c = _compiled_of(model)
    c.backend = "eager"
    cfg = RolloutConfig(max_new_tokens=6, ignore_eos=True)
    first = engine.rollout(PROMPTS[:1], cfg, compile=True, progress=False)  # compiles here
    compiled = dict(c.compiles)
    out = {}

    def run():
        out["before"] = torch._dynamo.config.recompile_limit
        out["tokens"] = engine.rollout(PROMPTS[:1], cfg, compile=True, progress=False).tokens
        out["after"] = torch._dynamo.config.recompile_limit
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert c.compiles == compiled  # the thread compiled nothing of its own
    assert out["before"] < RECOMPILE_LIMIT <= out["after"]
    assert out["tokens"] == first.tokens
