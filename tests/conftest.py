"""Fixtures shared across test packages: the tiny random Llama (real tokenizer) is built once."""

from __future__ import annotations

import os

import pytest

from envace.policy.transformers_backend import TransformersBackend

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch a model hub


@pytest.fixture(scope="session")
def tiny_backend() -> TransformersBackend:
    return TransformersBackend.from_spec("tiny", max_batch=8)
