"""A compiled decode step (issue 41): ``torch.compile`` (inductor) of the lean forward's
one-token step, and of a speculative step's verify pass, over a KV cache preallocated to the
rollout's length, behind ``RolloutConfig.compile`` (``False``: today's eager step; ``True``;
``"auto"``). The lean forward's families: Llama, Qwen2, Mistral (sliding windows) and Qwen3
(per-head q/k norms).

Static shapes. A compiled graph is specialised to its input shapes, while the engine's cache
grows a column a step, and loses and gains rows. So the compiled step sees the cache through
fixed shapes:

- the cache is a :class:`~workbench.rollout.static_cache.StaticKVCache`
  (``rollout.static_cache``): each layer's keys and values in zeroed buffers preallocated to
  the rollout's length, rows rounded up to a bucket, the batch's ``keys``/``values`` views of
  them, so every batch operation works unchanged.
- the step runs on ``[Bb, :, :Tb]`` views of those buffers: ``Bb`` the batch size rounded up
  to a power of two (:func:`row_bucket`); ``Tb`` the batch's width, a symbolic size of the
  graph (``dynamic_cols``, the default: one graph serves every width, and attention sees no
  padded columns), or with ``dynamic_cols=False`` the width rounded up to a multiple of
  ``col_step`` (fully static shapes, a graph per column bucket). The new tokens' keys and
  values are written in place at their columns (``index_copy_``) and attention sees the
  columns its row may see through a boolean mask built from positions, as
  ``forward.attention_mask`` does (holes, sliding windows). Rows past the batch's own see
  their column 0 only, so nothing is NaN.

One graph per key ``(Bb, Tb or None, buffer row stride, fed tokens, tree)``: the compiles of
a rollout are bounded by the row buckets (times the column buckets when static, times the
draft lengths a schedule verifies), counted in :attr:`CompiledDecode.compiles` with their
wall seconds. A compile runs once per key on scratch buffers of the same shapes (a warm-up),
before the step that needs it, as a ``compile`` row of the timeline's steps table of its own
(``rollout.timeline``; with the step's one-time setup where it is the first, :func:`prepared`):
on the wall clock it lasts what it took; on the sim clock its time is taken off the worker's
clock (it is wall time, partly in inductor's worker processes, not the step's), so sim-clock
figures never include it. Inductor's on-disk cache makes a later process's compiles short.

A compiled call's fixed cost is kept small: inputs in buffers preallocated per key, written
in place (:class:`~workbench.rollout.step_inputs.StepInputs`); inductor's wrapper in C++; a
graph that ran before called past dynamo's frame wrappers, not its guards
(:class:`~workbench.rollout.graph_call.DirectGraph`).

Where a step's fixed cost dominates (small batches on a CPU), the compiled step is several
times as fast as eager (``benchmarks/bench_compile.py``); its projections go through the
few-rows kernel (``rollout.few_rows``), and an EAGLE chain round's drafting is one graph call
(``speculative.eagle.CompiledChain``). ``False`` by default still: a cold compile, seconds a
graph, is not earned back by a short run; ``True`` or ``"auto"`` for long ones.

``"auto"`` times the eager step against the compiled one on the first ``trials`` steps of
each row bucket (alternating real steps) and keeps the faster (:attr:`CompiledDecode.choices`,
for the rest of the process). An RL run saves the choices in its checkpoint and, resumed,
gives them back (:func:`use_compile_choices`), so float32 tokens do not depend on a timing.

The verify pass of a speculative step (``1 + n`` fed tokens a row, a chain or a draft tree)
runs through the same function, one graph per (row bucket, fed tokens, tree or not). An
EAGLE head's draft step runs through this machinery too, with ``True``
(``speculative.eagle.CompiledDraft``, a subclass: its own graph function, weights and rope;
its cache preallocated as long as the policy's; its compiles ``compile`` rows too).

The prefill stays eager: its shapes are the prompts' (a cold compile per row and length
bucket, for a forward run once per request).

Lossless: the graph's arithmetic is the lean forward's (``rollout.step_graph``), tested in
float64 against the eager step (tests/test_compiled_decode.py, test_compiled_lossless.py).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .compile_settings import inductor_options, raise_recompile_limit
from .few_rows import kernel_applies, pack
from .forward import LeanForward
from .graph_call import DirectGraph
from .static_cache import StaticKVCache, round_up, row_bucket
from .step_graph import layer_tensors, make_step
from .step_inputs import StepInputs, mark_cols, zeroed_like

# StaticKVCache, row_bucket: rollout.static_cache's, re-exported beside the step using them
__all__ = ["COMPILE_CHOICES", "CompiledDecode", "StaticKVCache", "compiled_decode_for",
           "row_bucket", "check_compile", "compile_choices", "use_compile_choices",
           "bucket_name", "prepared"]

COMPILE_CHOICES = (False, True, "auto")
MAX_ROWS = 256  # the largest row bucket; a bigger batch runs eager


def check_compile(value):
    """``RolloutConfig.compile``: ``False``, ``True`` or ``"auto"`` (a ValueError otherwise)."""
    if not any(value is c or (isinstance(c, str) and value == c) for c in COMPILE_CHOICES):
        raise ValueError(f"compile is {value!r}; accepted: False, True or 'auto'")
    return value


def bucket_name(rows: int, fed: int = 1) -> str:
    """The name of ``"auto"``'s bucket of a step at ``rows`` rows feeding ``fed`` tokens a
    row: ``"<row bucket>x<fed>"`` (``"8x1"``: a plain step of 5 to 8 rows; ``"8x5"``: a
    verify pass of 4 drafts a row)."""
    return f"{row_bucket(rows)}x{fed}"


# ---- the compiled step ------------------------------------------------------------------
@dataclass
class CompiledDecode:
    """The compiled plain step and verify pass of one :class:`LeanForward` (made once per
    forward by :func:`compiled_decode_for`, so graphs and ``"auto"``'s choices outlive a
    rollout; a Ray actor's worker compiles its own).

    ``dynamic_cols``: the width a symbolic size (one graph for every width); ``False``: the
    width padded to a multiple of ``col_step`` (every shape static). ``trials``: ``"auto"``'s
    timed steps per path and bucket; ``timer``: its clock; ``backend``: ``torch.compile``'s.
    ``step_wrapper``: wraps the compiled step function once it is made (a test's double
    charges its timer around it; ``None``, the default: the compiled function itself).
    ``cpp_wrapper``: inductor's graph wrapper in C++ (a call's fixed cost in Python cut; a
    cold compile longer). ``direct``: a call whose graph ran before skips dynamo's frame
    wrappers, not its guards (:class:`~workbench.rollout.graph_call.DirectGraph`); ``False``:
    every call through dynamo. ``few_rows``: float32 projections on the CPU through the
    few-rows kernel (``rollout.few_rows``); ``False``: inductor's loops and the BLAS GEMM.
    Set these before the first step. ``compiles``: ``{(Bb, Tb or None, row stride, fed,
    tree): seconds}`` of every graph compiled; ``choices``: ``{bucket: "compiled" |
    "eager"}`` (``"auto"``'s per :func:`bucket_name`; ``True`` chooses compiled
    everywhere); ``steps``: ``{"compiled": n, "eager": n}`` steps
    (plain and verify) run each way."""

    forward: LeanForward
    mode: object = True
    col_step: int = 128
    dynamic_cols: bool = True
    trials: int = 3
    timer: object = time.perf_counter
    backend: str = "inductor"
    step_wrapper: Callable[[Callable], Callable] | None = None
    cpp_wrapper: bool = True
    direct: bool = True
    few_rows: bool = True
    compiles: dict = field(default_factory=dict)
    choices: dict = field(default_factory=dict)
    steps: dict = field(default_factory=lambda: {"compiled": 0, "eager": 0})
    _trials: dict = field(default_factory=dict)
    # dynamo may make a size symbolic on its own once a second value of it compiles (its
    # automatic dynamic shapes); a graph whose loops unroll over a size turns it off, so
    # only the columns marked by ``step_inputs.mark_cols`` are symbolic
    automatic_dynamic = True

    def __post_init__(self):
        self._fn = self._graph = None
        self._key = None
        self._tensors = None
        self._buffers: dict = {}  # StepInputs per graph key

    def __getstate__(self) -> dict:
        """A copy for another process (a Ray actor's) travels without its graphs, which do
        not pickle: it compiles its own."""
        return {**self.__dict__, "_fn": None, "_graph": None, "_key": None, "_tensors": None,
                "compiles": {}, "_buffers": {}}

    # -- the pieces ------------------------------------------------------------------------
    def _plans(self) -> list:
        return self.forward._plans()

    def _layer_count(self) -> int:
        return len(self.forward.decoder.layers)

    def _make_step(self, plans):
        """The function compiled (``rollout.step_graph``): the lean forward's step."""
        return make_step(self.forward, plans, self._packed())

    def _packed(self) -> bool:
        """Whether the step's weights go packed to the few-rows kernel (:attr:`few_rows`)."""
        return kernel_applies(self.few_rows, self.forward.dtype, self.forward.device)

    def _rope(self, pos: torch.Tensor, bound: int):
        """cos/sin ``[Bb, q, d]`` at ``pos`` (each below ``bound``)."""
        return self.forward.rope(self.forward.lm_head.weight, pos, bound)

    def _key_extra(self, data) -> tuple:
        """What else a graph key holds, beyond ``(Bb, Tb, row stride, fed, tree)``: what of
        ``data``'s shapes the graph's own shapes do not follow from (nothing here)."""
        return ()

    def _compiled(self, plans):
        if self._fn is None:
            options = inductor_options(self.cpp_wrapper) if self.backend == "inductor" else None
            step = self._make_step(plans)
            dynamic = None if self.dynamic_cols and self.automatic_dynamic else False
            fn = (DirectGraph(step, self.backend, dynamic, options) if self.direct else
                  torch.compile(step, backend=self.backend, dynamic=dynamic, fullgraph=True,
                                options=options))
            self._graph = fn
            self._fn = fn if self.step_wrapper is None else self.step_wrapper(fn)
        return self._fn

    def _weights(self, plans) -> tuple:
        """The step's weight arguments, after its padded inputs (and data), read once per
        version of the weights."""
        if self._key != self.forward.key:
            f, packed = self.forward, self._packed()
            self._tensors = (f.decoder.embed_tokens.weight.detach(),
                             [layer_tensors(p, packed) for p in plans],
                             *final_tensors(f.decoder.norm, f.lm_head, packed))
            self._key = f.key
        return self._tensors

    def covers(self, batch) -> bool:
        """Whether this batch's next plain step can run compiled: a static cache, every
        layer filled, and a batch no larger than the largest row bucket."""
        cache = batch.cache
        return (isinstance(cache, StaticKVCache) and 0 < batch.size <= MAX_ROWS
                and len(cache.layers) == self._layer_count()
                and all(layer.is_initialized for layer in cache.layers))

    @property
    def ready(self) -> bool:
        """Whether the one-time setup of the first :meth:`prepare` is done (the step function
        made, the compiler's modules imported, the few-rows kernel built or loaded)."""
        return self._fn is not None

    @property
    def direct_calls(self) -> tuple[int, int]:
        """Graph calls so far ``(direct, through dynamo)`` (:attr:`direct`; ``(0, 0)``
        before the first step and where every call goes through dynamo)."""
        fn = self._graph
        return (fn.direct, fn.through_dynamo) if isinstance(fn, DirectGraph) else (0, 0)

    # -- "auto" ----------------------------------------------------------------------------
    @property
    def trial_times(self) -> dict:
        """``"auto"``'s timed trial steps so far: ``{bucket: {"compiled": [seconds], "eager":
        [seconds]}}`` (a copy; empty where no bucket was timed: ``True``, or every bucket's
        choice given by :func:`use_compile_choices`)."""
        return {bucket: {path: list(t) for path, t in times.items()}
                for bucket, times in self._trials.items()}

    def wants_compiled(self, rows: int, fed: int = 1) -> bool:
        """Whether the next step at ``rows`` rows feeding ``fed`` tokens a row (1: a plain
        step; ``1 + n``: a verify pass) runs compiled: ``True``: always; ``"auto"``: its
        bucket's choice (:func:`bucket_name`), or while it is being timed, alternately."""
        if self.mode is True:
            return True
        bucket = bucket_name(rows, fed)
        if bucket in self.choices:
            return self.choices[bucket] == "compiled"
        times = self._trials.setdefault(bucket, {"compiled": [], "eager": []})
        return len(times["compiled"]) <= len(times["eager"])

    def observe(self, rows: int, fed: int, path: str, seconds: float) -> None:
        """A timed trial step of ``"auto"``; the bucket's choice once it has ``trials`` of
        each (the faster median: eager on a tie)."""
        bucket = bucket_name(rows, fed)
        if self.mode is True or bucket in self.choices:
            return
        times = self._trials[bucket]
        times[path].append(seconds)
        if min(len(t) for t in times.values()) >= self.trials:
            faster = statistics.median(times["compiled"]) < statistics.median(times["eager"])
            self.choices[bucket] = "compiled" if faster else "eager"

    # -- the step --------------------------------------------------------------------------
    def prepare(self, batch, pos, fed=None, tree=None, data=()) -> "_Call":
        """The compiled step's call for ``batch``, whose new columns (one for a plain step:
        it feeds ``last_token``; those of ``fed [B, q]`` for a verify pass, with the draft
        tree's ``tree [B, q, q]`` if any) are appended (``append_columns``) at positions
        ``pos [B, q]`` but not written (a drafter's ``tree [B, q, m]`` covers its last ``m``
        columns): its inputs written into the key's persistent buffers (:class:`StepInputs`),
        the cache moved into its preallocated buffers if an operation replaced them.
        ``data``: more per-row inputs ``[B, ...]`` of the step (an EAGLE draft's parent
        states), padded with zero rows."""
        plans = self._plans()
        fn = self._compiled(plans)
        rows, width = batch.size, batch.width
        b_rows = row_bucket(rows)
        layers = batch.cache.layers
        t_cols = width if self.dynamic_cols else round_up(width, self.col_step)
        length = max(layer.length for layer in layers)
        if t_cols > length:  # past the preallocated length: the buffers grow (a new key)
            length = round_up(t_cols, 64)
            for layer in layers:
                layer.length = length
        views = [layer.views(b_rows, t_cols) for layer in layers]
        fed = batch.last_token[:, None] if fed is None else fed
        key = (b_rows, None if self.dynamic_cols else t_cols, views[0][0].stride(0),
               fed.shape[1], tree is not None, *self._key_extra(data))
        buffers = self._buffers.get(key)
        if buffers is None:
            buffers = self._buffers[key] = StepInputs.for_step(
                b_rows, fed.shape[1], layers[0].buffers[0].shape[2], tree is not None,
                data, batch.mask.device)
        inputs = buffers.fill(batch, fed, pos, tree, t_cols, self._rope, data)
        args = [*inputs, *self._weights(plans), [v[0] for v in views], [v[1] for v in views]]
        if self.dynamic_cols and key not in self.compiles:
            mark_cols(args, 7)
        return _Call(fn, args, key, layers, rows, width)

    def needs_compile(self, call: "_Call") -> bool:
        return call.key not in self.compiles

    def compile(self, call: "_Call") -> float:
        """Compile ``call``'s graph (a warm-up on scratch buffers of the same shapes and
        strides: the cache is not touched); its wall seconds, kept in :attr:`compiles`."""
        start = time.perf_counter()
        raise_recompile_limit()
        a = call.args
        scratch = [None if t is None else zeroed_like(t) for t in a[:8]] + (
            a[8:-2] + [[zeroed_like(t) for t in a[-2]], [zeroed_like(t) for t in a[-1]]])
        call.fn(*scratch)
        self.compiles[call.key] = time.perf_counter() - start
        return self.compiles[call.key]

    def run(self, call: "_Call"):
        """The step's outputs, the batch's rows of each (the decode step's ``(logits [B, q,
        V], states [B, q, H])``); the new keys and values written in the cache, whose views
        now cover the new columns."""
        raise_recompile_limit()
        out = call.fn(*call.args)
        for layer in call.layers:
            layer.set_views(call.rows, call.width)
        return tuple(t[:call.rows] for t in out)

    def __call__(self, batch, pos, fed=None, tree=None):
        """:meth:`prepare`, :meth:`compile` if needed, and :meth:`run`."""
        call = self.prepare(batch, pos, fed, tree)
        if self.needs_compile(call):
            self.compile(call)
        return self.run(call)


@dataclass
class _Call:
    """One compiled step, prepared: the graph, its arguments, its key ``(Bb, Tb, row
    stride)``, the cache layers it writes and the batch's rows and width."""

    fn: object
    args: list
    key: tuple
    layers: list
    rows: int
    width: int


def prepared(c: CompiledDecode, compile_row: Callable, rows: int, *args, **kwargs) -> _Call:
    """``c.prepare(*args, **kwargs)``, its graph compiled first where it is new, the compile
    run as ``compile_row(work, rows)`` (the decoder's: a ``compile`` row of the timeline, off
    the sim clock). Before :attr:`CompiledDecode.ready`, the prepare itself runs inside that
    row too: a process's first costs seconds of setup (imports, the kernel's build), compile
    time as much as the graph's."""
    if c.ready:
        call = c.prepare(*args, **kwargs)
        if c.needs_compile(call):
            compile_row(lambda: c.compile(call), rows)
        return call

    def first() -> _Call:
        call = c.prepare(*args, **kwargs)
        if c.needs_compile(call):
            c.compile(call)
        return call
    return compile_row(first, rows)


def final_tensors(norm, lm_head, packed: bool) -> tuple:
    """The policy's final norm's weight, its head's weight (packed by ``few_rows.pack`` where
    ``packed``: a copy) and bias or ``None``: a graph's last arguments before the caches."""
    w = lm_head.weight.detach()
    return (norm.weight.detach(), pack(w) if packed else w,
            None if lm_head.bias is None else lm_head.bias.detach())


def compile_choices(model) -> dict:
    """``"auto"``'s choices so far for ``model``'s lean forward: ``{bucket: "compiled" |
    "eager"}`` (:func:`bucket_name`; a run saves them beside its other settings, so that a
    resumed run decodes the same way: float32 tokens then do not depend on a timing)."""
    from .forward import policy_forward
    made = compiled_decode_for(policy_forward(model), "auto")
    return {} if made is None else dict(made.choices)


def use_compile_choices(model, choices: dict) -> None:
    """Give ``"auto"`` the ``choices`` of an earlier run (:func:`compile_choices`): those
    buckets are not timed again. A ValueError for a choice that is neither path."""
    from .forward import policy_forward
    bad = {k: v for k, v in choices.items() if v not in ("compiled", "eager")}
    if bad:
        raise ValueError(f"compile choices {bad}; accepted: 'compiled' or 'eager' per bucket")
    made = compiled_decode_for(policy_forward(model), "auto")
    if made is not None:
        made.choices.update({str(k): v for k, v in choices.items()})


def compiled_decode_for(forward, mode) -> CompiledDecode | None:
    """The compiled step of ``forward`` for ``RolloutConfig.compile`` ``mode`` (``None`` for
    ``False``, or a forward that is not the lean one), made once per forward and mode and
    kept in its :attr:`LeanForward.compiled_decodes`."""
    check_compile(mode)
    if mode is False or not isinstance(forward, LeanForward):
        return None
    made = forward.compiled_decodes
    if mode not in made:
        made[mode] = CompiledDecode(forward, mode)
    return made[mode]
