"""An LLM judge for ``judge`` checklist items, through any generation backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envace.core.sampling import SamplingParams
from envace.core.types import Task, Trajectory

JUDGE_SYSTEM = (
    "You grade whether an assistant met a criterion in a conversation with a user and tools. "
    "Answer with YES or NO, then one short reason."
)


def transcript(traj: Trajectory, max_chars: int = 3000) -> str:
    lines = [f"{m.role}: {m.content}" for m in traj.messages if m.role != "system"]
    text = "\n".join(lines)
    return text[-max_chars:]  # the end holds the outcome; keep it when the history is long


@dataclass
class ModelJudge:
    """Asks a model YES/NO. ``backend`` is any object with ``tokenizer`` and ``generate``."""

    backend: Any
    max_new_tokens: int = 24

    def judge(self, criterion: str, task: Task, trajectory: Trajectory) -> tuple[bool, str]:
        tok = self.backend.tokenizer
        chat = [
            {"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"Request: {task.instruction}\n\nConversation:\n"
                                        f"{transcript(trajectory)}\n\nCriterion: {criterion}\nMet?"},
        ]
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        gen = self.backend.generate([ids], SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0))[0]
        answer = gen.text.strip()
        return answer.upper().startswith("YES"), answer


@dataclass
class ChatJudge:
    """Asks an OpenAI-compatible chat endpoint YES/NO (``client``: an HTTPBackend, which has the
    timeout and retries). A failed request is no verdict (None), not a NO: the item is left out
    of the reward, and the verdict's detail says why."""

    client: Any
    max_new_tokens: int = 24

    def judge(self, criterion: str, task: Task, trajectory: Trajectory) -> tuple[bool | None, str]:
        messages = [
            {"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"Request: {task.instruction}\n\nConversation:\n"
                                        f"{transcript(trajectory)}\n\nCriterion: {criterion}\nMet?"},
        ]
        try:
            answer = self.client.chat(messages, max_tokens=self.max_new_tokens, temperature=0.0).text.strip()
        except Exception as e:  # timeouts and server errors after the client's retries
            return None, f"judge unavailable: {type(e).__name__}: {e}"[:300]
        return answer.upper().startswith("YES"), answer
