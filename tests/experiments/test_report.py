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


def _train_rows(rewards):
    return [{"phase": "train", "step": i + 1, "reward": r, "success": 0.0, "tool_calls": 1.0,
             "sim_format_failures": 0.0, "step_s": 1.0, "rollout_s": 0.5, "update_s": 0.5}
            for i, r in enumerate(rewards)]


def _evals(run, step, wins, rehearsal=None):
    import json

    with (run.path / "evals.jsonl").open("a") as f:
        for i, w in enumerate(wins):
            f.write(json.dumps({"step": step, "kind": "eval", "task_id": f"t{i}", "source": "real", "messages": [],
                                "reward": 1.0 if w else 0.0}) + "\n")
    row = {"phase": "eval", "step": step, "eval_kind": "real", "eval/success": sum(wins) / len(wins),
           "eval/reward": sum(wins) / len(wins)}
    if rehearsal is not None:
        row.update({"eval/rehearsal_success": rehearsal, "eval/rehearsal_gap": rehearsal - row["eval/success"],
                    "eval/fidelity_n": 12.0, "eval/fidelity_exact": 0.25, "eval/fidelity_structure": 0.5})
    run.log_metrics(row)


def test_the_summary_says_when_training_reward_rose_and_real_success_did_not(tmp_path):
    from envace.experiments.report import reward_without_success, write_train_report

    cfg = {"source": "rehearsal", "seed": 0, "steps": 8}
    flat = RunDir.create(tmp_path / "flat", "train", cfg, seed=0)
    _evals(flat, 0, [1, 0, 0, 0, 0, 0, 0, 0])
    for r in _train_rows([0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5]):
        flat.log_metrics(r)
    _evals(flat, 8, [1, 0, 0, 0, 0, 0, 0, 0], rehearsal=0.5)
    text = write_train_report(flat).read_text()
    assert "Training reward rose while real-world success did not." in text
    assert "from 0.100 (first 2 steps) to 0.500 (last 2)" in text and "moved +0.000" in text
    assert "succeeds 0.500 when it rehearses" in text and "gap +0.375" in text and "25% of the 12 calls" in text
    assert "## Rehearsal gap and fidelity" in text and "| 8 | 0.125 | 0.500 | +0.375 | 12 | 0.250 |" in text

    # Real success that rose by more than two paired standard errors: no such paragraph.
    up = RunDir.create(tmp_path / "up", "train", cfg, seed=0)
    _evals(up, 0, [0] * 8)
    for r in _train_rows([0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5]):
        up.log_metrics(r)
    _evals(up, 8, [1, 1, 1, 1, 1, 1, 0, 0])
    assert "did not" not in write_train_report(up).read_text()
    # Flat training reward: nothing to say either.
    rows = _train_rows([0.3] * 8)
    ev = [{"step": 0, "eval/success": 0.1}, {"step": 8, "eval/success": 0.1}]
    assert reward_without_success(cfg, rows, ev) is None
    assert reward_without_success(cfg, _train_rows([0.0, 0.0, 0.6, 0.6]), ev) is not None
