"""``envace report --compare``: one plot over several runs, with legend labels that tell them apart."""

from __future__ import annotations

from envace.cli.main import main
from envace.experiments.report import run_labels
from envace.experiments.rundir import RunDir


def _run(root, source: str, seed: int) -> RunDir:
    run = RunDir.create(root, "train", {"source": source, "seed": seed, "eval": {"split": "pool"}}, seed=seed)
    for step, success in ((0, 0.25), (10, 0.5)):
        run.log_metrics({"phase": "eval", "step": step, "eval/success": success, "eval/reward": success,
                         "eval/tool_calls": 1.0, "eval/parse_failures": 0.0})
    return run


def test_compare_labels_name_the_source_and_the_seed_only_where_needed(tmp_path):
    a, b = _run(tmp_path / "a", "rehearsal", 0), _run(tmp_path / "b", "real", 0)
    assert list(run_labels([a, b])) == ["rehearsal", "real"]
    c, d = _run(tmp_path / "c", "rehearsal", 1), _run(tmp_path / "d", "rehearsal", 1)
    labels = list(run_labels([a, b, c, d]))
    assert labels[:2] == ["rehearsal, seed 0", "real, seed 0"]
    assert labels[2:] == [f"rehearsal, seed 1 ({c.path.name})", f"rehearsal, seed 1 ({d.path.name})"]
    png = tmp_path / "curves.png"
    assert main(["report", str(a.path), str(b.path), "--compare", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 10 | 0.500 |" in (a.path / "summary.md").read_text()


def test_report_of_a_run_with_no_steps_says_what_is_missing(tmp_path, capsys):
    run = RunDir.create(tmp_path, "train", {"model": "tiny", "steps": 3, "source": "rehearsal"}, name="fresh")
    assert main(["report", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert "no training step logged yet" in out and f"--resume {run.path}" in out
    assert "no eval yet" in out and "no checkpoint yet" in out
    run.log_metrics({"phase": "train", "step": 1, "reward": 0.5, "success": 0.25, "tool_calls": 2.0,
                     "sim_format_failures": 0.0, "step_s": 3.0, "rollout_s": 2.0, "update_s": 1.0})
    run.log_metrics({"phase": "eval", "step": 1, "eval/success": 0.5, "eval/reward": 0.5})
    (run.path / "checkpoints").mkdir()
    assert main(["report", str(run.path)]) == 0
    assert "no training step" not in capsys.readouterr().out
