"""The few-rows kernel (``rollout.few_rows``): its packed layout, its products against a
float64 reference at every count of rows and ragged shapes, its refusals, its build, and the
compiled float32 step that calls it (tokens as the eager step's, weights changed in place
repacked, an EAGLE head's ``fc`` included)."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
import torch

from workbench.rollout import RolloutConfig, RolloutEngine
from workbench.rollout.compile_settings import inductor_options
from workbench.rollout.compiled import compiled_decode_for
from workbench.rollout.few_rows import (few_rows_linear, few_rows_op, kernel_applies,
                                        kernel_cache_dir, pack)
from workbench.rollout.forward import policy_forward
from workbench.rollout.step_graph import project_packed
from workbench.speculative import EagleDrafter, EagleHead

from .helpers.models import PROMPTS, tiny_model

pytestmark = pytest.mark.compiles


@pytest.fixture(autouse=True)
def kernel_here():
    """Skip where the kernel cannot be built (built here, by the first test that runs, not
    at collection: every pytest-xdist worker collects every module)."""
    op, why = few_rows_op()
    if op is None:
        pytest.skip(f"no few-rows kernel here: {why}")


def test_pack_puts_16_output_columns_a_strip_zero_past_n():
    w = torch.arange(37 * 5, dtype=torch.float32).view(37, 5)
    p = pack(w)
    assert p.shape == (3, 5, 16) and p.is_contiguous()
    for s, k, j in [(0, 0, 0), (1, 4, 3), (2, 2, 4)]:
        assert p[s, k, j] == w[16 * s + j, k]
    assert (p[2, :, 5:] == 0).all()  # columns 37.. do not exist


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 13, 40])
@pytest.mark.parametrize("n,k", [(1, 1), (5, 3), (16, 16), (17, 37), (100, 64), (384, 256)])
def test_products_equal_a_float64_reference(rows, n, k):
    """Every block of rows the kernel has (1 to 8, then 8 at a time with a remainder), output
    columns past a whole strip and past a whole panel, with and without a bias."""
    g = torch.Generator().manual_seed(rows * 1000 + n + k)
    x, w, b = (torch.randn(*s, generator=g) for s in ((rows, k), (n, k), (n,)))
    want = x.double() @ w.double().T
    for bias, ref in ((None, want), (b, want + b.double())):
        out = few_rows_linear(x, pack(w), bias, n)
        assert out.shape == (rows, n) and out.dtype == torch.float32
        torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5 * (1 + k ** 0.5))


def test_bad_shapes_and_dtypes_are_refused_with_their_values():
    w = torch.randn(20, 8)
    with pytest.raises(RuntimeError, match="N = 40"):  # 2 strips hold 17 to 32 columns
        few_rows_linear(torch.randn(3, 8), pack(w), None, 40)
    with pytest.raises(RuntimeError, match=r"\[3, 9\]"):
        few_rows_linear(torch.randn(3, 9), pack(w), None, 20)
    with pytest.raises(RuntimeError, match="float32 only"):
        few_rows_linear(torch.randn(3, 8, dtype=torch.float64), pack(w).double(), None, 20)
    with pytest.raises(RuntimeError, match="bias"):
        few_rows_linear(torch.randn(3, 8), pack(w), torch.randn(19), 20)


def test_applies_to_float32_on_the_cpu_when_enabled():
    assert kernel_applies(True, torch.float32, "cpu")
    assert not kernel_applies(False, torch.float32, "cpu")
    assert not kernel_applies(True, torch.float64, "cpu")
    assert not kernel_applies(True, torch.bfloat16, "cpu")


def test_the_build_is_cached_per_source_and_cpu_and_a_missing_compiler_is_named(
        tmp_path, monkeypatch):
    from workbench.rollout import few_rows
    monkeypatch.setenv("WORKBENCH_KERNEL_CACHE", str(tmp_path / "k"))
    assert kernel_cache_dir() == tmp_path / "k"
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(RuntimeError, match="no-such-compiler-here"):
        few_rows._build()
    assert not (tmp_path / "k").exists()  # refused before anything was written
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(few_rows, "_command", lambda *a: ["false"])  # a build that fails
    with pytest.raises(RuntimeError, match="failed"):
        few_rows._build()
    assert list((tmp_path / "k").iterdir()) == []  # no half-written library left behind


def _float32_llama(tokenizer, seed):
    return tiny_model("llama", tokenizer, seed=seed, layers=1, dtype=torch.float32)


@pytest.mark.parametrize("rows", [1, 5, 11])
def test_inductor_calls_the_operator_from_its_cpp_wrapper(rows):
    """A projection after a norm, compiled as the step compiles (inductor, its C++ wrapper):
    the operator's fake gives the graph its shapes, and the graph calls it."""
    x, w, b = torch.randn(rows, 24), torch.randn(40, 24), torch.randn(40)

    def fn(x, w, b):
        return project_packed(torch.nn.functional.rms_norm(x, (24,)), w, b, 40) * 2

    graph = torch.compile(fn, fullgraph=True, dynamic=False, options=inductor_options(True))
    want = torch.nn.functional.linear(torch.nn.functional.rms_norm(x, (24,)), w, b) * 2
    torch.testing.assert_close(graph(x, pack(w), b), want, rtol=1e-5, atol=1e-5)


def test_compiled_float32_steps_through_the_kernel_give_the_eager_tokens(tokenizer):
    """Plain steps of two rows through the step's graph and the kernel (dynamo's graphs run
    by its eager backend here, the operator included: inductor's own part is the test
    above's), then the same after the weights are trained in place: the plans are rebuilt
    and repacked (a stale copy would change the compiled step's tokens and not the eager
    one's)."""
    model = _float32_llama(tokenizer, seed=4)
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=16, max_batch_size=2, ignore_eos=True)
    compiled = compiled_decode_for(policy_forward(model), True)
    compiled.backend = "eager"
    for _ in range(2):
        eager = engine.rollout(PROMPTS[:2], cfg, progress=False)
        comp = engine.rollout(PROMPTS[:2], cfg, compile=True, progress=False)
        assert comp.tokens == eager.tokens
        np.testing.assert_allclose(np.concatenate(comp.logprobs),
                                   np.concatenate(eager.logprobs), atol=1e-4, rtol=0)
        assert compiled._packed() and compiled.steps["compiled"] > 0
        with torch.no_grad():  # an optimizer step's in-place update of every weight
            for p in model.parameters():
                p.mul_(1.5)
    assert len(compiled.compiles) == 1  # one row bucket; repacking compiled nothing new


def test_an_eagle_head_trained_in_place_is_repacked(tokenizer):
    """The head's compiled draft steps run through the kernel (graphs run by dynamo's eager
    backend here, the operator included: a test need not pay inductor's compiles), and its
    ``fc``, trained in place as on an idle worker, is packed again."""
    model = _float32_llama(tokenizer, seed=5)
    torch.manual_seed(0)
    drafter = EagleDrafter(EagleHead(model), model)
    drafter.compiled.backend = "eager"
    compiled_decode_for(policy_forward(model), True).backend = "eager"
    engine = RolloutEngine(model, tokenizer)
    cfg = RolloutConfig(max_new_tokens=12, spec_k=3)
    eager = engine.rollout(PROMPTS[:2], cfg, drafter=drafter, progress=False)
    comp = engine.rollout(PROMPTS[:2], cfg, drafter=drafter, compile=True, progress=False)
    assert comp.tokens == eager.tokens
    compiled = drafter.compiled
    assert compiled._packed() and compiled.steps["compiled"] > 0
    fc = drafter.head.fc
    with torch.no_grad():
        fc.weight.add_(0.25)  # the drafter trained on an idle worker
    packed_fc = compiled._weights(compiled._plans())[1]
    torch.testing.assert_close(packed_fc, pack(fc.weight), rtol=0, atol=0)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 target")
def test_the_code_for_cpus_without_avx512_gives_the_same_products(tmp_path):
    """Built for AVX2 (``-march=x86-64-v3``: 8 floats a vector, 16 registers, so smaller
    panels) in a process of its own, as on a machine of the project's kind without AVX-512."""
    script = """
import torch
from workbench.rollout import few_rows
from workbench.rollout.few_rows import few_rows_linear, pack
op, why = few_rows.few_rows_op()
assert op is not None, why
for rows in (1, 3, 5, 8, 13):
    for n, k in ((17, 37), (100, 64), (384, 256)):
        g = torch.Generator().manual_seed(rows + n)
        x, w, b = (torch.randn(*s, generator=g) for s in ((rows, k), (n, k), (n,)))
        ref = x.double() @ w.double().T + b.double()
        out = few_rows_linear(x, pack(w), b, n).double()
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5 * (1 + k ** 0.5))
print(few_rows._build().name)
"""
    env = {**os.environ, "WORKBENCH_KERNEL_MARCH": "x86-64-v3",
           "WORKBENCH_KERNEL_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == [done.stdout.split()[-1]]


def test_a_kernel_that_cannot_be_built_leaves_the_step_on_inductor_s_loops(monkeypatch):
    from workbench.rollout import few_rows
    monkeypatch.setattr(few_rows, "few_rows_op", lambda: (None, "RuntimeError: no g++"))
    assert not kernel_applies(True, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="unavailable: RuntimeError: no g\\+\\+"):
        few_rows_linear(torch.randn(1, 4), pack(torch.randn(4, 4)), None, 4)
