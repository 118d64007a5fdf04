"""Rehearsal grounded in what the user gave: recorded calls answered as recorded, rehearsed results
checked against the tool's declared output shape, and the rehearse role scored against recorded
results (rollout.example_reward)."""

import functools
import json

import pytest

from envace.core.sampling import Generation
from envace.core.toolcall import format_tool_call
from envace.core.types import Example, FunctionSpec, Task, ToolCall, ToolSpec, Trajectory
from envace.envs.tasks import generate_tasks
from envace.rollout.actors import ActorTurn
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.rehearse import ModelSource, SimulatorSample
from envace.rollout.sources import (
    ToolRequest,
    canonical_json,
    example_for,
    example_match_score,
    output_shape_error,
)
from envace.train.advantages import compute_advantages


class ScriptedActor:
    def __init__(self, turns):
        self.turns = turns

    def act(self, views, turn):
        return [ActorTurn(text=self.turns[min(turn, len(self.turns) - 1)]) for _ in views]


class FixedTextBackend:
    """A generation backend that writes ``text`` for every prompt (with the real tokenizer), so a
    test decides what the rehearse role said; counts the prompts it was asked for."""

    def __init__(self, tokenizer, text):
        self.tokenizer, self.text, self.prompts = tokenizer, text, 0

    def generate(self, prompts, params):
        self.prompts += len(prompts)
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        return [Generation(token_ids=list(ids), logprobs=[-0.5] * len(ids), text=self.text, finish="stop")
                for _ in prompts]


@functools.lru_cache(maxsize=1)
def _task_with_example():
    """A real shop task that records at least one example, and that example."""
    for task in generate_tasks("shop", n=12, split="train"):
        if task.examples and task.examples[0].arguments:
            return task, task.examples[0]
    raise AssertionError("no shop task with an example that has arguments")


def test_a_call_matches_an_example_after_json_normalisation_only():
    task, ex = _task_with_example()
    shuffled = dict(reversed(list(ex.arguments.items())))
    assert example_for(task, ToolCall(name=ex.tool, arguments=shuffled)) is ex
    assert canonical_json({"a": 1.0, "b": [2.0, True]}) == canonical_json({"b": [2, True], "a": 1})
    assert canonical_json({"a": 1}) != canonical_json({"a": True})
    key, value = next(iter(ex.arguments.items()))
    other = {**ex.arguments, key: (value + "x") if isinstance(value, str) else "other"}
    assert example_for(task, ToolCall(name=ex.tool, arguments=other)) is None
    assert example_for(task, ToolCall(name=ex.tool + "_nope", arguments=ex.arguments)) is None


def _request(task, call, turn=0):
    return ToolRequest(task=task, call=call, earlier=[], state=None, trajectory_index=0, turn=turn)


def test_a_recorded_call_is_answered_as_recorded_and_not_when_off_or_for_other_arguments(tiny_backend):
    task, ex = _task_with_example()
    matched = ToolCall(name=ex.tool, arguments=dict(ex.arguments))
    key, value = next(iter(ex.arguments.items()))
    other = ToolCall(name=ex.tool, arguments={**ex.arguments, key: (value + "x") if isinstance(value, str) else 0})
    on = ModelSource(backend=tiny_backend, max_new_tokens=4, temperature=0.0)
    a, b = on.respond([_request(task, matched), _request(task, other)])
    assert json.loads(a.text) == ex.result and a.extra.get("as_recorded") and a.sample is None and a.rehearsed
    assert "gen_tokens" not in a.extra  # nothing was generated for it
    assert not b.extra.get("as_recorded") and b.sample is not None and "gen_tokens" in b.extra
    off = ModelSource(backend=tiny_backend, max_new_tokens=4, temperature=0.0, examples_as_recorded=False)
    (c,) = off.respond([_request(task, matched)])
    assert not c.extra.get("as_recorded") and c.sample is not None and "gen_tokens" in c.extra


def test_an_episode_sees_the_recorded_result_in_its_history(tiny_backend):
    """Through the engine: a scripted caller repeats a recorded call (keys reordered); the
    tool message it gets is the recorded result, word for word."""
    task, ex = _task_with_example()
    call = ToolCall(name=ex.tool, arguments=dict(reversed(list(ex.arguments.items()))))
    actor = ScriptedActor([format_tool_call(call), "done"])
    source = ModelSource(backend=tiny_backend, max_new_tokens=4, temperature=0.0, record_samples=False)
    [traj], _ = run_episodes([task], actor, source, RolloutConfig(max_turns=2))
    tool = [m for m in traj.messages if m.role == "tool"]
    assert len(tool) == 1 and json.loads(tool[0].content) == ex.result and tool[0].rehearsed


ORDER_SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}, "status": {"type": "string"}},
                "required": ["order_id", "status"]}


def _shaped_task():
    spec = ToolSpec.model_validate({"type": "function", "function": {"name": "get_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}},
        "outputSchema": ORDER_SCHEMA})
    return Task(id="shape-1", instruction="What is the status of order o-1?", tools=[spec])


def test_rehearsed_results_are_checked_against_the_declared_output_shape(tiny_backend):
    task = _shaped_task()
    call = ToolCall(name="get_order", arguments={"order_id": "o-1"})
    assert output_shape_error(task, call, {"order_id": "o-1", "status": "shipped"}) is None
    assert "status" in output_shape_error(task, call, {"order_id": "o-1"})
    assert output_shape_error(task, call, {"error": {"code": "NOT_FOUND", "message": "no"}}) is None
    with pytest.raises(ValueError, match=r"outputSchema\n.*not a JSON schema"):
        ToolSpec.model_validate({"function": {"name": "f"}, "outputSchema": {"type": 5}})
    no_schema = Task(id="x", instruction="x", tools=[ToolSpec(function=FunctionSpec(name="get_order"))])
    assert output_shape_error(no_schema, call, {"anything": 1}) is None

    wrong = FixedTextBackend(tiny_backend.tokenizer, '{"order": "o-1"}</execution_result>')
    (r,) = ModelSource(backend=wrong).respond([_request(task, call)])
    assert not r.format_ok and "required" in r.extra["shape_error"] and r.sample.format_ok is False
    assert json.loads(r.text) == {"order": "o-1"}  # the caller still sees what was rehearsed
    right = FixedTextBackend(tiny_backend.tokenizer, '{"order_id": "o-1", "status": "shipped"}</execution_result>')
    (r,) = ModelSource(backend=right).respond([_request(task, call)])
    assert r.format_ok and "shape_error" not in r.extra
    # Counted in the trajectory as a simulator format failure.
    [traj], _ = run_episodes([task], ScriptedActor([format_tool_call(call), "ok"]), ModelSource(backend=wrong),
                             RolloutConfig(max_turns=2))
    assert traj.sim_format_failures == 1


def test_example_match_score():
    rec = {"order_id": "o-1", "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]}
    assert example_match_score(rec, json.dumps(rec)) == 1.0
    assert example_match_score(rec, json.dumps({"items": list(reversed(rec["items"])), "order_id": "o-1"})) == 1.0
    half = example_match_score(rec, json.dumps({"order_id": "o-1"}))
    assert 0.0 < half < 1.0
    assert example_match_score(rec, json.dumps({"order_id": "o-2", "items": []})) == 0.0
    assert example_match_score(rec, "not json") == 0.0
    assert example_match_score(rec, json.dumps(rec), format_ok=False) == 0.0


def test_example_reward_scores_the_rehearse_role_against_the_recorded_result(tiny_backend):
    """rollout.example_reward: a recorded call is still generated (for a sample), the caller sees
    the recorded result, and the sample's reward is its match, centred in its own pool."""
    task = Task(id="ex-1", instruction="status of o-1?", tools=_shaped_task().tools,
                examples=[Example(tool="get_order", arguments={"order_id": "o-1"},
                                  result={"order_id": "o-1", "status": "shipped"})])
    call = ToolCall(name="get_order", arguments={"order_id": "o-1"})
    half = FixedTextBackend(tiny_backend.tokenizer, '{"order_id": "o-1", "status": "lost"}</execution_result>')
    src = ModelSource(backend=half, example_reward=True)
    (r,) = src.respond([_request(task, call)])
    assert half.prompts == 1 and r.extra["as_recorded"] and json.loads(r.text)["status"] == "shipped"
    assert isinstance(r.sample, SimulatorSample) and r.sample.example_match == pytest.approx(0.5)
    other = ToolCall(name="get_order", arguments={"order_id": "o-2"})
    (r2,) = src.respond([_request(task, other)])
    assert type(r2.sample) is not SimulatorSample  # no recorded example: the trajectory's reward

    # Advantages: the matched sample's reward is its match, pooled apart from trajectory-rewarded ones.
    exact = ModelSource(backend=FixedTextBackend(tiny_backend.tokenizer,
                                                 '{"order_id": "o-1", "status": "shipped"}</execution_result>'),
                        example_reward=True).respond([_request(task, call)])[0].sample
    plain = r2.sample
    trajs = [Trajectory(task_id="ex-1", source="rehearsal", trajectory_index=i, messages=[], reward=rw,
                        samples=[s.model_copy(update={"trajectory_index": i}), plain.model_copy(update={"trajectory_index": i})])
             for i, (s, rw) in enumerate(((r.sample, 1.0), (exact, 0.0)))]
    scored = compute_advantages(trajs)
    by = {(s.sample.trajectory_index, type(s.sample) is SimulatorSample): s for s in scored}
    assert by[(0, True)].reward == pytest.approx(0.5) and by[(1, True)].reward == pytest.approx(1.0)
    assert by[(0, True)].advantage == pytest.approx(-0.25) and by[(1, True)].advantage == pytest.approx(0.25)
    assert by[(0, False)].advantage == pytest.approx(0.5) and by[(1, False)].advantage == pytest.approx(-0.5)


def test_the_record_answers_only_until_the_episodes_first_write(tiny_backend):
    """Examples record the initial state: after a write that ran (add_to_cart answered without an
    error) the recorded call is rehearsed by the model; a write the world refused changes nothing."""
    from envace.rollout.sources import record_holds

    task, ex = _task_with_example()
    assert "add_to_cart" in task.reference.write_tools and "search_products" not in task.reference.write_tools
    read = ToolCall(name="search_products", arguments={"query": "x"})
    write = ToolCall(name="add_to_cart", arguments={"product_id": "p-1", "quantity": 1})
    assert record_holds(task, []) and record_holds(task, [(read, "[]")])
    assert not record_holds(task, [(write, '{"cart": []}')])
    assert record_holds(task, [(write, '{"error": {"code": "NOT_FOUND", "message": "no p-1"}}')])
    src = ModelSource(backend=tiny_backend, max_new_tokens=4, temperature=0.0)
    call = ToolCall(name=ex.tool, arguments=dict(ex.arguments))
    before, after = src.respond([_request(task, call),
                                 ToolRequest(task=task, call=call, earlier=[(write, '{"cart": []}')], state=None,
                                             trajectory_index=0, turn=1)])
    assert before.extra.get("as_recorded") and not after.extra.get("as_recorded") and "gen_tokens" in after.extra


def test_an_mcp_servers_output_schema_is_read_and_checked():
    """The official SDK's server declares an output schema for typed returns (wrapped as
    {"result": ...} for a list); envace unwraps it as it unwraps the result, so the real result
    fits and a rehearsed object in place of the list does not."""
    import sys
    from pathlib import Path

    from envace.core.types import EnvRef
    from envace.envs.registry import resolve_world

    server = Path(__file__).resolve().parents[2] / "examples" / "mcp_notes" / "server.py"
    provider = resolve_world(f"mcp:{sys.executable} {server}")
    try:
        tools = provider.tools()
        listing = next(t for t in tools if t.name == "list_notes")
        assert listing.output_schema is not None and listing.output_schema["type"] == "array"
        env = provider.open(EnvRef())
        try:
            real = env.call("list_notes", {})
        finally:
            provider.close_environment(env)
        task = Task(id="notes-1", instruction="list my notes", tools=tools)
        call = ToolCall(name="list_notes", arguments={})
        assert isinstance(real, list) and output_shape_error(task, call, real) is None
        assert output_shape_error(task, call, {"notes": real}) is not None
        # The schema survives the task file: dumped under output_schema, read back (MCP's name too).
        again = ToolSpec.model_validate(json.loads(listing.model_dump_json()))
        assert again.output_schema == listing.output_schema
        camel = {**listing.model_dump(exclude={"output_schema"}), "outputSchema": listing.output_schema}
        assert ToolSpec.model_validate(camel).output_schema == listing.output_schema
    finally:
        provider.shutdown()
