"""A projection of a few rows, ``x @ w.T (+ b)`` in float32 on the CPU, as one C++ operator
(``torch.ops.workbench.few_rows_linear``) that the compiled decode step calls
(``rollout.step_graph``).

Why: a decode step multiplies each weight by 1 to a few dozen rows (a plain step's batch, a
verify pass's ``1 + n`` tokens a row). Inductor's own loops and the BLAS GEMM both do that at
a fraction of the core's vector width at a few rows: a verify pass of 5 rows cost 3.3x a plain
step of 1, though it reads the same weights. The kernel (``few_rows.cpp``, its glossary at
the top) loads each weight vector once and multiplies it into up to 8 rows' accumulators,
which stay in registers over the whole inner dimension; more rows run 8 at a time.
``benchmarks/bench_few_rows.py`` measures it against the library's GEMM and, in rollouts,
the compiled step with it against the step without.

The weights are taken packed (:func:`pack`, ``LayerPlan.packed``): in strips of 16 output
columns, each strip's ``[K, 16]`` one contiguous block, so that the kernel reads whole vectors
front to back instead of a row of a few hundred bytes every few kilobytes.

Built on first use with the machine's C++ compiler (``$CXX``, else ``g++``; the compiled
step needs one anyway, for inductor) for this CPU (``-march=native``: AVX-512 where the CPU
has it; ``$WORKBENCH_KERNEL_MARCH`` names another target, as the tests do to check the AVX2
code on a machine with AVX-512), into a cache folder keyed by the source, torch's version
and the CPU's features, so a second process loads it at once and a machine with another CPU
builds its own. Where it cannot be built, :func:`few_rows_op` says why and the compiled step
keeps inductor's loops and the library's GEMM.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

__all__ = ["few_rows_op", "few_rows_linear", "kernel_cache_dir", "kernel_applies", "pack"]

SOURCE = Path(__file__).with_name("few_rows.cpp")
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")


def _march() -> str:
    return f"-march={os.environ.get('WORKBENCH_KERNEL_MARCH') or 'native'}"


def kernel_cache_dir() -> Path:
    """Where built kernels live: ``$WORKBENCH_KERNEL_CACHE``, else ``$XDG_CACHE_HOME`` (or
    ``~/.cache``) ``/workbench/kernels``."""
    explicit = os.environ.get("WORKBENCH_KERNEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "workbench" / "kernels"


def _cpu_features() -> str:
    """The CPU's model and feature flags (what ``-march=native`` compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in text.splitlines() if ln.startswith(("flags", "model name"))]
    return "\n".join(sorted(set(lines)))


def _command(cxx: str, source: Path, target: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths, library_paths
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    libs = library_paths()
    return [cxx, *FLAGS, _march(), f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(f"-I{p}" for p in include_paths()), str(source), "-o", str(target),
            *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs),
            "-lc10", "-ltorch_cpu", "-ltorch"]


def _build() -> Path:
    """The kernel's shared library, built into :func:`kernel_cache_dir` unless there already
    (written to a temporary name, then renamed: a concurrent build never loads a half)."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX', 'g++')!r} not on PATH)")
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(b"\0".join([source, torch.__version__.encode(), cxx.encode(),
                                        " ".join((*FLAGS, _march())).encode(),
                                        _cpu_features().encode()])).hexdigest()[:16]
    folder = kernel_cache_dir()
    target = folder / f"few_rows-{digest}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".so.tmp", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run(_command(cxx, SOURCE, Path(tmp)), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{cxx} failed on {SOURCE.name}: {done.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _fake(x, packed, bias, n):
    """The operator's output for tracing: ``[M, n]`` like ``x``."""
    return x.new_empty((x.shape[0], n))


_LOADING = threading.Lock()  # functools.cache does not keep two threads out of _load


@functools.cache
def _load() -> tuple[object | None, str]:
    try:
        torch.ops.load_library(str(_build()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        return None, f"{type(err).__name__}: {err}"
    torch.library.register_fake("workbench::few_rows_linear")(_fake)
    return torch.ops.workbench.few_rows_linear.default, ""


def few_rows_op():
    """``(operator or None, why not)``: the loaded operator, built on first call (seconds)
    or loaded from the cache; ``None`` with the reason where it could not be built. One
    thread at a time loads it (``side_by_side`` runs systems on threads): its fake is
    registered once."""
    with _LOADING:
        return _load()


STRIP = 16  # output columns a strip of packed weights holds


def pack(w: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` (a linear layer's weight) in the kernel's layout, ``[ceil(N / 16), K,
    16]``: strip ``s`` holds output columns ``16 s ..`` as one contiguous block, zero past
    ``N``. A copy (made once per version of the weights, ``LayerPlan.packed``)."""
    n, k = w.shape
    strips = -(-n // STRIP)
    padded = torch.nn.functional.pad(w.detach(), (0, 0, 0, strips * STRIP - n))
    return padded.view(strips, STRIP, k).transpose(1, 2).contiguous()


def few_rows_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                    n: int) -> torch.Tensor:
    """``x [M, K] @ w.T + bias [n]`` (float32, CPU) for ``packed = pack(w)``, ``w [n, K]``:
    ``[M, n]``. A RuntimeError where the kernel could not be built (:func:`few_rows_op` says
    why) or the shapes do not fit (the operator names them)."""
    op, why = few_rows_op()
    if op is None:
        raise RuntimeError(f"the few-rows kernel is unavailable: {why}")
    return op(x, packed, bias, n)


def kernel_applies(enabled: bool, dtype: torch.dtype, device) -> bool:
    """Whether a compiled step's projections run through the kernel: ``enabled`` (its
    setting), float32 weights on the CPU, and the kernel loads (built now if need be)."""
    if not enabled or dtype != torch.float32 or torch.device(device).type != "cpu":
        return False
    return few_rows_op()[0] is not None
