"""A YES/NO criterion judge over any policy backend (VitaBench rubrics, tau2 NL assertions).

The benchmarks' own judges call hosted LLMs (VitaBench's rubric grader, tau2's NL-assertion
evaluator through litellm); ours asks a local model, one criterion per prompt, and reads a
leading YES as met. Which model judges is the run's ``--judge-model`` (default: the policy).
"""

from __future__ import annotations

from typing import Any

from envace.core.sampling import SamplingParams

DEFAULT_SYSTEM = ("You grade a conversation between a user and an assistant that uses tools. Answer YES if the "
                  "conversation satisfies the criterion, NO otherwise, then one short reason.")


class YesNoJudge:
    def __init__(self, backend: Any, system: str = DEFAULT_SYSTEM, max_new_tokens: int = 16,
                 max_transcript_chars: int = 4000) -> None:
        self.backend, self.system, self.max_new_tokens = backend, system, max_new_tokens
        self.max_transcript_chars = max_transcript_chars

    def judge(self, criteria: list[str], transcript: str) -> list[bool]:
        if not criteria:
            return []
        tok = self.backend.tokenizer
        prompts = []
        for c in criteria:
            chat = [{"role": "system", "content": self.system},
                    {"role": "user", "content": f"{transcript[-self.max_transcript_chars:]}\n\nCriterion: {c}\nMet?"}]
            text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            prompts.append(list(tok(text, add_special_tokens=False)["input_ids"]))
        gens = self.backend.generate(prompts, SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0))
        return [g.text.strip().upper().startswith("YES") for g in gens]
