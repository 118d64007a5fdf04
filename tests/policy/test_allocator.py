"""release_freed_memory hands freed heap pages back to the system (glibc Linux)."""

import platform

import pytest
import torch

from envace.policy.allocator import release_freed_memory


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_tensors_of_many_sizes_leave_resident_memory_until_released():
    # Tensors under glibc's mmap threshold come from the heap; interleaved with small live ones
    # (as a step's buffers are with the model's), their pages stay resident after they are freed.
    keep, freed = [], []
    for i in range(1, 1500):
        freed.append(torch.ones(i * 40 + 3))  # up to ~240 KB each, ~180 MB in all
        keep.append(torch.ones(5))
    del freed
    before = _rss_mib()
    assert release_freed_memory() is True
    after = _rss_mib()
    assert before - after > 50, (before, after)
    assert len(keep) == 1499


def test_release_is_safe_to_call_repeatedly():
    for _ in range(3):
        assert isinstance(release_freed_memory(), bool)
