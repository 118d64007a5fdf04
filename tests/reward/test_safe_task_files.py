"""Task files cannot stall or touch the machine: state queries are read-only and time-limited,
regex patterns that backtrack catastrophically are refused where tasks are read."""

import json
import sqlite3
import time

import pytest

from envace.core.jsonl import DataFileError, load_jsonl
from envace.core.types import Task
from envace.envs.registry import make_world


def test_state_queries_read_only_no_attach_no_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = make_world("shop", 1)
    with pytest.raises(sqlite3.DatabaseError, match="not authorized"):
        w.query("ATTACH DATABASE 'evil.db' AS evil")
    assert not (tmp_path / "evil.db").exists()
    for sql in ("DELETE FROM orders", "PRAGMA query_only = OFF", "CREATE TABLE x(a)", "DROP TABLE orders"):
        with pytest.raises(sqlite3.DatabaseError):
            w.query(sql)
    assert w.query("SELECT count(*) FROM orders")[0][0] > 0
    assert w.query("PRAGMA table_info(orders)")  # reading the schema is fine
    # the world still works for its own tools after a refused query
    assert "error" not in json.dumps(w.call("list_orders", {}))[:20]


def test_a_runaway_state_query_is_stopped():
    w = make_world("shop", 1)
    t0 = time.perf_counter()
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        w.query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
                time_limit_s=0.5)
    assert time.perf_counter() - t0 < 3


def test_a_catastrophic_pattern_is_refused_with_file_line_and_field(tmp_path):
    ok = {"id": "a", "instruction": "x", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"d": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}}}}}]}
    bad = json.loads(json.dumps(ok))
    bad["id"] = "b"
    bad["tools"][0]["function"]["parameters"]["properties"]["d"]["pattern"] = "^(a+)+$"
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ok) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataFileError, match=r"t.jsonl:2: field 'tools\[0\].function.parameters'.*\(a\+\)\+"):
        load_jsonl(path, Task)


def test_a_latin1_task_file_names_the_file(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"id": "caf\xe9", "instruction": "x"}\n'.encode("latin-1"))
    with pytest.raises(DataFileError, match="latin.jsonl:1: not UTF-8"):
        load_jsonl(path, Task)


def test_checking_a_call_never_fetches_a_schemas_remote_ref():
    """A schema from a trusted world (an MCP server's listing) may still carry a remote $ref: the
    call check answers INVALID_PARAMETERS with the reason, and nothing is fetched or read."""
    import socket
    import threading

    from envace.core.errors import error_code
    from envace.core.types import ToolCall, ToolSpec
    from envace.core.validate import validate_call

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        for ref in (f"http://127.0.0.1:{port}/schema.json", "file:///etc/passwd"):
            spec = ToolSpec.model_validate({"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"q": {"$ref": ref}}}}})
            got: list = []
            worker = threading.Thread(target=lambda: got.append(validate_call(ToolCall(name="f", arguments={"q": 1}),
                                                                              [spec])), daemon=True)
            worker.start()
            worker.join(timeout=10)  # a fetch would hang on the silent listener
            assert got, f"checking a call against {ref} did not return"
            assert error_code(got[0]) == "INVALID_PARAMETERS" and "unresolvable $ref" in got[0]["error"]["message"]
        with pytest.raises(TimeoutError):
            listener.accept()  # no connection was ever made
