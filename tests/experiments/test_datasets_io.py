"""Tasks and trajectories as Hugging Face datasets: exported, read back by `datasets`, and a task
dataset trains like the JSONL it came from."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envace.cli.main import main
from envace.core.jsonl import load_jsonl
from envace.core.types import Task
from envace.experiments.tasks import select_tasks

datasets = pytest.importorskip("datasets")


def test_tasks_round_trip_through_a_dataset(tmp_path, capsys):
    src = tmp_path / "tasks.jsonl"
    tasks = select_tasks("shop", "all", 12, tool_distractors=1, tasks_per_world=60)
    src.write_text("".join(t.model_dump_json(exclude_none=True) + "\n" for t in tasks))
    out = tmp_path / "ds"
    assert main(["export", "tasks", str(src), "--to", str(out)]) == 0
    ds = datasets.load_dataset(str(out))["train"]
    assert len(ds) == 12 and ds[0]["id"] == tasks[0].id and json.loads(ds[0]["tools"])[0]["type"] == "function"
    # --tasks-file takes the directory (and one .parquet file) and gives back the same tasks
    back = select_tasks(None, "all", None, out)
    assert back == load_jsonl(src, Task)
    parquet = next(out.rglob("*.parquet"))
    assert select_tasks(None, "all", None, parquet) == back
    assert main(["export", "tasks", str(src), "--to", str(out)]) == 2  # not overwritten without --force
    assert "--force" in capsys.readouterr().err


def test_a_bad_task_dataset_names_the_file_row_and_field(tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "instruction": "x", "tools": "[]"},
                                          {"id": "b", "instruction": "", "tools": "[]"}]), bad)
    with pytest.raises(ValueError, match=r"bad.parquet:row 2: field 'instruction'"):
        select_tasks(None, "all", None, bad)
    broken = tmp_path / "broken.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "instruction": "x", "tools": "[{"}]), broken)
    with pytest.raises(ValueError, match=r"row 1: field 'tools': not JSON"):
        select_tasks(None, "all", None, broken)


def test_a_runs_trajectories_export_as_a_dataset(tmp_path):
    import yaml

    cfg = {"model": "tiny", "worlds": ["shop"], "difficulties": [1], "tool_distractors": 0, "tasks_per_world": 60,
           "steps": 1, "tasks_per_step": 2, "group_size": 2, "threads": 1,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 6, "simulator_max_new_tokens": 6},
           "sft": {"enabled": False}, "eval": {"every": 1, "tasks": 2, "samples": 1}, "out": str(tmp_path / "runs")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "cfg.yaml")]) == 0
    run = next((tmp_path / "runs").iterdir())
    assert main(["export", "trajectories", str(run), "--to", str(tmp_path / "traj")]) == 0
    ds = datasets.load_dataset(str(tmp_path / "traj"))["train"]
    phases = set(ds["phase"])
    assert "train" in phases and "eval" in phases
    n_train = sum(1 for line in (run / "trajectories.jsonl").read_text().splitlines() if line.strip())
    assert ds["phase"].count("train") == n_train
    first = json.loads(ds[0]["messages"])
    assert first[0]["role"] == "user"
    assert "load_dataset" in (tmp_path / "traj" / "README.md").read_text()
