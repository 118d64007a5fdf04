"""`report_to: [tensorboard, wandb, trackio]`: a 2-step training run reports to all three in their
offline / local modes, and each is read back: the per-step scalars and the sample table."""

from __future__ import annotations

import glob
import json
import struct

import pytest
import yaml

from envace.cli.main import main


def _wandb_records(path: str) -> list[bytes]:
    """The records of an offline W&B run file (a LevelDB-style log: 32 KiB blocks of chunks)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind in (3, 4):
            buf += chunk
            if kind == 4:
                out.append(buf)
    return out


def test_two_steps_report_to_tensorboard_wandb_and_trackio(tmp_path, monkeypatch):
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("wandb", "trackio", "tensorboard")):
        pytest.skip("the wandb, trackio and tensorboard extras are not installed")
    # (trackio is not imported before the run: it fixes its store directory at import)
    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = {"model": "tiny", "worlds": ["shop"], "difficulties": [1], "tool_distractors": 0, "tasks_per_world": 60,
           "steps": 2, "tasks_per_step": 2, "group_size": 2, "threads": 1, "report_samples_every": 2,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 6, "simulator_max_new_tokens": 6},
           "sft": {"enabled": False}, "eval": {"every": 0, "tasks": 1, "samples": 1}, "out": str(tmp_path / "runs")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "cfg.yaml"), "--report-to", "tensorboard,wandb,trackio"]) == 0
    run = next((tmp_path / "runs").iterdir())
    rewards = {r["step"]: r["reward"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
               if r.get("phase") == "train"}
    assert sorted(rewards) == [1, 2]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    got = {e.step: e.value for e in acc.Scalars("train/reward")}
    assert got == pytest.approx(rewards)
    assert "caller/policy/loss" in acc.Tags()["scalars"] or any(t.startswith("policy/") for t in acc.Tags()["scalars"])
    assert any("samples" in t for t in acc.Tags()["tensors"])  # the sample table as text

    from wandb.proto import wandb_internal_pb2

    [path] = glob.glob(str(run / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    history = {}
    for data in _wandb_records(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            history.setdefault(items["_step"], {}).update(items)
    assert {s: h["train/reward"] for s, h in history.items() if "train/reward" in h} == pytest.approx(rewards)
    tables = glob.glob(str(run / "wandb" / "wandb" / "offline-run-*" / "files" / "media" / "table" / "train" /
                           "samples_*.table.json"))
    assert len(tables) == 2  # step 1, and every report_samples_every=2 steps
    table = json.loads(open(sorted(tables)[0]).read())
    assert table["columns"][:3] == ["step", "task_id", "reward"] and table["data"]

    from trackio import SQLiteStorage

    logs = SQLiteStorage.get_logs("envace", run.name)
    assert {r["step"]: r["train/reward"] for r in logs if "train/reward" in r} == pytest.approx(rewards)
    tables = [r["train/samples"] for r in logs if "train/samples" in r]
    assert tables and tables[0]["_value"][0]["task_id"]
    assert (run / "trackio").is_dir()


def test_an_unknown_or_missing_tracker_is_a_clear_error(tmp_path, capsys):
    cfg = {"model": "tiny", "steps": 1, "report_to": ["mlflow"], "out": str(tmp_path / "runs")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "cfg.yaml")]) == 2
    assert "report_to" in capsys.readouterr().err
