"""Reading one caller turn: the assistant message, its training sample, and each tool call with
the structured error a real API would answer it with (None: the call goes to the response
source). The episode loop (:mod:`envace.rollout.engine`) acts on what this returns."""

from __future__ import annotations

from dataclasses import dataclass

from envace.core.errors import INVALID_TOOL_CALL_FORMAT, tool_error
from envace.core.safejson import clean_text
from envace.core.toolcall import parse_tool_calls
from envace.core.types import Message, Task, ToolCall, TurnSample
from envace.core.validate import validate_call
from envace.rollout.actors import ActorTurn


@dataclass
class CallerTurn:
    """What one actor turn means for the episode: the assistant message, its training sample, and
    each call with its immediate error (None: send it to the source). ``calls`` is empty for a
    final answer; a malformed turn yields one ``(None, INVALID_TOOL_CALL_FORMAT)`` entry."""

    message: Message
    sample: TurnSample | None
    final: bool
    parse_failed: bool
    calls: list[tuple[ToolCall | None, dict | None]]


def read_caller_turn(at: ActorTurn, task: Task, group_id: str, index: int, turn: int) -> CallerTurn:
    sample = None
    if at.trainable:
        sample = TurnSample(role="caller", group_id=group_id, trajectory_index=index, turn=turn,
                            prompt_ids=at.prompt_ids, gen_ids=at.gen_ids, logprobs=at.logprobs, finish=at.finish)
    parsed = parse_tool_calls(at.text)
    # Cleaned: a lone surrogate in the model's text would break the next prompt's tokenizer.
    message = Message(role="assistant", content=clean_text(at.text).strip(), tool_calls=parsed.calls)
    if parsed.is_final:
        calls: list[tuple[ToolCall | None, dict | None]] = []
    elif parsed.error is not None:
        calls = [(None, tool_error(INVALID_TOOL_CALL_FORMAT, parsed.error))]
    else:
        calls = [(c, validate_call(c, task.tools)) for c in parsed.calls]
    return CallerTurn(message=message, sample=sample, final=parsed.is_final,
                      parse_failed=parsed.error is not None, calls=calls)
