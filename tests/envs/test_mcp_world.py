"""MCP servers as real environments: a real stdio server started by the test (no protocol mocks)."""

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from envace.core.errors import error_code
from envace.core.types import EnvRef, Task
from envace.envs.mcp_world import MCPSpec
from envace.envs.provider import ENVIRONMENT_ERROR, TOOL_EXECUTION_ERROR
from envace.envs.registry import resolve_world
from envace.rollout.actors import OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

SERVER = Path(__file__).parent / "fixtures" / "faulty_mcp_server.py"


def spec(tmp_path, *extra, **over) -> MCPSpec:
    return MCPSpec(command=[sys.executable, str(SERVER), *extra], reset_tool="reset",
                   stderr=str(tmp_path / "server.log"), **{"timeout_s": 3, "startup_timeout_s": 20, **over})


@pytest.fixture
def world(tmp_path):
    w = resolve_world(spec(tmp_path))
    yield w
    w.shutdown()


def test_tools_are_listed_from_the_server_without_the_reset_tool(world):
    tools = {t.name: t for t in world.tools()}
    assert set(tools) == {"echo", "bump", "hang", "crash", "fail", "big"}
    assert tools["echo"].function.parameters["required"] == ["text"]
    assert "Echo" in tools["echo"].function.description


def test_calls_answer_and_bad_calls_are_structured_errors(world):
    env = world.open(EnvRef(args={"seed": 7}))
    try:
        assert env.call("echo", {"text": "hi"}) == {"text": "hi", "seed": 7}  # the reset tool got env.args
        assert error_code(env.call("echo", {})) == "INVALID_PARAMETERS"  # checked before the server
        assert error_code(env.call("nope", {})) == "TOOL_NOT_AVAILABLE"
        failed = env.call("fail", {"why": "disk full"})
        # the SDK hides an unexpected exception's text; the code and the tool are what the caller learns
        assert error_code(failed) == TOOL_EXECUTION_ERROR and "fail" in failed["error"]["message"]
        assert env.call("bump", {}) == 1  # the session survives a failing tool
        assert [c.name for c, _ in env.calls] == ["echo", "echo", "nope", "fail", "bump"]
    finally:
        env.close()


def test_each_episode_gets_a_fresh_session(world):
    first = world.open(EnvRef())
    assert [first.call("bump", {}) for _ in range(3)] == [1, 2, 3]
    first.close()
    second = world.open(EnvRef())
    try:
        assert second.call("bump", {}) == 1
    finally:
        second.close()


def test_a_hanging_tool_times_out_and_the_episode_goes_on(world):
    env = world.open(EnvRef())
    try:
        t0 = time.perf_counter()
        hung = env.call("hang", {})
        assert error_code(hung) == ENVIRONMENT_ERROR and time.perf_counter() - t0 < 15
        assert env.call("echo", {"text": "still here"})["text"] == "still here"
    finally:
        env.close()


def test_a_server_that_crashes_mid_episode_answers_errors_from_then_on(world):
    env = world.open(EnvRef())
    try:
        assert env.call("bump", {}) == 1
        assert error_code(env.call("crash", {})) == ENVIRONMENT_ERROR
        assert error_code(env.call("echo", {"text": "x"})) == ENVIRONMENT_ERROR
    finally:
        env.close()
    fresh = world.open(EnvRef())  # the next episode starts a new server
    try:
        assert fresh.call("bump", {}) == 1
    finally:
        fresh.close()


def test_a_server_that_never_opens_a_session_is_an_error_not_a_hang(tmp_path):
    listing = resolve_world(spec(tmp_path))
    tools = listing.tools()
    listing.shutdown()
    stuck = resolve_world(spec(tmp_path, "--hang-on-start", startup_timeout_s=2))
    stuck._tools = tools  # its listing would hang too; the episode's session is what is tested
    env = stuck.open(EnvRef())
    try:
        t0 = time.perf_counter()
        assert error_code(env.call("echo", {"text": "x"})) == ENVIRONMENT_ERROR
        assert time.perf_counter() - t0 < 15
    finally:
        env.close()
        stuck.shutdown()
    with pytest.raises(ValueError, match="did not list its tools"):
        resolve_world(spec(tmp_path, "--hang-on-start", startup_timeout_s=2, timeout_s=1)).tools()


def test_episodes_against_the_server_record_errors_and_finish(tmp_path, world):
    """The engine's real source over MCP: a crash in one episode leaves the others whole."""
    from envace.core.types import Reference, ToolCall

    tools = world.tools()
    tasks = [Task(id="ok", instruction="echo", tools=tools, env=EnvRef(args={"seed": 1}),
                  checklist=[{"kind": "called", "tool": "echo", "args": {"text": "a"}}],
                  reference=Reference(calls=[ToolCall(name="echo", arguments={"text": "a"})], answer="a")),
             Task(id="crashing", instruction="crash", tools=tools, env=EnvRef(),
                  checklist=[{"kind": "answer_contains", "text": "done"}],
                  reference=Reference(calls=[ToolCall(name="crash"), ToolCall(name="echo", arguments={"text": "b"})],
                                      answer="done"))]
    source = RealSource(spec(tmp_path))
    try:
        trajs, _ = run_episodes(tasks, OracleActor(), source, RolloutConfig(max_turns=4))
    finally:
        source.close()
    ok, crashed = trajs
    assert ok.reward == 1.0 and '"seed": 1' in ok.messages[2].content
    tool_msgs = [m.content for m in crashed.messages if m.role == "tool"]
    assert len(tool_msgs) == 2 and all(ENVIRONMENT_ERROR in m for m in tool_msgs)
    assert crashed.stop_reason == "final_answer"  # the episode finished; what a crash costs is the reward's call
    from envace.experiments.rundir import RunDir

    run = RunDir.create(tmp_path / "runs", "rollout", {"world": "faulty"})
    run.add_trajectories(trajs)
    assert [t.model_dump() for t in run.trajectories()] == [t.model_dump() for t in trajs]


def test_mcp_specs_parse_from_strings():
    assert MCPSpec.parse("mcp:python server.py --port 3").command == ["python", "server.py", "--port", "3"]
    assert MCPSpec.parse("http://127.0.0.1:8000/mcp").url == "http://127.0.0.1:8000/mcp"
    with pytest.raises(ValueError, match="exactly one"):
        MCPSpec(command=["x"], url="http://y")


def test_a_streamable_http_server_gives_each_episode_its_own_session(tmp_path):
    """The notes example served over HTTP (started by the test): concurrent episodes, each reset
    to its own seed, never see each other's writes."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Path(__file__).resolve().parents[2] / "examples" / "mcp_notes" / "server.py"
    proc = subprocess.Popen([sys.executable, str(server), "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        world = None
        for _ in range(60):  # wait for it to listen
            try:
                world = resolve_world(MCPSpec(url=f"http://127.0.0.1:{port}/mcp", reset_tool="reset",
                                              timeout_s=5, startup_timeout_s=5))
                world.tools()
                break
            except ValueError:
                world.shutdown() if world else None
                time.sleep(0.5)
        a, b = world.open(EnvRef(args={"seed": 1})), world.open(EnvRef(args={"seed": 2}))
        fa, fb = a.submit("create_note", {"title": "x", "body": "y"}), b.submit("create_note", {"title": "x", "body": "y"})
        assert fa.result(timeout=30)["id"] == "n114" and fb.result(timeout=30)["id"] == "n124"
        assert len(a.call("list_notes", {})) == 5 and len(b.call("list_notes", {})) == 5
        a.close(), b.close()
        world.shutdown()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_tool_annotations_are_kept_beside_the_function(world):
    tools = {t.name: t.model_dump(mode="json") for t in world.tools()}
    assert tools["echo"]["annotations"] == {"readOnlyHint": True}
    assert tools["bump"]["annotations"] == {"readOnlyHint": False, "destructiveHint": False}
    assert "annotations" not in tools["hang"]  # unknown: judged as a write, and absent from the prompt
    # a task file may carry them: validation of the task accepts the key
    Task.model_validate({"id": "a", "instruction": "x", "tools": [tools["echo"]]})


def test_a_huge_result_is_cut_with_a_marker_and_a_warning_that_says_what_to_do(tmp_path):
    from envace.envs.provider import ToolResultWarning

    w = resolve_world(spec(tmp_path, max_result_chars=500))
    env = w.open(EnvRef())
    try:
        with pytest.warns(ToolResultWarning, match="Make the tool return less.*max_result_chars") as got:
            value = env.call("big", {})
            env.call("big", {})
        assert len(got) == 1  # once per tool
        assert isinstance(value, str) and value.startswith("y" * 500) and not value.startswith("y" * 501)
        assert value.endswith("[envace: result truncated: 500 of 20000 characters shown]")
        assert "token" not in str(got[0].message)
    finally:
        env.close()
        w.shutdown()


def test_a_server_that_dies_before_the_handshake_is_reported_with_exit_code_and_stderr(tmp_path):
    w = resolve_world(MCPSpec(command=[sys.executable, str(SERVER), "--die-on-start"], timeout_s=3,
                              startup_timeout_s=20))
    with pytest.raises(ValueError) as e:
        w.tools()
    message = str(e.value)
    assert "exited with code 7" in message and "cannot open the database notes.db" in message
    assert "\n" not in message  # one line
    w._tools = []  # an episode's session reports the same
    env = w.open(EnvRef())
    try:
        from envace.envs.mcp_world import wait

        answer = wait(_call_unchecked(env, "echo", {"text": "x"}), w.spec_model)
        assert error_code(answer) == ENVIRONMENT_ERROR
        assert "exited with code 7" in answer["error"]["message"]
        assert "cannot open the database" in answer["error"]["message"]
    finally:
        env.close()
        w.shutdown()


def _call_unchecked(env, name, arguments):
    """A call past the listing check, straight to a session (the server's listing failed)."""
    from envace.envs.mcp_world import _Session

    env.session = _Session(env.world, env.env)
    return env.session.call(name, arguments)


def test_without_a_reset_tool_env_args_are_refused_where_checked_and_warned_at_run_time(tmp_path):
    w = resolve_world(MCPSpec(command=[sys.executable, str(SERVER), "--no-reset"], timeout_s=3,
                              startup_timeout_s=20))
    try:
        assert "reset" not in {t.name for t in w.tools()}
        assert "no reset tool" in w.args_ignored()
        env = w.open(EnvRef(args={"seed": 3}))
        try:
            with pytest.warns(RuntimeWarning, match="env.args.*reach nothing"):
                assert env.call("echo", {"text": "a"})["seed"] is None
        finally:
            env.close()
    finally:
        w.shutdown()
    # tasks validate / a run's loading with this world refuse such tasks, saying why
    from envace.experiments.task_check import validate_task_file

    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "instruction": "x", "env": {"args": {"seed": 3}}}\n'
                    '{"id": "b", "instruction": "x"}\n')
    _, problems = validate_task_file(path, world=f"mcp:{sys.executable} {SERVER} --no-reset")
    assert [(p.line, p.field) for p in problems] == [(1, "env.args")]
    assert "has no reset tool" in problems[0].message


def test_a_reset_tool_is_found_by_name_and_never_offered_to_the_agent(tmp_path):
    w = resolve_world(f"mcp:{sys.executable} {SERVER}")  # no reset_tool setting
    try:
        assert "reset" not in {t.name for t in w.tools()}
        assert w.reset_tool == "reset" and w.args_ignored() is None
        env = w.open(EnvRef(args={"seed": 9}))
        try:
            assert env.call("echo", {"text": "a"}) == {"text": "a", "seed": 9}
        finally:
            env.close()
    finally:
        w.shutdown()
