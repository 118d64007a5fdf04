"""benchmarks/eval_gain.py pairs a run's final eval with the start eval of the run whose warm start
it shares (eval.at_start: false), on real run directories."""

import sys
from pathlib import Path

import pytest

from envace.experiments.rundir import RunDir

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import eval_gain  # noqa: E402


def _run(root, name, source, evals):
    run = RunDir.create(root, "train", {"source": source}, name=name)
    run.add_trajectories([{"step": step, "task_id": t, "reward": r} for step, t, r in evals], name="evals.jsonl")
    return run.path


def test_a_run_without_its_own_start_eval_pairs_with_the_start_run(tmp_path, capsys):
    base = _run(tmp_path, "base", "rehearsal", [(0, "a", 0.0), (0, "a", 1.0), (0, "b", 0.0), (0, "b", 0.0),
                                                (10, "a", 1.0), (10, "a", 1.0), (10, "b", 1.0), (10, "b", 0.0)])
    real = _run(tmp_path, "real", "real", [(10, "a", 1.0), (10, "a", 0.0), (10, "b", 0.0), (10, "b", 0.0)])
    gain = eval_gain
    assert gain.main([str(base), str(real), "--start", str(base)]) == 0
    out = capsys.readouterr().out
    assert f"| {base} | 2 | 0.250 (start run) | 0.750 (step 10) | +0.500 (0.000) |" in out
    assert f"| {real} | 2 | 0.250 (start run) | 0.250 (step 10) | +0.000 (0.000) |" in out
    with pytest.raises(SystemExit):  # on its own the real run has one eval: nothing to pair
        gain.main([str(real), "--from", "0"])
    other = _run(tmp_path, "other", "real", [(10, "c", 1.0)])
    with pytest.raises(SystemExit):
        gain.main([str(other), "--start", str(base)])
    assert "different tasks" in capsys.readouterr().err


def test_start_step_pairs_two_runs_at_a_chosen_step(tmp_path, capsys):
    a = _run(tmp_path, "a", "real", [(8, "x", 0.0), (8, "y", 0.0), (16, "x", 1.0), (16, "y", 0.0)])
    b = _run(tmp_path, "b", "rehearsal", [(8, "x", 0.0), (8, "y", 1.0), (16, "x", 1.0), (16, "y", 1.0)])
    assert eval_gain.main([str(b), "--start", str(a), "--start-step", "16"]) == 0
    assert f"| {b} | 2 | 0.500 (start run, step 16) | 1.000 (step 16) | +0.500 (0.500) |" in capsys.readouterr().out
    for argv in ([str(b), "--start", str(a), "--start-step", "12"], [str(b), "--start-step", "16"]):
        with pytest.raises(SystemExit):
            eval_gain.main(argv)
    err = capsys.readouterr().err
    assert "no eval at step 12 (steps: [8, 16])" in err and "--start-step needs --start" in err
