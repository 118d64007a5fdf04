"""Fixtures for the train tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from transformers import LlamaForCausalLM
from train_helpers import make_tiny_model


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    # A 32-wide model is all overhead: with 2 OpenMP threads on a busy 2-core box each tiny
    # matmul waits on the other thread (~4 ms vs ~6 us). Restored after each test.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tiny_model() -> LlamaForCausalLM:
    return make_tiny_model(0)
