"""release_freed_memory hands freed heap pages back to the system (glibc Linux)."""

import platform

import pytest
import torch

from envace.policy.allocator import cap_heap_blocks, release_freed_memory


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


_CAPPED = """
import sys, torch
from envace.policy.allocator import cap_heap_blocks
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
cap = sys.argv[1] == 'cap'
if cap:
    assert cap_heap_blocks(256 * 1024)
big, keep = [], []
for i in range(400):
    big.append(torch.ones(100_000 + i))  # ~400 KB each: over the cap, under glibc's raised threshold
    keep.append(torch.ones(5))
    if i % 2:
        del big[0]  # freed mmapped blocks raise glibc's dynamic threshold
before = rss()
del big
print(before - rss())
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_capped_blocks_go_back_to_the_system_when_freed_without_a_trim():
    import subprocess
    import sys

    def dropped(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", _CAPPED, mode], capture_output=True, text=True, check=True)
        return float(out.stdout.strip())

    assert dropped("cap") > 50  # ~200 live 400 KB blocks unmapped at once
    assert dropped("default") < dropped("cap") / 2  # glibc's raised threshold kept them in the heap


def test_cap_rejects_thresholds_glibc_would_not_take():
    with pytest.raises(ValueError):
        cap_heap_blocks(0)
    with pytest.raises(ValueError):
        cap_heap_blocks(64 * 2**20)
    assert cap_heap_blocks(None) is False


def test_the_setting_is_a_config_field_with_a_clear_range():
    from envace.experiments.config import ConfigError, load_config

    assert load_config(None, ["mmap_threshold_kib=null"]).mmap_threshold_kib is None
    assert load_config(None, []).mmap_threshold_kib * 1024 <= 32 * 2**20
    with pytest.raises(ConfigError, match="mmap_threshold_kib"):
        load_config(None, ["mmap_threshold_kib=65536"])
