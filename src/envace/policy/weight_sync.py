"""Rollouts on a serving engine during training: the trainer's weights pushed to it.

``rollout.backend`` picks who generates a training run's rollouts: ``transformers`` (the
trainer's own model, in process: nothing to push), ``http`` (an OpenAI-compatible server such
as ``envace serve --allow-weight-updates``: the weights go to it as a safetensors file it loads
through ``POST /v1/load_weights``; the file must be readable by the server, e.g. the same
machine or a shared disk), ``vllm`` (an in-process vLLM engine: ``VLLMBackend.sync_weights``) or
``llamacpp`` (llama.cpp in process: ``LlamaCppBackend.sync_weights`` writes a GGUF file and reloads it).
The pushed weights are the served model's own names (peft LoRA merged out of place, wrappers
stripped: :func:`envace.policy.vllm_backend.vllm_weights`), pushed before the first rollout (the
server may hold the base model while the trainer holds a warm start) and after every update.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import nn

from envace.policy.vllm_backend import vllm_weights


def save_served_weights(model: nn.Module, path: Path) -> int:
    """Write ``model``'s weights, merged and under their HF names, to ``path`` (atomically: a
    server never reads half a file). Returns the number of tensors."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in vllm_weights(model)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
    return len(tensors)


@dataclass
class WeightPusher:
    """Keeps one serving backend's weights equal to one trained model's."""

    backend: Any  # HTTPBackend, or VLLMBackend / LlamaCppBackend (they have sync_weights)
    model: nn.Module
    path: Path  # where the http push writes its file
    pushes: int = 0

    def push(self) -> dict[str, float]:
        if hasattr(self.backend, "sync_weights"):  # vLLM in process
            n = self.backend.sync_weights(self.model)
        else:
            n = save_served_weights(self.model, self.path)
            answer = self.backend.post("/load_weights", {"path": str(self.path.resolve())})
            if int(answer.get("loaded", -1)) != n:
                raise RuntimeError(f"the server at {self.backend.base_url} loaded {answer.get('loaded')} of {n} "
                                   "weights")
        self.pushes += 1
        return {"tensors": float(n)}
