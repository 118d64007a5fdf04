"""Generation backends: load a policy model, sample batched continuations with logprobs.

``backend`` is light (no torch import; the request and result types live in ``core.sampling``); the loaders and the transformers
backend import torch/transformers (seconds), so they are only imported when first used here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from envace.policy.backend import GenerationBackend
from envace.core.sampling import FinishReason, Generation, SamplingParams

if TYPE_CHECKING:
    from envace.policy.loading import ModelSpecError, load_model
    from envace.policy.transformers_backend import TransformersBackend

_LAZY = {
    "load_model": "envace.policy.loading",
    "ModelSpecError": "envace.policy.loading",
    "TransformersBackend": "envace.policy.transformers_backend",
}

__all__ = [
    "FinishReason",
    "Generation",
    "GenerationBackend",
    "ModelSpecError",
    "SamplingParams",
    "TransformersBackend",
    "load_model",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envace.policy' has no attribute {name!r}")
