"""Fixtures shared across test packages: the tiny random Llama (real tokenizer) is built once."""

from __future__ import annotations

import pytest

from envace.policy.transformers_backend import TransformersBackend


@pytest.fixture(scope="session")
def tiny_backend() -> TransformersBackend:
    return TransformersBackend.from_spec("tiny", max_batch=8)
