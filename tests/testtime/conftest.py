"""The test-time tests generate a lot with the tiny model; on a shared 2-core machine one torch
thread is ~10x faster than two that contend, so these tests run with one (restored after)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
