"""What a generation request asks for, and what comes back for each prompt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of continuations.

    ``temperature == 0`` means greedy decoding. ``top_p`` keeps the smallest set of tokens whose
    probability reaches ``top_p`` (1.0 keeps all). A ``stop`` string ends a row once its text
    contains it; the stop string stays in the returned text. ``seed`` makes sampling
    reproducible (None: draw from torch's global RNG).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The T of log_softmax(logits / T) under which logprobs are reported (1 when greedy)."""
        return logprob_temperature(self.temperature)


def logprob_temperature(temperature: float) -> float:
    """The T under which a sampler at ``temperature`` reports log-probs: itself, 1 when greedy."""
    return temperature if temperature > 0 else 1.0


@dataclass
class Generation:
    """One prompt's continuation.

    ``token_ids`` are the generated tokens, ending with the EOS token when the model stopped by
    itself (so training sees the stop decision), or with the token that completed a stop string.
    ``logprobs[i]`` is log p(token_ids[i]) under log_softmax(logits / T), T = the sampling
    temperature (1 when greedy); top-p truncation does not renormalise it.
    ``text`` is the decoded continuation without the EOS token, cut right after the end of the
    stop string when one ended it (so it may drop a few characters of the last token's text).
    ``finish`` is "stop" (EOS or stop string) or "length" (max_new_tokens reached).
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish: FinishReason
