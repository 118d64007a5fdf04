"""A simulated user played by a model through our generation backend (tau2, VitaBench).

The benchmarks' own user simulators call hosted LLMs (litellm); ours renders the same ingredients
(the benchmark's user guidelines + the task's user scenario) through any ``policy`` backend, with
roles flipped (the agent's replies are what the user model reads). The user ends the conversation
with ``###STOP###`` (tau2's convention; also ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``).
"""

from __future__ import annotations

from typing import Any

from envace.core.sampling import SamplingParams
from envace.core.types import Message

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
DEFAULT_GUIDELINES = (
    "You are playing a user who contacts a customer-service agent. Follow the scenario below: say what "
    "you want in your own words, one step at a time, and reveal information only when it is asked for. "
    "Never invent information that is not in the scenario. When your request is done (or cannot be done), "
    "write ###STOP### on its own."
)
USER_SYSTEM = "{guidelines}\n\n<scenario>\n{scenario}\n</scenario>"
GREETING = "Hi! How can I help you today?"


class LLMUser:
    """Batched simulated user; ``respond`` returns None when the user has stopped."""

    def __init__(self, backend: Any, guidelines: str = DEFAULT_GUIDELINES, max_new_tokens: int = 96,
                 seed: int | None = 0) -> None:
        self.backend, self.guidelines, self.max_new_tokens, self.seed = backend, guidelines, max_new_tokens, seed

    def chat(self, scenario: str, conversation: list[Message]) -> list[dict]:
        chat = [{"role": "system", "content": USER_SYSTEM.format(guidelines=self.guidelines, scenario=scenario)}]
        for m in conversation:
            if m.role == "assistant" and not m.tool_calls and m.content:
                chat.append({"role": "user", "content": m.content})
            elif m.role == "user" and m.content:
                chat.append({"role": "assistant", "content": m.content})
        if chat[-1]["role"] != "user":
            chat.append({"role": "user", "content": GREETING})
        return chat

    def _generate(self, chats: list[list[dict]]) -> list[str]:
        tok = self.backend.tokenizer
        prompts = [list(tok(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)["input_ids"]) for c in chats]
        gens = self.backend.generate(prompts, SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0,
                                                             seed=self.seed))
        return [g.text.strip() for g in gens]

    def open(self, items: list[Any]) -> list[str]:
        return [t or "Hi." for t in self._generate([self.chat(i.user_scenario or "", []) for i in items])]

    def respond(self, items: list[Any], conversations: list[list[Message]]) -> list[str | None]:
        texts = self._generate([self.chat(i.user_scenario or "", c) for i, c in zip(items, conversations)])
        return [None if not t or any(s in t for s in STOP_TOKENS) else t for t in texts]
