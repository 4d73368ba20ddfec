"""``rollout.graph_call.DirectGraph``: a compiled function's later calls skip dynamo's frame
wrappers yet run exactly the graph dynamo would, after exactly its guards (the compiled
decode step's fixed cost, issue 41). Dynamo's own graph with eager kernels (``"eager"``):
the calling, not inductor, is under test."""
from __future__ import annotations

import torch

from workbench.rollout.graph_call import DirectGraph


def make_fn(scale: float):
    """A closure like the decode step's: a constant closed over, an input written in place,
    a tuple of tensors returned."""
    def fn(x, w, out_buf, col):
        y = torch.tanh(x @ w) * scale
        out_buf.index_copy_(1, col, y[:, None])
        return y.sum(-1), y
    return fn


def args_for(rows=2, k=8, n=4, cols=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, k, generator=g, dtype=dtype),
            torch.randn(k, n, generator=g, dtype=dtype),
            torch.zeros(rows, cols, n, dtype=dtype), torch.tensor([cols - 1]))


def check(fn, direct, args):
    """``direct(*args)`` returns what ``fn`` returns and writes what it writes."""
    ref_buf = args[2].clone()
    want = fn(args[0], args[1], ref_buf, args[3])
    got = direct(*args)
    assert isinstance(got, tuple) and len(got) == 2
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.equal(args[2], ref_buf)


def test_later_calls_go_direct_and_write_their_inputs_in_place():
    fn = make_fn(2.0)
    direct = DirectGraph(fn, backend="eager")
    with torch.inference_mode():
        check(fn, direct, args_for(seed=0))
        assert (direct.through_dynamo, direct.direct) == (1, 0)
        for seed in (1, 2):
            check(fn, direct, args_for(seed=seed))  # new tensors, the same guards
        assert (direct.through_dynamo, direct.direct) == (1, 2)


def test_inputs_its_guards_refuse_go_through_dynamo_then_both_graphs_go_direct():
    fn = make_fn(0.5)
    direct = DirectGraph(fn, backend="eager", dynamic=False)
    with torch.inference_mode():
        check(fn, direct, args_for(dtype=torch.float64))
        check(fn, direct, args_for(dtype=torch.float32))  # a dtype guard fails: recompiled
        check(fn, direct, args_for(rows=3))  # a static size guard fails
        assert (direct.through_dynamo, direct.direct) == (3, 0)
        check(fn, direct, args_for(dtype=torch.float32, seed=4))
        check(fn, direct, args_for(rows=3, seed=5))
        check(fn, direct, args_for(seed=6))
        assert (direct.through_dynamo, direct.direct) == (3, 3)
        assert len(direct.bound) == 3


def test_symbolic_sizes_are_read_from_the_call():
    fn = make_fn(3)  # an int: a constant of the graph (a float may become an input, below)
    direct = DirectGraph(fn, backend="eager")
    with torch.inference_mode():
        first = args_for(cols=5)
        torch._dynamo.mark_dynamic(first[2], 1)  # the buffer's columns symbolic
        check(fn, direct, first)
        for cols in (7, 11, 6):
            check(fn, direct, args_for(cols=cols, seed=cols))
        assert (direct.through_dynamo, direct.direct) == (1, 3)


def test_an_input_dynamo_makes_itself_is_never_read_from_the_frame():
    """With symbolic sizes dynamo may pass a float closed over as a tensor of its own
    making: such a graph is not bound (its inputs are not the frame's), and every call
    still returns what the function returns."""
    fn = make_fn(1.5)
    direct = DirectGraph(fn, backend="eager")
    with torch.inference_mode():
        first = args_for(cols=5)
        torch._dynamo.mark_dynamic(first[2], 1)
        check(fn, direct, first)
        for cols in (7, 11, 6):
            check(fn, direct, args_for(cols=cols, seed=cols))
    assert direct.through_dynamo + direct.direct == 4


def test_closures_of_one_code_keep_their_own_constants():
    """The decode step's closures share one code object (dynamo keeps their graphs in one
    cache); each call runs the graph whose guards accept its own closure."""
    fns = [make_fn(s) for s in (1, -3)]
    directs = [DirectGraph(f, backend="eager") for f in fns]
    with torch.inference_mode():
        for seed in range(3):
            for fn, direct in zip(fns, directs):
                check(fn, direct, args_for(seed=seed))
    assert [d.direct for d in directs] == [2, 2]


def test_a_function_not_returning_its_graph_outputs_stays_with_dynamo():
    def fn(x, w):
        return x, (x @ w).sum()  # an input returned as is: dynamo's code, not the graph's

    direct = DirectGraph(fn, backend="eager")
    with torch.inference_mode():
        x, w = torch.randn(2, 3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
        for _ in range(3):
            got = direct(x, w)
            assert got[0] is x and torch.equal(got[1], (x @ w).sum())
    assert (direct.through_dynamo, direct.direct) == (3, 0)


def test_keyword_only_parameters_are_refused():
    def fn(x, *, scale):
        return (x * scale,)

    try:
        DirectGraph(fn, backend="eager")
    except ValueError as exc:
        assert "positional parameters only" in str(exc) and "scale" in str(exc)
    else:
        raise AssertionError("a keyword-only parameter was accepted")
