"""`envace export model`: a trained LoRA checkpoint becomes a plain transformers directory that
loads without envace or peft, computes what the checkpoint computes, and scores the same."""

from __future__ import annotations

import json

import torch
import yaml

from envace.cli.main import main
from envace.policy.loading import load_model

EVAL = ["--world", "calendar", "--tasks", "4", "--max-turns", "2", "--max-new-tokens", "8",
        "--difficulties", "1", "--tool-distractors", "0", "--tasks-per-world", "120", "--threads", "1"]


def _run(tmp_path):
    cfg = {"model": "tiny", "worlds": ["calendar"], "difficulties": [1], "tool_distractors": 0,
           "tasks_per_world": 60, "steps": 2, "tasks_per_step": 2, "group_size": 2, "threads": 1,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 8, "simulator_max_new_tokens": 8},
           "grpo": {"lr": 0.05}, "lora": {"enabled": True, "r": 2, "alpha": 4},
           "sft": {"enabled": False}, "eval": {"every": 2, "tasks": 2}, "out": str(tmp_path / "runs")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "cfg.yaml")]) == 0
    return next((tmp_path / "runs").iterdir())


def _success(path):
    # success and reward (a tiny model succeeds rarely; its partial checklist rewards still differ by task)
    return {r["task_id"]: (r["success"], r["reward"])
            for r in map(json.loads, (path / "committed.jsonl").read_text().splitlines())}


def test_export_loads_with_plain_transformers_and_scores_the_same(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = _run(tmp_path)
    ckpt = run / "checkpoints" / "step-00000002"
    out = tmp_path / "exported"
    assert main(["export", "model", str(run), "--to", str(out)]) == 0  # the run: its latest checkpoint
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    card = (out / "README.md").read_text()
    assert "calendar" in card and "| 2 | real |" in card  # its config and its measured eval
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template
    peft_model, _ = load_model(str(ckpt / "policy"))
    ids = torch.tensor([tok("Add a meeting on Monday.")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, peft_model.eval()(ids).logits, rtol=1e-4, atol=1e-5)
    assert main(["eval", "--model", str(out), *EVAL, "--out", str(tmp_path / "ev"), "--name", "exp"]) == 0
    assert main(["eval", "--model", str(ckpt), *EVAL, "--out", str(tmp_path / "ev"), "--name", "ckpt"]) == 0
    a, b = _success(tmp_path / "ev" / "exp"), _success(tmp_path / "ev" / "ckpt")
    assert len(a) == 4 and a == b
    capsys.readouterr()
    # An existing, non-empty target is refused (nothing overwritten) unless --force.
    assert main(["export", "model", str(ckpt), "--to", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", "model", str(ckpt), "--to", str(out), "--force"]) == 0


def test_export_of_nothing_says_so(tmp_path, capsys):
    assert main(["export", "model", str(tmp_path / "nope"), "--to", str(tmp_path / "x")]) == 2
    assert "no such run" in capsys.readouterr().err
