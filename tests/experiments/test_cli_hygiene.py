"""Bad input on the command line: one line, exit 2, nothing written where it should not be; a run
killed during its warm start resumes by redoing the warm start."""

import json

from envace.cli.main import main
from envace.experiments.rundir import RunDir
from envace.experiments.train_job import train
from envace.experiments.config import load_config

from test_train_job import _cfg  # tests/experiments is on sys.path (pytest prepend mode)


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_run_names_cannot_escape_out(tmp_path, capsys):
    out = tmp_path / "runs"
    for name in ("../../x", "/tmp/abs", "a/b", ".."):
        err = _one_line_error(capsys, ["eval", "--model", "tiny", "--tasks", "1", "--out", str(out), "--name", name])
        assert "one plain folder name" in err
    assert not (tmp_path / "x").exists() and not any(tmp_path.glob("**/b"))


def test_bad_configs_are_one_line_errors(tmp_path, capsys):
    _one_line_error(capsys, ["train", "--config", str(tmp_path)])  # a folder
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert "is empty" in _one_line_error(capsys, ["train", "--config", str(empty)])
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("model: caf\xe9\n".encode("latin-1"))
    assert "latin.yaml: not UTF-8" in _one_line_error(capsys, ["train", "--config", str(latin)])
    good = _cfg(tmp_path)
    assert "not valid YAML" in _one_line_error(capsys, ["train", "--config", str(good), "--set", "steps=[unclosed"])
    assert "field 'steps'" in _one_line_error(capsys, ["train", "--config", str(good), "--set", "steps=true"])
    assert "field 'grpo.lr'" in _one_line_error(capsys, ["train", "--config", str(good), "--set", "grpo.lr=fast"])
    assert load_config(good, ["grpo.lr=1e-4"]).grpo.lr == 1e-4  # YAML 1.1 would read 1e-4 as a string


def test_a_run_killed_in_its_warm_start_redoes_it_on_resume(tmp_path):
    cfg = load_config(_cfg(tmp_path), ["steps=1"])
    run = train(cfg, log=lambda *_: None)
    # The state a kill during SFT leaves: the run directory, no warm start, no GRPO step.
    import shutil

    for d in ("sft", "checkpoints"):
        shutil.rmtree(run.path / d)
    (run.path / "metrics.jsonl").unlink()
    lines = []
    train(cfg, resume=run.path, log=lines.append)
    assert any("the SFT warm start did not finish; redoing it" in line for line in lines)
    assert (run.path / "sft").is_dir() and (run.path / "checkpoints").is_dir()
    rows = RunDir.open(run.path).metrics()
    phases = [r["phase"] for r in rows]
    assert sum("sft/samples" in r for r in rows) == 1 and "train" in phases  # one warm start's summary row
    steps = [r["sft/step"] for r in rows if "sft/loss" in r]
    assert steps == list(range(1, len(steps) + 1)) and steps  # and its per-step rows once, not twice


def test_a_run_killed_in_its_final_eval_redoes_it_on_resume(tmp_path):
    from envace.core.jsonl import read_jsonl_dicts, save_jsonl

    cfg = load_config(_cfg(tmp_path), ["steps=1"])
    run = train(cfg, log=lambda *_: None)
    rows = read_jsonl_dicts(run.path / "metrics.jsonl")
    save_jsonl(run.path / "metrics.jsonl", [r for r in rows if not (r["phase"] == "eval" and r["step"] == 1)])
    lines = []
    train(cfg, resume=run.path, log=lines.append)
    assert any(line.startswith("final real eval (step 1)") for line in lines)
    evals = [r["step"] for r in RunDir.open(run.path).metrics() if r["phase"] == "eval"]
    assert evals == [0, 1]


def test_a_rehearsal_rollout_reports(tmp_path, capsys):
    """Its state items are not judged (met: null, written as absent) and must read back."""
    out = tmp_path / "r"
    assert main(["rollout", "--world", "shop", "--tasks", "2", "--source", "rehearsal", "--model", "tiny",
                 "--max-new-tokens", "8", "--out", str(out)]) == 0
    (run,) = out.iterdir()
    assert any(v.met is None for t in RunDir.open(run).trajectories() for v in t.verdicts)
    assert main(["report", str(run)]) == 0
    assert (run / "summary.md").is_file()


def test_caller_only_mode_trains_with_a_frozen_simulator(tmp_path):
    """It crashed: the frozen simulator was not among the models the updaters were built from."""
    cfg = load_config(_cfg(tmp_path), ["steps=1", "mode=caller_only"])
    run = train(cfg, log=lambda *_: None)
    (ckpt,) = [p for p in (run.path / "checkpoints").iterdir() if p.name.startswith("step-")]
    assert json.loads((ckpt / "trainer_state.json").read_text())["models"] == ["caller"]


def test_the_smoke_config_runs_end_to_end(tmp_path, capsys):
    """configs/smoke.yaml, the setup check the README points to, stays true; its log announces the
    phases, shows the eval's progress per turn and the whole job's ETA, and ends by saying where the
    results are and how to look at them."""
    import re
    from pathlib import Path

    from envace.cli.main import main as cli

    config = Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml"
    assert cli(["train", "--config", str(config), "--set", f"out={tmp_path}"]) == 0
    run = next(tmp_path.iterdir())
    assert (run / "summary.md").is_file() and (run / "checkpoints").is_dir()
    out = capsys.readouterr().out
    assert re.search(r"^plan: 1/3 sft .* -> 2/3 train .* -> 3/3 final eval", out, re.M)
    assert re.search(r"^  eval: turn 1/2: \d+/4 episodes finished", out, re.M)
    # The last train line: the train phase is done, the final eval is timed by the step-0 eval.
    assert re.search(r"^train \[2/3\] 2/2 .* \| job eta \d+s$", out, re.M), out
    assert f"look at the results: cat {run / 'summary.md'}" in out
    # A newcomer reads a warning as a failure: the setup check prints none (its toy model's cut-off
    # turns are expected), and the eval prints as a table, not a Python dict.
    assert "warning" not in out.lower(), [line for line in out.splitlines() if "warning" in line.lower()]
    assert "{'" not in out


def test_the_job_eta_adds_the_timed_later_phases_and_names_the_untimed_ones():
    from envace.experiments.progress import JobClock

    clock = JobClock(["sft", "train", "final eval"])
    assert clock.label("train") == "train [2/3]"
    assert clock.job_eta("sft", 100) == "job eta >100s (train, final eval not yet timed)"
    clock.estimate("final eval", 1250)
    assert clock.job_eta("sft", 100) == "job eta >1,350s (train not yet timed)"
    assert clock.job_eta("train", 100) == "job eta 1,350s"
    assert clock.job_eta("final eval", 7) == "job eta 7s"
