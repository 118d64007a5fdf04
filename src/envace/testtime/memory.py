"""Rehearsal memory: a few lines condensed from the imagined attempts of one task.

Two writers with one interface (``write(items) -> list[Memory]``, batched over tasks):

* :class:`RuleMemoryWriter` — deterministic: the calls that failed and their error codes, the
  calls (and arguments) that worked with the key fields of their imagined results, and the final
  answer reached. Used directly (``--memory rule``) and as the fallback of the model writer.
* :class:`ModelMemoryWriter` — the policy itself, under a summary prompt, writes the memory from
  compact transcripts of its attempts (greedy). A summary that is empty or garbage (too short,
  tags, repetition, nothing about the task) is replaced by the rule-based memory, and the
  Memory records why.

Only what the agent could know goes in: its own transcripts. The checklist, the verdicts and the
imagined reward of an attempt are never used (at test time the agent does not see them).
"""

from __future__ import annotations

from envace.core import safejson

import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from envace.core.errors import error_code, is_error
from envace.core.types import Message, Task, ToolCall, Trajectory
from envace.core.sampling import SamplingParams
from envace.testtime.fields import field_summary

MemorySourceName = Literal["none", "rule", "model"]

SUMMARY_SYSTEM = (
    "You privately rehearsed a task several times before doing it for real. The tool results in "
    "the rehearsals were imagined. Write a short memory for your real attempt, at most 5 lines: "
    "which tool calls failed and why (their error codes), which tool calls and arguments worked, "
    "and the answer you reached. Plain text only, no tool calls."
)


@dataclass
class Memory:
    text: str
    source: MemorySourceName
    tokens: int = 0  # tokens the summary model generated (0 for rule and none)
    seconds: float = 0.0
    note: str = ""  # why the model's summary was replaced by the rule-based one
    raw: str = ""  # the model's summary as written, also when rejected


NO_MEMORY = Memory(text="", source="none")


class MemoryWriter(Protocol):
    def write(self, items: list[tuple[Task, list[Trajectory]]]) -> list[Memory]:
        """One memory per (task, its rehearsed attempts); no attempts gives an empty memory."""


def _load(text: str) -> Any:
    return safejson.loads(text)[0] if isinstance(text, str) else None


def episode_steps(traj: Trajectory) -> list[tuple[ToolCall | None, Message]]:
    """Each tool message with the call it answered; None for a turn whose call did not parse.

    Unlike :func:`envace.core.types.trajectory_calls` this keeps malformed-call turns, which the
    engine answers with an INVALID_TOOL_CALL_FORMAT error and which a memory should warn about.
    """
    out: list[tuple[ToolCall | None, Message]] = []
    msgs = traj.messages
    for i, m in enumerate(msgs):
        if m.role != "assistant":
            continue
        j = i + 1
        answers: list[Message] = []
        while j < len(msgs) and msgs[j].role == "tool":
            answers.append(msgs[j])
            j += 1
        if m.tool_calls:
            out.extend(zip(m.tool_calls, answers))
        else:
            out.extend((None, a) for a in answers)
    return out


def _call_text(call: ToolCall, max_chars: int = 120) -> str:
    args = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)
    if len(args) > max_chars:
        args = args[: max_chars - 3] + "..."
    return f"{call.name} {args}"


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _error_text(value: Any) -> str:
    err = value["error"]
    msg = err.get("message", "")
    return f"{err['code']}" + (f" ({_clip(str(msg), 80)})" if msg else "")


def rule_memory(attempts: list[Trajectory], max_chars: int = 600) -> str:
    """The deterministic memory of ``attempts`` (see the module docstring); '' when none."""
    if not attempts:
        return ""
    failed: dict[str, int] = {}
    worked: dict[str, int] = {}
    worked_fields: dict[str, str] = {}
    order: list[str] = []
    for traj in attempts:
        for call, answer in episode_steps(traj):
            value = _load(answer.content)
            if call is None:
                key = "(malformed tool call) -> " + (_error_text(value) if is_error(value) else "INVALID_TOOL_CALL_FORMAT")
                failed[key] = failed.get(key, 0) + 1
            elif is_error(value):
                key = f"{_call_text(call)} -> {_error_text(value)}"
                failed[key] = failed.get(key, 0) + 1
            elif value is None:
                key = f"{_call_text(call)} -> unreadable result"
                failed[key] = failed.get(key, 0) + 1
            else:
                key = _call_text(call)
                worked[key] = worked.get(key, 0) + 1
                worked_fields.setdefault(key, field_summary(value))
            if key not in order:
                order.append(key)
    # Latest attempt first, so that a tie goes to the latest answer (a sequential revision).
    answers = Counter(_clip(t.final_answer, 160) for t in reversed(attempts)
                      if t.stop_reason == "final_answer" and t.final_answer.strip())
    n = len(attempts)

    def counted(key: str, c: int) -> str:
        return f"- {key}" + (f" ({c}x)" if c > 1 else "")

    head = [f"{n} imagined attempt{'s' if n > 1 else ''}."]
    fail_lines = [counted(k, failed[k]) for k in order if k in failed]
    work_lines = []
    for k in order:
        if k in worked:
            extra = worked_fields.get(k, "")
            work_lines.append(counted(k + (f" -> {extra}" if extra else ""), worked[k]))
    if answers:
        best, count = answers.most_common(1)[0]
        answer_line = [f'Answer reached ({count}/{n}): "{best}"']
    else:
        answer_line = ["No attempt reached a final answer."]
    # Budget the characters: what failed first (what to avoid), then the answer, then what worked.
    sections = [("Failed calls:", fail_lines), ("Calls that worked:", work_lines)]
    lines = head + answer_line
    used = sum(len(x) + 1 for x in lines)
    kept: dict[str, list[str]] = {}
    for title, body in sections:
        kept[title] = []
        for line in body:
            cost = len(line) + 1 + (len(title) + 1 if not kept[title] else 0)
            if used + cost > max_chars:
                break
            kept[title].append(line)
            used += cost
    out = head[:]
    if not order:  # the agent knows it never acted: worth saying, since the task needs tools
        out.append("No tool was called in any attempt.")
    for title, _ in sections:
        if kept[title]:
            out += [title, *kept[title]]
    out += answer_line
    return "\n".join(out)[:max_chars]


PLAN_HEADER = "Plan from your rehearsal (its tool results were imagined: use the real ones):"


def _working_calls(traj: Trajectory) -> tuple[list[ToolCall], int]:
    """The calls whose (imagined) result was readable and not an error, in order, and how many
    other steps the attempt had (malformed calls, errors, unreadable results)."""
    worked: list[ToolCall] = []
    failed = 0
    for call, answer in episode_steps(traj):
        value = _load(answer.content)
        if call is None or value is None or is_error(value):
            failed += 1
        else:
            worked.append(call)
    return worked, failed


def _attempt_rank(traj: Trajectory) -> tuple[int, int, int]:
    """What the agent can see of an attempt's quality: it reached an answer, few of its calls
    failed, many worked. Never the reward or the checklist."""
    worked, failed = _working_calls(traj)
    return (int(traj.stop_reason == "final_answer" and bool(traj.final_answer.strip())), -failed, len(worked))


def plan_memory(attempts: list[Trajectory], max_chars: int = 600) -> str:
    """The calls that worked in the best-looking attempt, in order, and nothing else: no failed
    call (a small model copies what it is shown, failures included) and no imagined value or
    answer (a world model's ids and figures are guesses). '' when no attempt has such a call."""
    if not attempts:
        return ""
    # max() keeps the first of equals: reversed, so a tie goes to the latest attempt.
    best = max(reversed(attempts), key=_attempt_rank)
    steps = [_call_text(call) for call in _working_calls(best)[0]]
    if not steps:
        return ""
    lines = [PLAN_HEADER]
    for i, step in enumerate(steps, 1):
        line = f"{i}. {step}"
        if sum(len(x) + 1 for x in lines) + len(line) > max_chars:
            break
        lines.append(line)
    return "\n".join(lines) if len(lines) > 1 else ""


MEMORY_STYLES = ("rule", "plan")


@dataclass
class RuleMemoryWriter:
    """``style`` rule: :func:`rule_memory` (what failed, what worked with its key fields, the
    answer reached); plan: :func:`plan_memory` (only the calls of the best-looking attempt)."""

    max_chars: int = 600
    style: str = "rule"

    def __post_init__(self) -> None:
        if self.style not in MEMORY_STYLES:
            raise ValueError(f"unknown rule memory style {self.style!r}; choose one of {', '.join(MEMORY_STYLES)}")

    def write(self, items: list[tuple[Task, list[Trajectory]]]) -> list[Memory]:
        condense = rule_memory if self.style == "rule" else plan_memory
        return [Memory(text=condense(attempts, self.max_chars), source="rule") if attempts else NO_MEMORY
                for _, attempts in items]


def transcript(attempts: list[Trajectory], max_chars: int = 2000) -> str:
    """Compact transcripts of the attempts, for the summary prompt."""
    lines: list[str] = []
    for k, traj in enumerate(attempts, start=1):
        lines.append(f"Attempt {k}:")
        for call, answer in episode_steps(traj):
            shown = _call_text(call, 100) if call is not None else "(malformed tool call)"
            lines.append(f"  {shown} -> {_clip(answer.content, 140)}")
        if traj.stop_reason == "final_answer":
            lines.append(f"  answer: {_clip(traj.final_answer, 160)}")
        else:
            lines.append(f"  (stopped: {traj.stop_reason})")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 4] + " ..."


_TAG = re.compile(r"</?(tool_call|execution_result|\|im_start\||\|im_end\|)", re.IGNORECASE)
_ID = re.compile(r"\b[a-z]{1,4}-\d{2,}\b")


def summary_problem(text: str, task: Task, attempts: list[Trajectory]) -> str | None:
    """Why a model-written summary is unusable, or None when it can be used."""
    s = text.strip()
    if not s:
        return "empty summary"
    if len(s) < 20:
        return "summary too short"
    if _TAG.search(s):
        return "summary contains tool or chat tags"
    printable = sum(ch.isprintable() or ch in "\n\t" for ch in s) / len(s)
    if printable < 0.95:
        return "summary has unprintable characters"
    words = re.findall(r"\w+", s.lower())
    if len(words) < 4:
        return "summary has too few words"
    if len(words) >= 12 and len(set(words)) / len(words) < 0.3:
        return "summary repeats itself"
    mentioned = {t.name.lower() for t in task.tools} | {"error", "failed", "answer", "worked"}
    seen_ids = {m for traj in attempts for msg in traj.messages for m in _ID.findall(msg.content)}
    codes = {error_code(_load(m.content)) for traj in attempts for m in traj.messages if m.role == "tool"}
    mentioned |= {c.lower() for c in codes if c} | seen_ids
    low = s.lower()
    if not any(term in low for term in mentioned):
        return "summary mentions no tool, id, error or answer of the rehearsals"
    return None


def _encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def summary_prompt(tokenizer: Any, task: Task, attempts: list[Trajectory], max_transcript_chars: int = 2000
                   ) -> list[int]:
    user = (f"Task: {task.instruction}\nTools: {', '.join(t.name for t in task.tools)}\n\n"
            f"Rehearsals:\n{transcript(attempts, max_transcript_chars)}\n\nMemory for the real attempt:")
    return _encode_chat(tokenizer, [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}])


@dataclass
class ModelMemoryWriter:
    """The policy writes its own memory (greedy); garbage falls back to :func:`rule_memory`."""

    backend: Any
    max_new_tokens: int = 96
    max_chars: int = 600
    max_transcript_chars: int = 2000
    fallback: RuleMemoryWriter = field(default_factory=RuleMemoryWriter)

    def write(self, items: list[tuple[Task, list[Trajectory]]]) -> list[Memory]:
        out: list[Memory] = [NO_MEMORY] * len(items)
        todo = [i for i, (_, attempts) in enumerate(items) if attempts]
        if not todo:
            return out
        tok = self.backend.tokenizer
        prompts = [summary_prompt(tok, items[i][0], items[i][1], self.max_transcript_chars) for i in todo]
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)
        t0 = time.perf_counter()
        gens = self.backend.generate(prompts, params)
        per = (time.perf_counter() - t0) / len(todo)
        fallbacks = self.fallback.write([items[i] for i in todo])
        for i, g, fb in zip(todo, gens, fallbacks):
            task, attempts = items[i]
            raw = g.text.strip()
            problem = summary_problem(raw, task, attempts)
            if problem is None:
                out[i] = Memory(text=raw[: self.max_chars], source="model", tokens=len(g.token_ids), seconds=per,
                                raw=raw)
            else:
                out[i] = Memory(text=fb.text, source="rule", tokens=len(g.token_ids), seconds=per,
                                note=f"model summary rejected: {problem}", raw=raw)
        return out


MEMORY_KINDS = ("model", "rule", "plan")


def make_memory_writer(kind: str, backend: Any = None, max_new_tokens: int = 96, max_chars: int = 600) -> MemoryWriter:
    if kind in ("rule", "plan"):
        return RuleMemoryWriter(max_chars=max_chars, style=kind)
    if kind == "model":
        if backend is None:
            raise ValueError("memory 'model' needs a backend to write the summary")
        return ModelMemoryWriter(backend, max_new_tokens=max_new_tokens, max_chars=max_chars,
                                 fallback=RuleMemoryWriter(max_chars=max_chars))
    raise ValueError(f"unknown memory kind {kind!r}; choose one of {', '.join(MEMORY_KINDS)}")
