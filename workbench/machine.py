"""The machine and the checkout a figure was measured on (``workbench.provenance`` writes
them into every result): the CPU model and its vector and matrix flags (AVX-512 and AMX change
CPU figures between machines of one kind), the cores, the accelerator, the versions that move
figures, and the git commit with whether the tree was dirty."""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

__all__ = ["machine", "commit", "run_commit", "cpu_from_cpuinfo", "FLAG_LABELS"]

FLAG_LABELS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX512-BF16",
               "avx512_vnni": "AVX512-VNNI", "amx_tile": "AMX", "amx_bf16": "AMX-BF16",
               "amx_int8": "AMX-INT8", "asimd": "NEON", "sve": "SVE"}
"""The CPU flags a machine's description names, with their labels."""
ROOT = Path(__file__).resolve().parent.parent
CPUINFO = Path("/proc/cpuinfo")  # Linux; elsewhere machine() falls back to platform


def cpu_from_cpuinfo(text: str) -> tuple[str | None, list[str]]:
    """``(model, flags)`` from the text of ``/proc/cpuinfo``: the first ``model name`` (x86)
    or ``Hardware``/``Model`` line (ARM), and the flags of :data:`FLAG_LABELS` it lists."""
    model = None
    for key in ("model name", "Hardware", "Model", "cpu model"):
        found = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
        if found:
            model = found.group(1).strip()
            break
    found = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.M)
    present = set(found.group(1).split()) if found else set()
    return model, [f for f in FLAG_LABELS if f in present]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """The machine a result comes from: CPU model and its vector/matrix flags (from
    ``/proc/cpuinfo``, else ``platform``), cores (all, and those this process may use), the
    accelerator torch sees (only when torch is already imported: None otherwise), the
    versions of torch, transformers and Python, and the platform string."""
    try:
        model, flags = cpu_from_cpuinfo(CPUINFO.read_text())
    except OSError:
        model, flags = None, []
    cores = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = cores
    accelerator = None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                accelerator = torch.cuda.get_device_name(0)
        except Exception:  # a broken driver must not stop a result from being written
            accelerator = None
    torch_version = getattr(torch, "__version__", None) or _version("torch")
    return {"cpu": model or platform.processor() or platform.machine() or None,
            "flags": flags, "cores": cores, "usable_cores": usable,
            "accelerator": accelerator, "torch": str(torch_version) if torch_version else None,
            "transformers": _version("transformers"), "python": platform.python_version(),
            "platform": platform.platform()}


def commit(root: str | os.PathLike | None = None) -> dict:
    """``{"commit", "dirty"}`` of the git checkout at ``root`` (default: the one this package
    lies in): the HEAD commit, and whether ``git status --porcelain`` lists anything (a
    change or an untracked file). Both None outside a checkout or without git."""
    root = Path(root) if root is not None else ROOT

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  check=False, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain")
    return {"commit": head, "dirty": None if status is None else bool(status)}


@lru_cache(maxsize=1)
def run_commit() -> dict:
    """:func:`commit` of this package's checkout as it was when this process first asked: the
    code a process runs is the code it imported at its start, so a commit made while a
    notebook runs must not be credited with the run's figures (``results.prepare_out_dir``
    asks first, as a notebook sets up; ``results.write_metrics`` records it)."""
    return commit()
