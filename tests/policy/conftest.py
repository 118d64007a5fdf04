"""Shared fixtures for the policy tests: one tiny model per session (building it is the slow part)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from envace.policy.transformers_backend import TransformersBackend

QUESTIONS = [
    "Hi",
    "What is the capital of France? Tell me more about its history, please.",
    "List three tools you could call to cancel an order.",
    "Why?",
    "Summarise the weather forecast for Paris and Berlin over the next three days in one line.",
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model's ops are too small to gain from threads, and on a busy 2-core machine
    OpenMP threads that wait on each other made these tests ~20x slower (measured). Restored
    after each module so other test packages run with their own setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> TransformersBackend:
    return TransformersBackend.from_spec("tiny")


@pytest.fixture(scope="session")
def chat_prompts(tiny: TransformersBackend) -> list[list[int]]:
    """Chat-templated prompts of different lengths, as a rollout would build them."""
    tok = tiny.tokenizer
    prompts = [
        list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False))
        for q in QUESTIONS
    ]
    assert len({len(p) for p in prompts}) == len(prompts)
    return prompts
