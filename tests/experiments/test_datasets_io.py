"""Tasks and trajectories as Hugging Face datasets: exported, read back by `datasets`, a task
dataset trains like the JSONL it came from, and a trajectory dataset is a TRL tool-calling
dataset that renders as training did and that `trl.SFTTrainer` takes as it is."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from envace.cli.main import main
from envace.core.jsonl import load_jsonl
from envace.core.types import Task
from envace.experiments.tasks import select_tasks

datasets = pytest.importorskip("datasets")


def test_tasks_round_trip_through_a_dataset_with_real_splits(tmp_path, capsys):
    src = tmp_path / "tasks.jsonl"
    every = select_tasks("shop", "all", None, tasks_per_world=60)
    tasks = [t for t in every if t.split == "train"][:8] + [t for t in every if t.split == "test"][:4]
    tasks = tasks[::2] + tasks[1::2]  # the splits interleaved in the file
    src.write_text("".join(t.model_dump_json(exclude_none=True) + "\n" for t in tasks))
    out = tmp_path / "ds"
    assert main(["export", "tasks", str(src), "--to", str(out)]) == 0
    assert sorted(p.name for p in (out / "data").iterdir()) == ["test-00000-of-00001.parquet",
                                                                 "train-00000-of-00001.parquet"]
    dd = datasets.load_dataset(str(out))
    assert set(dd) == {"train", "test"}
    for split in ("train", "test"):
        want = [t for t in tasks if t.split == split]
        assert dd[split]["id"] == [t.id for t in want] and set(dd[split]["split"]) == {split}
    assert json.loads(dd["train"][0]["tools"])[0]["type"] == "function"
    # --tasks-file takes the directory (and one .parquet file) and gives back the same tasks, by split
    original = load_jsonl(src, Task)
    for split in ("train", "test"):
        assert select_tasks(None, split, None, out) == [t for t in original if t.split == split]
    assert sorted(select_tasks(None, "all", None, out), key=lambda t: t.id) == sorted(original, key=lambda t: t.id)
    parquet = out / "data" / "test-00000-of-00001.parquet"
    assert select_tasks(None, "all", None, parquet) == [t for t in original if t.split == "test"]
    assert "load_dataset" in (out / "README.md").read_text() and str(tmp_path) not in (out / "README.md").read_text()
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


@pytest.fixture(scope="module")
def traj_run(tmp_path_factory):
    import yaml

    root = tmp_path_factory.mktemp("traj")
    cfg = {"model": "tiny", "worlds": ["shop"], "difficulties": [1], "tool_distractors": 0, "tasks_per_world": 60,
           "steps": 1, "tasks_per_step": 2, "group_size": 2, "threads": 1,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 6, "simulator_max_new_tokens": 6},
           "sft": {"enabled": False}, "eval": {"every": 1, "tasks": 2, "samples": 1}, "out": str(root / "runs")}
    (root / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(root / "cfg.yaml")]) == 0
    run = next((root / "runs").iterdir())
    assert main(["export", "trajectories", str(run), "--to", str(root / "traj")]) == 0
    return run, root / "traj"


def test_a_runs_trajectories_export_as_a_tool_calling_dataset(traj_run):
    run, out = traj_run
    ds = datasets.load_dataset(str(out))["train"]
    phases = set(ds["phase"])
    assert "train" in phases and "eval" in phases
    n_train = sum(1 for line in (run / "trajectories.jsonl").read_text().splitlines() if line.strip())
    assert ds["phase"].count("train") == n_train
    row = ds[0]
    assert [m["role"] for m in row["messages"][:2]] == ["system", "user"]  # nested, not JSON text
    assert json.loads(row["tools"])[0]["type"] == "function"
    assert isinstance(row["verdicts"], list) and "kind" in row["verdicts"][0]
    card = (out / "README.md").read_text()
    assert "load_dataset" in card and str(run.parent) not in card


def test_trajectory_messages_take_the_openai_shape():
    from envace.experiments.datasets_io import trajectory_rows

    task = select_tasks("shop", "all", 1, tool_distractors=0, tasks_per_world=60)[0]
    call = {"name": task.tools[0].name, "arguments": {"query": "lamp"}}
    record = {"task_id": task.id, "source": "real", "reward": 1.0, "messages": [
        {"role": "user", "content": task.instruction},
        {"role": "assistant", "content": 'Looking.\n<tool_call>\n{"name": "%s", "arguments": {"query": "lamp"}}\n'
                                         '</tool_call>' % call["name"], "tool_calls": [call]},
        {"role": "tool", "name": call["name"], "content": "[]", "rehearsed": False},
        {"role": "assistant", "content": "Nothing found.", "tool_calls": []}],
        "verdicts": [{"item": {"kind": "answer_contains", "text": "x"}, "met": False}]}
    row = trajectory_rows([record], "eval", {task.id: task})[0]
    system, user, asst, tool, final = row["messages"]
    assert system["role"] == "system" and task.domain in system["content"]
    assert asst["content"] == "Looking." and asst["tool_calls"] == [
        {"id": "call_1_0", "type": "function", "function": {"name": call["name"], "arguments": '{"query": "lamp"}'}}]
    assert tool["tool_call_id"] == "call_1_0" and tool["name"] == call["name"] and tool["rehearsed"] is False
    assert final["content"] == "Nothing found." and final["tool_calls"] is None
    assert json.loads(row["tools"]) == [t.model_dump(mode="json") for t in task.tools]
    assert row["verdicts"][0]["kind"] == "answer_contains" and row["verdicts"][0]["met"] is False
    # the row, through the exported chat template, is the prompt training built from the record
    from envace.core.prompts import PromptStyle, render_caller_prompt
    from envace.core.types import Message
    from envace.experiments.chat_template import export_chat_template
    from envace.policy.loading import load_model

    _, tok = load_model("tiny")
    exported = load_model("tiny")[1]
    exported.chat_template = export_chat_template(tok, PromptStyle())
    history = [Message.model_validate(m) for m in record["messages"][1:]]
    assert exported.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), add_generation_prompt=True
                                        )["input_ids"] == render_caller_prompt(tok, task, history, PromptStyle())


def test_exported_trajectories_render_as_the_prompts_training_used(traj_run, tmp_path):
    """Every caller turn's recorded prompt, token for token, from the dataset row and the exported
    model's chat template: the dataset is what the policy saw."""
    from transformers import AutoTokenizer

    run, out = traj_run
    assert main(["export", "model", str(run), "--to", str(tmp_path / "model")]) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    rows = {(r["task_id"], r["phase"], r["step"], r["trajectory_index"]): r
            for r in datasets.load_dataset(str(out))["train"]}
    checked = 0
    for rec in map(json.loads, (run / "trajectories.jsonl").read_text().splitlines()):
        row = rows[(rec["task_id"], "train", rec["step"], rec.get("trajectory_index", 0))]
        assistant_at = [i for i, m in enumerate(row["messages"]) if m["role"] == "assistant"]
        for s in (s for s in rec["samples"] if s["role"] == "caller"):
            chat = row["messages"][:assistant_at[s["turn"]]]
            ids = tok.apply_chat_template(chat, tools=json.loads(row["tools"]), add_generation_prompt=True)
            assert ids["input_ids"] == s["prompt_ids"]
            checked += 1
    assert checked >= 4


@pytest.mark.slow
def test_trl_sft_trainer_takes_the_trajectories_as_they_are(traj_run, tmp_path):
    trl = pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, out = traj_run
    assert main(["export", "model", str(run), "--to", str(tmp_path / "model")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    ds = datasets.load_dataset(str(out))["train"].select_columns(["messages", "tools"])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = trl.SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2,
                         learning_rate=1e-2, report_to=[], save_strategy="no", logging_steps=1, use_cpu=True,
                         dataloader_num_workers=0, max_length=2048)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    result = trainer.train()
    assert result.global_step == 1 and result.training_loss > 0
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    # what it trained on is the training prompt format: tools in the system message, calls as <tool_call>
    first = tok.decode(trainer.train_dataset[0]["input_ids"])
    assert "Tools:\n" in first and "<|im_start|>system" in first


def test_trajectories_whose_tasks_cannot_be_rebuilt_export_without_tools(traj_run, tmp_path, capsys):
    import shutil

    run, _ = traj_run
    bare = tmp_path / "bare-run"
    bare.mkdir()
    shutil.copy(run / "trajectories.jsonl", bare)
    (bare / "config.yaml").write_text("task_file: /nonexistent/tasks.jsonl\n")
    assert main(["export", "trajectories", str(bare), "--to", str(tmp_path / "out")]) == 0
    assert "could not be rebuilt" in capsys.readouterr().out
    ds = datasets.load_dataset(str(tmp_path / "out"))["train"]
    assert set(ds["tools"]) == {None} and ds[0]["messages"][0]["role"] == "user"
    assert "have no `tools`" in (tmp_path / "out" / "README.md").read_text()
