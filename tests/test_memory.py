"""``release_memory`` hands freed heap pages back to the system (what keeps an ablation of many
runs in one process from holding every run's update peak)."""
import pytest
import torch

from workbench.memory import MemoryReleaser, release_memory, resident_bytes


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


@pytest.mark.skipif(not release_memory(), reason="no malloc_trim in this C library")
def test_the_releaser_releases_only_after_the_process_has_grown_by_its_threshold():
    release_memory()  # few free pages left inside the resident set: new tensors grow it
    small, large = MemoryReleaser(threshold=100 * 2**20), MemoryReleaser(threshold=2**30)
    start = _resident_mb()
    held = [torch.ones(16 * 1024) for _ in range(3000)]  # 192 MB, held: the growth stays
    assert _resident_mb() > start + 150
    assert large() is False  # grown ~192 MB, under its 1 GB
    assert small() is True  # over its 100 MB: released (what is free; the held stays)
    assert small() is False  # nothing grew since its release
    del held


def test_a_releaser_threshold_must_be_bytes():
    with pytest.raises(ValueError, match=r"threshold=-1: accepted a whole number of bytes"):
        MemoryReleaser(threshold=-1)
