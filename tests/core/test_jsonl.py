import json

import pytest

from envace.core.jsonl import DataFileError, append_jsonl, load_jsonl, read_jsonl_dicts, save_jsonl
from envace.core.types import Task

TASK = {"id": "t-1", "domain": "shop", "instruction": "Do it.",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
        "checklist": [{"kind": "answer_contains", "text": "x"}]}


def test_round_trip(tmp_path):
    t = Task.model_validate(TASK)
    save_jsonl(tmp_path / "tasks.jsonl", [t, t])
    assert load_jsonl(tmp_path / "tasks.jsonl", Task) == [t, t]


def test_error_names_file_line_and_field(tmp_path):
    bad = dict(TASK, checklist=[{"kind": "bogus"}])
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(TASK) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataFileError) as e:
        load_jsonl(path, Task)
    assert e.value.line == 3 and e.value.field == "checklist[0].kind"
    assert str(path) in str(e.value)


def test_bad_json_and_missing_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "x",\n')
    with pytest.raises(DataFileError, match=r"t.jsonl:1: not valid JSON"):
        load_jsonl(path, Task)
    path.write_text(json.dumps({k: v for k, v in TASK.items() if k != "instruction"}) + "\n")
    with pytest.raises(DataFileError, match="field 'instruction'"):
        load_jsonl(path, Task)


def test_atomic_save_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "out.jsonl"
    save_jsonl(path, [{"a": 1}])

    def boom():
        yield {"a": 2}
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        save_jsonl(path, boom())
    assert read_jsonl_dicts(path) == [{"a": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_torn_tail_is_dropped(tmp_path):
    path = tmp_path / "m.jsonl"
    append_jsonl(path, [{"step": 1}, {"step": 2}])
    with path.open("a") as fh:
        fh.write('{"step": 3, "lo')
    assert read_jsonl_dicts(path) == [{"step": 1}, {"step": 2}]
