"""A ``torch.compile``'d function called past dynamo's frame machinery once its graph has
run: the compiled decode step's fixed cost per call (``rollout.compiled``).

A call of a ``torch.compile``'d function enters dynamo's frame hook, evaluates the guards of
its cached graphs, and goes through several Python wrappers before the graph's own code
runs. For the decode step at batch 1 on this project's CPU, replayed in a loop, those cost
75-90 us a call against the graph's ~390 us, the guards themselves ~14 us; in a rollout,
skipping the wrappers makes batch 1 about 3% faster (``benchmarks/bench_direct_call.py``,
issue 41). :class:`DirectGraph` keeps dynamo's semantics and skips the wrappers:

1. the first call with inputs no known graph accepts goes through dynamo as usual (it
   compiles, or picks a cached graph); the backend is wrapped so that the graph that ran is
   known, with the dynamo *source* of each of its inputs (``L['ks'][3]``,
   ``L['vis'].size()[1]``);
2. that graph is bound to the guards of dynamo's cache entry that accepted the inputs (the
   first entry whose guards pass, the one dynamo just ran);
3. a later call evaluates those guards itself on the call's arguments (and the function's
   closure, which is part of dynamo's frame) and, if they pass, calls the graph with its
   inputs read from the arguments by their sources; otherwise step 1.

So a call runs exactly the graph dynamo would run, after exactly its guards. A graph is
bound only when the function's return value is the graph's outputs, unchanged (true of a
``fullgraph`` step returning its tensors), and its inputs read by their sources are the very
inputs dynamo passed (not so where dynamo made one, a float wrapped in a tensor); anything
else keeps going through dynamo. The introspection is torch 2.13's
(``_debug_get_cache_entry_list``, a cache entry's ``guard_manager``, a placeholder's
``grapharg``): should it be missing, every call goes through dynamo
(:attr:`DirectGraph.direct` stays 0).
"""
from __future__ import annotations

import inspect
import threading
from collections.abc import Callable

import torch

__all__ = ["DirectGraph"]


class _Ran(threading.local):
    graph = None  # the _Graph whose code this thread ran last through dynamo


_RAN = _Ran()


class _Graph:
    """One compiled graph, as the backend made it: called by dynamo with the graph's inputs;
    ``readers`` read those inputs from a frame's locals ``L`` (their dynamo sources)."""

    def __init__(self, compiled: Callable, sources: list[str]):
        self.compiled = compiled
        self.readers = [eval(f"lambda L: {s}") for s in sources]  # noqa: S307 (dynamo's)
        self.inputs = self.outputs = None  # of the call through dynamo being bound

    def __call__(self, *inputs):
        _RAN.graph = self
        self.inputs = inputs
        self.outputs = self.compiled(*inputs)
        return self.outputs

    def reads(self, frame: dict) -> bool:
        """Whether the readers give, from ``frame``, the very inputs that dynamo passed (the
        same tensors, equal numbers of the same type): not so where dynamo made an input of
        its own (a float wrapped in a tensor, say)."""
        try:
            got = [read(frame) for read in self.readers]
        except Exception:  # noqa: BLE001 (a source this reading does not follow)
            return False
        return len(got) == len(self.inputs) and all(
            a is b if isinstance(b, torch.Tensor) else type(a) is type(b) and a == b
            for a, b in zip(got, self.inputs))

    def run(self, frame: dict):
        """The graph's outputs for the call whose locals are ``frame``."""
        return self.compiled(*[read(frame) for read in self.readers])


def _source(node) -> str:
    name = node.meta["grapharg"].source.name
    return name() if callable(name) else name


def _inner_backend(backend: str, options: dict | None) -> Callable:
    if backend == "inductor":
        from torch._inductor.compile_fx import compile_fx
        return lambda gm, inputs: compile_fx(gm, inputs, config_patches=options or {})
    return torch._dynamo.lookup_backend(backend)


class DirectGraph:
    """``fn`` compiled (``torch.compile(fn, backend=..., dynamic=..., fullgraph=True,
    options=...)``), called with positional arguments as ``fn`` is; see the module's
    docstring. ``direct``/``through_dynamo``: calls each way so far."""

    def __init__(self, fn: Callable, backend: str = "inductor", dynamic: bool | None = None,
                 options: dict | None = None):
        code = fn.__code__
        params = inspect.signature(fn).parameters
        if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params.values()):
            raise ValueError(f"{fn.__name__} takes {list(params)}; accepted: positional "
                             "parameters only")
        self.names = list(params)
        self.closure = {n: c.cell_contents
                        for n, c in zip(code.co_freevars, fn.__closure__ or ())}
        self.code = code
        inner = _inner_backend(backend, options)

        def wrapped(gm, inputs):
            compiled = inner(gm, inputs)
            try:
                sources = [_source(n) for n in gm.graph.nodes if n.op == "placeholder"]
            except (KeyError, AttributeError):  # no source to read an input by: dynamo's
                return compiled
            return _Graph(compiled, sources)
        self.compiled = torch.compile(fn, backend=wrapped, dynamic=dynamic, fullgraph=True)
        self.bound: list[tuple[object, _Graph]] = []  # (guards, graph), the last hit first
        self.direct = self.through_dynamo = 0

    def __call__(self, *args):
        frame = dict(zip(self.names, args))
        frame.update(self.closure)
        for i, pair in enumerate(self.bound):
            if pair[0].check(frame):
                if i:  # the last hit first, in a new list (a thread iterating keeps its own)
                    self.bound = [pair] + [p for p in self.bound if p is not pair]
                self.direct += 1
                return pair[1].run(frame)
        return self._through_dynamo(args, frame)

    def _through_dynamo(self, args, frame: dict):
        _RAN.graph = None
        out = self.compiled(*args)
        self.through_dynamo += 1
        graph, _RAN.graph = _RAN.graph, None
        if graph is not None and _unchanged(out, graph.outputs) and graph.reads(frame):
            guards = _accepting_guards(self.code, frame)
            if guards is not None:
                self.bound = [(guards, graph), *self.bound]
        if graph is not None:
            graph.inputs = graph.outputs = None
        return out


def _unchanged(out, graph_out) -> bool:
    """Whether the function returned the graph's outputs themselves, in order."""
    return (isinstance(out, tuple) and graph_out is not None and len(out) == len(graph_out)
            and all(a is b for a, b in zip(out, graph_out)))


def _accepting_guards(code, frame: dict):
    """The guards of dynamo's first cache entry for ``code`` that accept ``frame`` (the
    entry that just ran: dynamo moves a hit to the front), or ``None``."""
    try:
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
        entries = _debug_get_cache_entry_list(code)
        return next((e.guard_manager for e in entries if e.guard_manager.check(frame)), None)
    except (ImportError, AttributeError, TypeError, KeyError):
        return None
