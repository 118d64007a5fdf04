"""The interface every generation engine (transformers, vLLM, HTTP) offers to rollouts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from envace.core.sampling import Generation, SamplingParams

if TYPE_CHECKING:  # importing transformers costs seconds; the interface should not
    from transformers import PreTrainedTokenizerBase


@runtime_checkable
class GenerationBackend(Protocol):
    """Generates continuations of already tokenised prompts.

    Prompts are token ids, not text or messages, so that the ids a rollout trains on are exactly
    the ids the policy saw (chat templating happens once, in the caller, with ``tokenizer``).
    """

    tokenizer: "PreTrainedTokenizerBase"

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One Generation per prompt, in prompt order."""
        ...
