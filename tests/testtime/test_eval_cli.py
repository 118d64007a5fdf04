import json
import re

import pytest

from envace.cli.main import main
from envace.experiments.eval_models import resolve_eval_models
from envace.experiments.rundir import RunDir
from envace.experiments.viewer import render_viewer

from testtime_helpers import few_tasks

FAST = ["--max-new-tokens", "6", "--sim-max-new-tokens", "6", "--summary-max-new-tokens", "6",
        "--fidelity-max-new-tokens", "6", "--max-turns", "2"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv,msg", [
    (["--rehearse", "parallel", "--budget", "0"], "needs a budget >= 1"),
    (["--rehearse", "sequential", "--budget", "-3"], "needs a budget >= 1"),
    (["--rehearse", "beam"], "unknown rehearse mode 'beam'"),
    (["--budget", "2"], "needs --rehearse parallel or sequential"),
    (["--sweep", "--budgets", "0,-1,2"], "budgets must be integers >= 0"),
    (["--sweep", "--budgets", "0,x"], "comma list of integers"),
    (["--sweep", "--rehearse", "parallel"], "drop --rehearse/--budget"),
    (["--sweep", "--modes", "parallel,beam"], "sweep modes"),
    (["--memory", "magic"], "unknown memory kind"),
    (["--world", "moon"], "unknown world"),
    (["--model", "runs/nope/checkpoints/step-00000020"], "no such file or directory"),
    (["--model", "no-such-model"], "unknown model spec"),
])
def test_bad_input_is_one_line_with_exit_2(capsys, tmp_path, argv, msg):
    code, out, err = run_cli(capsys, "eval", "--model", "tiny", "--out", str(tmp_path), *argv)
    assert code == 2 and msg in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())  # nothing was started


def test_a_task_file_without_a_test_split(capsys, tmp_path):
    f = tmp_path / "train_only.jsonl"
    f.write_text("".join(t.model_dump_json() + "\n" for t in few_tasks("shop", 2, split="train")))
    code, _, err = run_cli(capsys, "eval", "--model", "tiny", "--task-file", str(f), "--out", str(tmp_path / "r"))
    assert code == 2 and "no tasks" in err and "split='test'" in err


def test_checkpoint_dirs_resolve_and_bad_ones_say_why(capsys, tmp_path):
    empty = tmp_path / "step-00000020"
    (empty / "optimizer").mkdir(parents=True)
    (empty / "trainer_state.json").write_text(json.dumps({"step": 20, "models": ["policy"]}))
    code, _, err = run_cli(capsys, "eval", "--model", str(empty), "--out", str(tmp_path / "r"))
    assert code == 2 and "without a model" in err and "['policy']" in err

    share = tmp_path / "share" / "checkpoints" / "step-00000002"
    (share / "policy").mkdir(parents=True)
    (share / "policy" / "adapter_config.json").write_text("{}")
    (tmp_path / "share" / "config.yaml").write_text("prompt: {tool_format: json, max_examples: 1}\n")
    m = resolve_eval_models(str(share))
    assert m.caller == m.simulator == str(share / "policy") and m.shared and "shared policy" in m.notes[0]
    assert m.style is not None and m.style.tool_format == "json" and m.style.max_examples == 1

    # a checkpoint root (a run's sft/ or checkpoints/ dir, as saved): its latest checkpoint
    from envace.policy.loading import load_model
    from envace.train.checkpoint import save_checkpoint

    model, tok = load_model("tiny")
    root = tmp_path / "run" / "sft"
    for step in (0, 3):
        save_checkpoint(root, model, step=step, tokenizer=tok)
    m = resolve_eval_models(str(root))
    assert m.caller == m.simulator == str(root / "step-00000003")

    two = tmp_path / "two"
    for key in ("caller", "simulator"):
        (two / key).mkdir(parents=True)
        (two / key / "config.json").write_text("{}")
    m = resolve_eval_models(str(two))
    assert (m.caller, m.simulator) == (str(two / "caller"), str(two / "simulator")) and not m.shared
    (two / "simulator" / "config.json").unlink()
    m = resolve_eval_models(str(two))
    assert m.caller == m.simulator == str(two / "caller")


def test_a_checkpoint_that_does_not_match_its_base(capsys, tmp_path):
    bad = tmp_path / "adapter"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "tiny", "peft_type": "LORA",
                                                         "r": 4, "target_modules": ["no_such_proj"]}))
    code, _, err = run_cli(capsys, "eval", "--model", str(bad), "--out", str(tmp_path / "r"))
    assert code == 2 and err.count("\n") == 1 and str(bad) in err


def test_eval_sweep_fidelity_and_report_end_to_end(capsys, tmp_path):
    code, out, err = run_cli(capsys, "eval", "--model", "tiny", "--world", "shop", "--tasks", "2", "--sweep",
                             "--budgets", "0,1,2", "--modes", "sequential", "--fidelity", "--fidelity-tasks", "1",
                             "--out", str(tmp_path), "--name", "ev", *FAST)
    assert code == 0, err
    # progress as it goes: each batched turn of the committed runs, the rehearsals and the fidelity episodes
    assert re.search(r"^  committed run: turn 1/\d+: \d+/2 episodes finished, \d+ s$", out, re.M), out
    assert re.search(r"^  attempt 2/2: turn 1/\d+: \d+/2 episodes finished", out, re.M)
    assert re.search(r"^  fidelity, oracle episodes: turn 1/\d+: \d+/1 episodes finished", out, re.M)
    run = RunDir.open(tmp_path / "ev")
    assert run.meta()["kind"] == "eval"
    committed = [json.loads(x) for x in (run.path / "committed.jsonl").read_text().splitlines()]
    assert [r["condition"] for r in committed] == ["none"] * 2 + ["sequential-1"] * 2 + ["sequential-2"] * 2
    assert all(r["real_calls_during_rehearsal"] == 0 for r in committed)
    rehearsals = (run.path / "rehearsals.jsonl").read_text().splitlines()
    assert len(rehearsals) == 2 * 2
    assert (run.path / "fidelity.jsonl").read_text().strip()
    for name in ("summary.md", "sweep.png", "fidelity.png", "viewer.html"):
        assert (run.path / name).stat().st_size > 0
        (run.path / name).unlink()
    code, out, _ = run_cli(capsys, "report", str(run.path))  # the report rebuilds every file
    assert code == 0
    summary = (run.path / "summary.md").read_text()
    assert "| sequential-2 | 2 |" in summary and "World-model fidelity" in summary and "viewer.html" in summary
    assert all((run.path / n).stat().st_size > 0 for n in ("sweep.png", "fidelity.png", "viewer.html"))
    metrics = run.metrics()
    assert {m["phase"] for m in metrics} == {"testtime", "fidelity", "gap"}
    # The rehearsal gap of the plain run: the same tasks real and rehearsal-judged, side by side.
    (gap,) = [m for m in metrics if m["phase"] == "gap"]
    plain = [r for r in committed if r["condition"] == "none"]
    assert gap["eval/success"] == sum(r["success"] for r in plain) / 2
    assert 0.0 <= gap["eval/rehearsal_success"] <= 1.0
    assert gap["eval/rehearsal_gap"] == gap["eval/rehearsal_success"] - gap["eval/success"]
    assert gap["eval/example_n"] > 0 and 0.0 <= gap["eval/example_exact"] <= 1.0
    judged = [json.loads(x) for x in (run.path / "rehearsal_judged.jsonl").read_text().splitlines()]
    assert sorted(t["task_id"] for t in judged) == sorted(r["task_id"] for r in plain)
    assert all(t["source"] == "rehearsal" for t in judged)
    fails = [json.loads(x) for x in (run.path / "failures.jsonl").read_text().splitlines()]
    assert sorted(f["source"] for f in fails) == ["real"] * 2 + ["rehearsal_judged"] * 2
    assert "## Rehearsal gap" in summary and "| no call |" in summary
    # --no-rehearsal-gap skips it
    code, _, err = run_cli(capsys, "eval", "--model", "tiny", "--world", "shop", "--tasks", "1", "--no-rehearsal-gap",
                           "--out", str(tmp_path), "--name", "nogap", *FAST)
    assert code == 0, err
    assert {m["phase"] for m in RunDir.open(tmp_path / "nogap").metrics()} == {"testtime"}


def test_single_condition_run(capsys, tmp_path):
    # in bf16: the rehearsals and the committed run generate with a cast copy of the model
    code, _, err = run_cli(capsys, "eval", "--model", "tiny", "--tasks", "1", "--rehearse", "parallel", "--budget",
                           "2", "--memory", "rule", "--dtype", "bfloat16", "--out", str(tmp_path), "--name", "p", *FAST)
    assert code == 0, err
    rows = [json.loads(x) for x in (tmp_path / "p" / "committed.jsonl").read_text().splitlines()]
    assert [r["condition"] for r in rows] == ["parallel-2"]
    assert rows[0]["memory_source"] == "rule" and rows[0]["memory"].startswith("2 imagined attempts.")
    assert not (tmp_path / "p" / "fidelity.jsonl").exists()


def test_viewer_escapes_model_text():
    evil = "<script>alert(1)</script>"
    traj = {"messages": [{"role": "user", "content": evil}, {"role": "assistant", "content": evil},
                         {"role": "tool", "content": evil, "rehearsed": False}], "verdicts": [], "stop_reason": "x"}
    row = {"condition": "none", "mode": "none", "budget": 0, "task_id": evil, "success": False, "reward": 0.0,
           "memory": evil, "memory_source": "rule", "memory_note": evil, "memory_raw": evil, "real_calls": 0,
           "tokens": {"total": 1}, "trajectory": traj}
    pair = {"world": evil, "task_id": "t", "origin": "oracle", "tool": evil, "arguments": {"a": evil},
            "real": evil, "rehearsed": evil, "match": {}}
    page = render_viewer(evil, [row], [], [pair])
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_a_checkpoint_is_evaluated_on_its_training_distribution(capsys, tmp_path):
    """A run trained on difficulty-1 calendar tasks with 0 distractors out of 60 per world: its
    checkpoint's eval draws the same tasks (same tools shown, same turn limits) unless told otherwise."""
    import yaml

    from envace.experiments.tasks import select_tasks

    cfg = {"model": "tiny", "worlds": ["calendar"], "difficulties": [1], "tool_distractors": 0,
           "tasks_per_world": 60, "steps": 1, "tasks_per_step": 1, "group_size": 2, "threads": 1,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 6, "simulator_max_new_tokens": 6},
           "sft": {"enabled": False}, "eval": {"every": 0, "tasks": 1}, "out": str(tmp_path / "runs")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "cfg.yaml")]) == 0
    run = next((tmp_path / "runs").iterdir())
    ckpt = run / "checkpoints" / "step-00000001"
    code, out, err = run_cli(capsys, "eval", "--model", str(ckpt), "--tasks", "2", "--summary-max-new-tokens", "6",
                             "--out", str(tmp_path / "ev"), "--name", "same")
    assert code == 0, err
    assert "training run's settings" in out and "tool_distractors=0" in out and "world=calendar" in out
    want = select_tasks("calendar", "test", 2, difficulties=[1], tool_distractors=0, tasks_per_world=60)
    rows = [json.loads(line) for line in (tmp_path / "ev" / "same" / "committed.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == sorted(t.id for t in want)
    resolved = yaml.safe_load((tmp_path / "ev" / "same" / "config.yaml").read_text())
    assert resolved["max_turns"] == 2 and resolved["max_new_tokens"] == 6 and resolved["difficulties"] == [1]
    # Flags win over the run's settings.
    code, out, err = run_cli(capsys, "eval", "--model", str(ckpt), "--tasks", "1", "--world", "shop",
                             "--tool-distractors", "2", "--max-turns", "1", "--summary-max-new-tokens", "6",
                             "--out", str(tmp_path / "ev"), "--name", "other")
    assert code == 0, err
    resolved = yaml.safe_load((tmp_path / "ev" / "other" / "config.yaml").read_text())
    assert resolved["world"] == "shop" and resolved["tool_distractors"] == 2 and resolved["max_turns"] == 1
    rows = [json.loads(line) for line in (tmp_path / "ev" / "other" / "committed.jsonl").read_text().splitlines()]
    assert all(r["task_id"].startswith("shop") for r in rows)


def test_fidelity_can_show_the_simulator_the_conversation(capsys, tmp_path, monkeypatch):
    """--simulator-context conversation: the rehearse role's prompts carry the user's request."""
    import envace.rollout.rehearse as sources

    seen = []
    real_render = sources.render_simulator_prompt

    def spy(tok, task, call, earlier, style):
        text = tok.decode(real_render(tok, task, call, earlier, style))
        seen.append((task.instruction, style.simulator_context, text))
        return real_render(tok, task, call, earlier, style)

    monkeypatch.setattr(sources, "render_simulator_prompt", spy)
    code, _, err = run_cli(capsys, "eval", "--model", "tiny", "--world", "shop", "--tasks", "1", "--fidelity",
                           "--simulator-context", "conversation", "--out", str(tmp_path), "--name", "f", *FAST)
    assert code == 0, err
    assert seen and all(ctx == "conversation" and instruction in text for instruction, ctx, text in seen)
    assert RunDir.open(tmp_path / "f").config()["simulator_context"] == "conversation"


def test_another_world_model_rehearses_for_the_caller(capsys, tmp_path):
    """--sim-model: fidelity (greedy) rehearsed by it is exactly what it rehearses as --model, and
    not what the caller's own model rehearses."""
    def rehearsed(*extra):
        code, _, _ = run_cli(capsys, "eval", "--world", "bank", "--tasks", "1", "--fidelity", *FAST,
                             "--out", str(tmp_path), *extra)
        assert code == 0
        run = RunDir.open(sorted(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime)[-1])
        rows = [json.loads(line) for line in (run.path / "fidelity.jsonl").read_text().splitlines()]
        return run, [r["rehearsed"] for r in rows]

    _, own = rehearsed("--model", "tiny:1", "--name", "own")
    _, other = rehearsed("--model", "tiny:2", "--name", "other")
    run, mixed = rehearsed("--model", "tiny:1", "--sim-model", "tiny:2", "--name", "mixed")
    assert mixed == other != own
    assert run.config()["resolved"]["simulator_model"] == "tiny:2"
    assert run.config()["resolved"]["caller_model"] == "tiny:1"
