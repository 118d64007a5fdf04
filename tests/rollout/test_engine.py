import json

import pytest

from envace.core.errors import INVALID_PARAMETERS, INVALID_TOOL_CALL_FORMAT, TOOL_NOT_AVAILABLE, error_code
from envace.core.prompts import PromptStyle
from envace.envs.registry import world_names
from envace.envs.tasks import load_tasks
from envace.rollout.actors import ActorTurn, OracleActor, PolicyActor
from envace.rollout.diagnostics import truncated_fractions
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.rehearse import ModelSource
from envace.rollout.sources import RealSource


class ScriptedActor:
    """Writes fixed turns, in order; used to drive the engine through its error paths."""

    def __init__(self, turns):
        self.turns = turns

    def act(self, views, turn):
        return [ActorTurn(text=self.turns[min(turn, len(self.turns) - 1)]) for _ in views]


class CountingRealSource(RealSource):
    """The real source, keeping the worlds it made so a test can read what they received."""

    def __init__(self):
        self.worlds = []

    def start(self, task):
        w = super().start(task)
        self.worlds.append(w)
        return w


@pytest.mark.parametrize("world", world_names())
def test_oracle_solves_every_test_task(world):
    tasks = load_tasks(world, "test")
    assert len(tasks) >= 50
    trajs, _ = run_episodes(tasks, OracleActor(), RealSource(), RolloutConfig(max_turns=8))
    failed = {t.task_id: [v.detail for v in t.verdicts if not v.met] for t in trajs if t.reward < 1.0}
    assert failed == {}
    assert all(t.stop_reason == "final_answer" for t in trajs)
    assert all(v.met for t in trajs for v in t.verdicts)  # state items were judged too


def test_bad_calls_get_structured_errors_and_the_episode_goes_on():
    task = load_tasks("shop", "test", limit=1)[0]
    turns = [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "drop_tables", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "search_products", "arguments": {"query": 5}}</tool_call>',
        "<tool_call>{\"name\": \"search_pro",  # cut off mid-tag
        "I could not do it.",
    ]
    source = CountingRealSource()
    [traj], _ = run_episodes([task], ScriptedActor(turns), source, RolloutConfig(max_turns=6))
    tool_msgs = [json.loads(m.content) for m in traj.messages if m.role == "tool"]
    assert [error_code(r) for r in tool_msgs] == [INVALID_TOOL_CALL_FORMAT, TOOL_NOT_AVAILABLE, INVALID_PARAMETERS,
                                                 INVALID_TOOL_CALL_FORMAT]
    assert traj.parse_failures == 2 and traj.stop_reason == "final_answer"
    assert source.worlds[0].calls == []  # nothing invalid reached the world
    assert traj.reward < 1.0


def test_tiny_policy_against_real_world_records_caller_samples(tiny_backend):
    tasks = load_tasks("bank", "test", limit=2)
    actor = PolicyActor(tiny_backend, max_new_tokens=8, seed=0)
    trajs, stats = run_episodes(tasks, actor, RealSource(), RolloutConfig(group_size=3, max_turns=2))
    assert [(t.task_id, t.trajectory_index) for t in trajs] == [(x.id, g) for x in tasks for g in range(3)]
    for t in trajs:
        assert t.samples and all(s.role == "caller" and s.group_id == t.task_id for s in t.samples)
        for s in t.samples:
            assert len(s.logprobs) == len(s.gen_ids) <= 8 and s.prompt_ids
            assert all(lp <= 0 for lp in s.logprobs)
        assert t.stop_reason in ("final_answer", "max_turns")
        assert 0.0 <= t.reward <= 1.0 and t.verdicts
    assert stats.caller_tokens == sum(len(s.gen_ids) for t in trajs for s in t.samples)


@pytest.mark.parametrize("record", [True, False], ids=["rehearsal", "simulator"])
def test_model_source_answers_calls_without_a_world(tiny_backend, record):
    tasks = load_tasks("shop", "train", limit=2)
    name = "rehearsal" if record else "simulator"
    # every call generated: the oracle's reads are often recorded examples, answered as recorded by default
    source = ModelSource(tiny_backend, name=name, record_samples=record, max_new_tokens=6, seed=1,
                         examples_as_recorded=False)
    trajs, stats = run_episodes(tasks, OracleActor(), source, RolloutConfig(group_size=2, max_turns=3))
    for t, task in zip(trajs, [x for x in tasks for _ in range(2)]):
        n_calls = min(3, len(task.reference.calls))
        tool_msgs = [m for m in t.messages if m.role == "tool"]
        assert len(tool_msgs) == n_calls and all(m.rehearsed for m in tool_msgs)
        sim = [s for s in t.samples if s.role == "simulator"]
        assert len(sim) == (n_calls if record else 0)
        assert all(s.turn == i for i, s in enumerate(sim))
        # state items cannot be judged without a real world
        assert all(v.met is None for v in t.verdicts if v.item.kind == "state")
    assert (stats.simulator_tokens > 0) == record
    sim = [s for t in trajs for s in t.samples if s.role == "simulator"]
    if record:  # an untrained model rarely closes its JSON within 6 tokens
        cut = sum(len(s.gen_ids) == 6 and s.finish == "length" for s in sim)
        assert cut > 0 and truncated_fractions(trajs) == {"truncated/simulator": cut / len(sim)}
    else:
        assert truncated_fractions(trajs) == {}


def test_context_limit_stops_the_episode(tiny_backend):
    task = load_tasks("calendar", "test", limit=1)[0]
    actor = PolicyActor(tiny_backend, max_new_tokens=4, max_prompt_tokens=20)
    [traj], _ = run_episodes([task], actor, RealSource(), RolloutConfig(max_turns=3))
    assert traj.stop_reason == "context_limit" and traj.samples == []


def test_json_tool_format_renders_schemas(tiny_backend):
    task = load_tasks("shop", "test", limit=1)[0]
    from envace.core.prompts import render_caller_prompt

    tok = tiny_backend.tokenizer
    compact = tok.decode(render_caller_prompt(tok, task, [], PromptStyle()))
    full = tok.decode(render_caller_prompt(tok, task, [], PromptStyle(tool_format="json")))
    assert task.instruction in compact and '"parameters"' in full and '"parameters"' not in compact
    assert all(t.name in compact for t in task.tools)


def test_cut_off_turns_are_counted_per_role_and_short_ones_never_count_as_loops(tiny_backend):
    from envace.rollout.diagnostics import ends_in_loop, truncation_counts

    tasks = load_tasks("shop", "train", limit=2)
    source = ModelSource(tiny_backend, name="rehearsal", max_new_tokens=6, temperature=0.0)
    trajs, _ = run_episodes(tasks, OracleActor(), source, RolloutConfig(group_size=1, max_turns=2))
    c = truncation_counts(trajs)["simulator"]
    sim = [s for t in trajs for s in t.samples]
    assert c.turns == len(sim) and c.cut == sum(s.finish == "length" for s in sim) > 0
    assert c.looped == 0 and not any(ends_in_loop(s.gen_ids) for s in sim)


def test_ends_in_loop():
    from envace.rollout.diagnostics import ends_in_loop

    varied = list(range(100))
    assert not ends_in_loop(varied)
    assert ends_in_loop(varied[:40] + [7, 8, 9] * 20)
    assert not ends_in_loop([7, 8, 9] * 10, span=24)  # 30 tokens: too short to tell
    assert ends_in_loop([1, 2] * 4, span=2) and not ends_in_loop([1, 2, 3, 4, 5], span=2)


def test_progress_after_every_turn_counts_finished_episodes():
    tasks = load_tasks("shop", "test")[:5]
    seen = []
    trajs, _ = run_episodes(tasks, OracleActor(), RealSource(), RolloutConfig(group_size=2, max_turns=8),
                            on_turn=lambda turn, done, total: seen.append((turn, done, total)))
    assert [t for t, _, _ in seen] == list(range(1, len(seen) + 1))
    assert all(total == 10 for _, _, total in seen)
    finished = [d for _, d, _ in seen]
    assert finished == sorted(finished) and finished[-1] == 10 and finished[0] < 10
    assert len(seen) == max(len([m for m in t.messages if m.role == "assistant"]) for t in trajs)


def test_the_conversation_context_shows_the_simulator_the_request_and_every_tool(tiny_backend):
    from envace.core.prompts import render_simulator_prompt
    from envace.core.types import ToolCall

    task = load_tasks("shop", "test")[0]
    call = ToolCall(name=task.tools[0].name, arguments={})
    tok = tiny_backend.tokenizer
    plain = tok.decode(render_simulator_prompt(tok, task, call, [], PromptStyle()))
    wide = tok.decode(render_simulator_prompt(tok, task, call, [], PromptStyle(simulator_context="conversation")))
    assert task.instruction not in plain and task.instruction in wide
    others = [t.name for t in task.tools[1:]]
    assert others and all(f"{name}(" in wide for name in others)
    assert wide.endswith(plain[plain.index("Tool: "):])  # the call-only context follows unchanged
