"""What a user sees while training: an interrupt names the run and how to resume it, the
progress line fits the terminal, and the config lists and checks its own fields."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.yaml"


@pytest.mark.slow
def test_ctrl_c_during_training_names_the_run_and_the_resume_command(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    # steps=10000: the smoke run alone can end before the signal lands on a fast machine
    proc = subprocess.Popen([sys.executable, "-m", "envace.cli.main", "train", "--config", str(SMOKE),
                             "--set", "out=runs", "--set", "steps=10000"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("run directory:"):
                break
        run = seen[-1].split(":", 1)[1].strip() if seen and seen[-1].startswith("run directory:") else None
        assert run is not None, "".join(seen)
        time.sleep(1.0)  # inside the warm start
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert run.startswith("runs/") and (tmp_path / run / "config.yaml").is_file()
    assert "Traceback" not in err, err
    tail = err.strip().splitlines()[-3:]
    assert tail == ["envace train: interrupted", f"run directory: {run}",
                    f"resume with: envace train --resume {run}"], err


def _rendered(width: int, phase: str = "copy warm-up") -> str:
    import io

    from rich.console import Console

    from envace.experiments.progress import JobClock, StepProgress

    clock = JobClock(["copy warm-up", "sft", "train", "final eval"])
    console = Console(file=io.StringIO(), width=width, force_terminal=True)
    bar = StepProgress(phase, total=20_000, clock=clock, console=console)
    bar._t0 -= 40.0  # 40 s into the phase: an ETA exists
    bar.update(1_234, 20_000, {"loss": 1.2731, "lr": 1e-3, "tokens/s": 5123.4})
    shown = Console(file=io.StringIO(), width=width, record=True, force_terminal=False)
    shown.print(bar._progress.get_renderable())
    bar.close()
    return shown.export_text()


@pytest.mark.parametrize("width", [80, 200])
def test_the_progress_line_fits_the_terminal_with_whole_figures(width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    text = _rendered(width)
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and len(lines[0]) <= width, text
    line = lines[0]
    assert "…" not in line, line
    assert line.startswith("copy warm-up [1/4] ") and " 1234/20000 eta 10:" in line, line
    assert "loss=1.27" in line and "| job" in line, line
    if width == 200:  # room for everything: the bar, every figure, the untimed phases named
        assert "━" in line and "tokens/s=5.12e+03" in line and "not yet timed" in line, line


def _declared_in(model, name: str):
    for cls in model.__mro__:
        if name in cls.__dict__.get("__annotations__", {}):
            return cls
    return model


def test_every_field_declared_in_the_config_module_is_described_and_listed(capsys):
    import typing

    from pydantic import BaseModel

    from envace.cli.config_cmd import config_fields
    from envace.cli.main import main
    from envace.experiments import config as config_module

    def owners(model, prefix=""):
        for name, field in model.model_fields.items():
            yield prefix + name, _declared_in(model, name)
            for sub in typing.get_args(field.annotation) or (field.annotation,):
                if isinstance(sub, type) and issubclass(sub, BaseModel):
                    yield from owners(sub, prefix + name + ".")

    ours = {path for path, cls in owners(config_module.TrainConfig) if cls.__module__ == config_module.__name__}
    fields = {f.path: f for f in config_fields()}
    assert len(ours) > 90 and ours <= set(fields)
    assert [p for p in sorted(ours) if not fields[p].description.strip()] == []
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    for path in ("grpo.lr", "sft.copy_warmup_steps", "rollout.backend", "eval.every", "checkpoint.keep_last"):
        assert f"\n{path}: " in out, path
    assert '\nrollout.backend: "transformers" | "http" | "vllm" | "llamacpp" = "transformers"\n' in out
    assert "\nsteps: int = 20\n    GRPO steps" in out


def test_a_set_typo_is_blamed_on_the_flag_with_the_nearest_field(tmp_path, capsys):
    from envace.cli.main import main

    good = tmp_path / "c.yaml"
    good.write_text("steps: 1\n")
    assert main(["train", "--config", str(good), "--set", "grpo.lrr=1e-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "envace train: error: --set grpo.lrr=1e-5: unknown field 'grpo.lrr'; did you mean 'grpo.lr'?"
    assert main(["sft", "--config", str(good), "--set", "sft.epoch=3"]) == 2
    assert "did you mean 'sft.epochs'?" in capsys.readouterr().err
    assert not any(tmp_path.glob("runs*"))  # refused before anything runs


def test_an_eval_prints_as_a_table_not_a_dict():
    from envace.experiments.progress import metrics_table

    text = metrics_table("final real eval (step 2)", {"eval/success": 0.25, "eval/fidelity_n": 12.0,
                                                        "eval/reward": 0.5}, width=80)
    lines = text.splitlines()
    assert lines[0] == "final real eval (step 2)" and "{" not in text and "'" not in text
    assert any("success" in ln and "0.250" in ln and "reward" in ln for ln in lines[1:]), text
    assert any("fidelity_n" in ln and " 12" in ln for ln in lines[1:]), text
    assert all(len(ln) <= 80 for ln in lines)


@pytest.mark.slow
def test_the_warm_start_logs_a_row_per_step_to_metrics_and_trackers(tmp_path):
    from envace.experiments.config import load_config
    from envace.experiments.train_job import train

    from test_train_job import _cfg  # tests/experiments is on sys.path (pytest prepend mode)

    pytest.importorskip("tensorboard")
    cfg = load_config(_cfg(tmp_path, report_to=["tensorboard"], steps=1,
                           sft={"trajectories": 2, "epochs": 2, "batch_samples": 2, "copy_warmup_steps": 3,
                                "copy_warmup_vocab": 16, "copy_warmup_span": 4},
                           eval={"every": 0, "tasks": 1, "at_start": False}))
    run = train(cfg, log=lambda *_: None)
    rows = run.metrics()
    copy = [r for r in rows if r.get("phase") == "copy"]
    sft = [r for r in rows if r.get("phase") == "sft" and "sft/loss" in r]
    assert [r["copy/step"] for r in copy] == [1, 2, 3] and all(r["copy/loss"] > 0 for r in copy)
    assert len(sft) >= 2 and [r["sft/step"] for r in sft] == list(range(1, len(sft) + 1))
    assert [r["global_step"] for r in copy + sft] == list(range(1, 4 + len(sft)))
    assert all(r["sft/lr"] > 0 and r["sft/loss"] > 0 and r["step"] == 0 for r in sft)
    # the warm start's summary row is still there for the report
    assert any("sft/samples" in r for r in rows) and "SFT warm start:" in (run.path / "summary.md").read_text()
    # every row carries the process's memory, its peak never falling, and the report places it by phase
    peaks = [r["mem/peak_rss_gib"] for r in rows]
    assert all(0.05 < r["mem/rss_gib"] <= r["mem/peak_rss_gib"] + 0.01 for r in rows if "mem/rss_gib" in r)
    assert peaks == sorted(peaks) and peaks[-1] > 0.05
    assert "Peak resident memory by the end of each phase (GiB): copy " in (run.path / "summary.md").read_text()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run.path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("sft/loss")] == [
        (r["global_step"], pytest.approx(r["sft/loss"])) for r in sft]
    assert [e.step for e in acc.Scalars("copy/loss")] == [1, 2, 3]
    assert [e.step for e in acc.Scalars("train/reward")] == [1]  # GRPO keeps its own steps there
    assert "<b>step 1</b>" in (run.path / "viewer.html").read_text()  # the run's rollouts, per step


def test_a_training_run_writes_a_viewer_of_its_episodes_per_step(tmp_path):
    """A real (small) run's trajectories through the viewer; and an episode that ended in a final
    answer shows that answer, never a blank assistant cell."""
    import json

    from envace.core.types import Message, ToolCall, Trajectory
    from envace.experiments.report import write_train_report
    from envace.experiments.rundir import RunDir
    from envace.experiments.viewer import render_train_viewer

    run = RunDir.create(str(tmp_path / "runs"), "train", {"model": "tiny", "source": "rehearsal"}, seed=0)
    answered = Trajectory(task_id="shop-1", source="rehearsal", reward=1.0, stop_reason="final_answer", messages=[
        Message(role="user", content="What is in <my> cart?"),
        Message(role="assistant", content="", tool_calls=[ToolCall(name="get_cart", arguments={"user": "u1"})]),
        Message(role="tool", name="get_cart", content='{"items": []}', rehearsed=True),
        Message(role="assistant", content="Your cart is empty.")])
    blank = Trajectory(task_id="shop-2", source="rehearsal", reward=0.0, stop_reason="final_answer", messages=[
        Message(role="user", content="Hi"), Message(role="assistant", content="")])
    for step, t in ((1, answered), (2, blank)):
        run.add_trajectories([{"step": step, "kind": "train", **t.model_dump(mode="json", exclude_none=True)}])
    run.log_metrics({"phase": "train", "step": 1, "reward": 1.0, "success": 1.0, "tool_calls": 1.0,
                     "sim_format_failures": 0.0, "step_s": 1.0, "rollout_s": 1.0, "update_s": 0.0})
    write_train_report(run)
    page = (run.path / "viewer.html").read_text()
    assert "viewer.html" in (run.path / "summary.md").read_text()
    assert "<b>step 1</b>" in page and "<b>step 2</b>" in page
    assert "Your cart is empty." in page and "final answer" in page
    assert "get_cart" in page and json.dumps({"user": "u1"}).replace('"', "&quot;") in page
    assert "What is in &lt;my&gt; cart?" in page and "<my>" not in page  # model and task text escaped
    assert "ended the episode with an empty turn" in page
    assert "<p>No episodes yet.</p>" in render_train_viewer("t", [], [])
