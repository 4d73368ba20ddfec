"""``release_memory`` hands freed heap pages back to the system (what keeps an ablation of many
runs in one process from holding every run's update peak)."""
import pytest
import torch

from workbench.memory import release_memory, resident_bytes


def _resident_mb() -> float:
    return resident_bytes() / 2**20


@pytest.mark.skipif(not release_memory(), reason="no malloc_trim in this C library")
def test_freed_heap_pages_go_back_to_the_system():
    release_memory()
    start = _resident_mb()
    held = [torch.ones(16 * 1024) for _ in range(3000)]  # 192 MB in 64 KB blocks: malloc's heap
    assert _resident_mb() > start + 150
    del held
    release_memory()
    assert _resident_mb() < start + 50
