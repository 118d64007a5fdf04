"""No model output can raise, hang or execute: the hostile corpus through the parsers, the
validator, a full rollout (caller prompts tokenized, rehearsed and real responses, checklist
judging) and the run-directory writer, read back."""

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.errors import error_code
from envace.core.prompts import PromptStyle
from envace.core.safejson import clean_text
from envace.core.toolcall import parse_execution_result, parse_tool_calls
from envace.core.validate import validate_call
from envace.envs.tasks import load_tasks
from envace.experiments.rundir import RunDir
from envace.policy.loading import smollm2_tokenizer
from envace.core.sampling import Generation
from envace.rollout.actors import PolicyActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.rehearse import ModelSource
from envace.rollout.sources import RealSource

from hostile import CASES  # tests/core is on sys.path (pytest prepend import mode)

SLOW_S = 1.0


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 250


@pytest.mark.parametrize("i", range(len(CASES)))
def test_parsers_and_validation_never_raise_and_stay_fast(i):
    text = CASES[i]
    tools = load_tasks("shop", "test", limit=1)[0].tools
    t0 = time.perf_counter()
    turn = parse_tool_calls(text)
    for call in turn.calls:
        validate_call(call, tools)
        json.dumps(call.model_dump(), ensure_ascii=False).encode("utf-8")  # writable
    result = parse_execution_result(text)
    result.text.encode("utf-8")
    if result.ok:
        json.dumps(result.value).encode("utf-8")
    assert time.perf_counter() - t0 < SLOW_S


class HostileBackend:
    """Answers every prompt (caller and simulator) with the next corpus text, with the real
    tokenizer, so prompts holding earlier hostile text are really tokenized."""

    def __init__(self, texts):
        self.tokenizer = smollm2_tokenizer()
        self.texts = texts
        self.n = 0

    def generate(self, prompts, params):
        out = []
        for _ in prompts:
            text = self.texts[self.n % len(self.texts)]
            self.n += 1
            ids = self.tokenizer(clean_text(text[:2000]), add_special_tokens=False)["input_ids"][:64] or [0]
            out.append(Generation(token_ids=ids, logprobs=[-1.0] * len(ids), text=text, finish="stop"))
        return out


@pytest.mark.parametrize("source_name", ["rehearsal", "real"])
def test_a_rollout_of_hostile_turns_finishes_and_its_run_directory_reads_back(tmp_path, source_name):
    tasks = load_tasks("shop", "test", limit=len(CASES) // 2)
    backend = HostileBackend(CASES)
    style = PromptStyle(max_examples=1)
    actor = PolicyActor(backend=backend, style=style, max_prompt_tokens=10**7)
    source = RealSource() if source_name == "real" else ModelSource(backend=backend, style=style)
    t0 = time.perf_counter()
    trajs, _ = run_episodes(tasks, actor, source, RolloutConfig(group_size=2, max_turns=2))
    assert len(trajs) == 2 * len(tasks)
    assert time.perf_counter() - t0 < SLOW_S * len(trajs)
    run = RunDir.create(tmp_path, "rollout", {"corpus": len(CASES)})
    run.add_trajectories(trajs)
    back = run.trajectories()
    assert [t.task_id for t in back] == [t.task_id for t in trajs]
    assert [t.reward for t in back] == [t.reward for t in trajs]
    tool_msgs = [m for t in back for m in t.messages if m.role == "tool"]
    assert tool_msgs  # hostile calls were answered (mostly with structured errors), not dropped
    assert not Path("/tmp/envace_pwned").exists()


def test_planted_cheats_in_calls_are_rejected_as_errors():
    tools = load_tasks("bank", "test", limit=1)[0].tools
    for text in ['{"name": "get_balance", "arguments": {"account_id": NaN}}',
                 '{"name": "", "arguments": {}}',
                 '{"name": "get_balance", "arguments": {"account_id": "\\ud800"}}']:
        turn = parse_tool_calls(f"<tool_call>{text}</tool_call>")
        assert turn.error is not None and not turn.calls, text
    turn = parse_tool_calls('<tool_call>{"name": "get_balance", "arguments": {"account_id": "a", "x": 1}}</tool_call>')
    assert error_code(validate_call(turn.calls[0], tools)) == "INVALID_PARAMETERS"


@settings(max_examples=300, deadline=1000)
@given(st.text(alphabet=st.characters(codec=None, blacklist_categories=()), max_size=400))
def test_any_text_parses_without_raising(text):
    wrapped = [text, f"<tool_call>{text}</tool_call>", f"<execution_result>{text}</execution_result>",
               f'<tool_call>{{"name": "x", "arguments": {{"a": "{text}"}}}}</tool_call>']
    for t in wrapped:
        turn = parse_tool_calls(t)
        turn.content.encode("utf-8")
        for c in turn.calls:
            json.dumps(c.model_dump(), ensure_ascii=False).encode("utf-8")
        parse_execution_result(t).text.encode("utf-8")
