"""The worked examples' schema-only variants warm-start as their real-world runs do: each task file
records every reference call's real result (make_tasks.py replays the references in the real
tools), so with ``world: null`` the train job's warm-start functions replay every train task's
reference from those results, and the samples they render are the ones the real class gives.
Real objects: the example's config and task file, its Python class, the tiny model's tokenizer."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from envace.core.types import Task
from envace.experiments.config import load_config
from envace.experiments.tasksets import train_tasks
from envace.experiments.train_job import sft_tasks, warm_start_data
from envace.policy.loading import load_model
from envace.rollout.sources import dump_result
from envace.train.sft import why_not_replayable

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "examples" / "python_library"
HELPDESK = ROOT / "examples" / "helpdesk"


@pytest.fixture(scope="module")
def tok():
    return load_model("tiny")[1]


def _config(config: Path, *over: str):
    return load_config(config, ["model=tiny", *over])


def _data_line(cfg, tok) -> tuple[str, object, list[Task]]:
    """The warm start's data and its log line, composed as train_job.warm_start composes them."""
    pool = train_tasks(cfg)
    data = warm_start_data(cfg, sft_tasks(cfg, pool), tok, pool)
    data.skipped = Counter(why for t in pool if (why := why_not_replayable(t, cfg.world)) is not None)
    return f"warm start data: {data.describe()}", data, pool


def _callers(data) -> list[tuple[list[int], list[int]]]:
    return [(s.prompt_ids, s.gen_ids) for s in data.samples if s.role == "caller"]


def test_every_reference_call_in_the_example_files_records_its_result():
    for path in (LIBRARY / "tasks.jsonl", HELPDESK / "tasks.jsonl", HELPDESK / "tasks_portable.jsonl",
                 ROOT / "examples" / "mcp_notes" / "tasks.jsonl"):
        tasks = [Task.model_validate_json(line) for line in path.read_text().splitlines()]
        assert tasks and all(t.reference is not None and t.reference.calls for t in tasks), path
        assert all(c.result is not None for t in tasks for c in t.reference.calls), path


def test_the_library_schema_only_run_warm_starts_from_every_train_reference_as_the_class_does(tok, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config names its files from the repository root
    cfg = _config(LIBRARY / "config.yaml", "world=null")
    assert cfg.world is None
    line, data, pool = _data_line(cfg, tok)
    n = sum(t.reference is not None for t in pool)
    assert n == len(pool) >= 20  # every train task has a reference, and all are replayed (sft.trajectories: 40)
    assert f"{n} caller samples from {n} reference replays (0 in a real world, {n} from recorded results)" in line
    assert "tasks skipped" not in line and "dropped" not in line
    assert len(_callers(data)) == n and data.from_records == n
    # The same tasks replayed in the real class give the very same caller samples, token for token;
    # one of each of the four templates (a count, a loan, an author's books, a member id).
    real_cfg = _config(LIBRARY / "config.yaml")
    assert real_cfg.world is not None
    ordered = sorted(pool, key=lambda t: t.id)  # make_tasks.py: task i uses template i % 4
    four = [next(t for t in ordered if int(t.id.split("-")[1]) % 4 == k) for k in range(4)]
    world = warm_start_data(real_cfg, four, tok)
    recorded = warm_start_data(cfg, four, tok)
    assert (world.in_world, world.from_records) == (4, 0) and (recorded.in_world, recorded.from_records) == (0, 4)
    assert _callers(world) == _callers(recorded)
    assert [(s.prompt_ids, s.gen_ids) for s in world.samples] == [(s.prompt_ids, s.gen_ids) for s in recorded.samples]
    # and what they render holds the recorded results as the tool messages, then the answer
    for task, (prompt, gen) in zip(four, _callers(recorded)):
        whole = tok.decode(prompt + gen)
        assert all(dump_result(c.result) in whole for c in task.reference.calls), task.id
        assert task.reference.answer in whole


def test_the_helpdesk_portable_file_warm_starts_from_every_train_reference_with_no_world(tok, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = _config(HELPDESK / "config.yaml", f"task_file={HELPDESK / 'tasks_portable.jsonl'}", "world=null")
    line, data, pool = _data_line(cfg, tok)
    n = sum(t.reference is not None for t in pool)
    k = len(sft_tasks(cfg, pool))
    assert n == len(pool) >= 40 and k == min(cfg.sft.trajectories, n)
    assert f"{k} caller samples from {k} reference replays (0 in a real world, {k} from recorded results)" in line
    assert "tasks skipped" not in line and "dropped" not in line
    # a write's recorded result is the class's own: the new ticket's id the reference answer names
    created = [t for t in pool if t.reference.calls[-1].name == "create_ticket"]
    assert created and all(t.reference.calls[-1].result["id"] in t.reference.answer for t in created)
    assert all(json.loads(dump_result(c.result)) == c.result for t in pool for c in t.reference.calls)
