"""benchmarks/bench_testtime.py: a budget sweep on a benchmark, each budget one `envace eval --bench`
run on the same entries, then the paired table (real runs of the tiny model on BFCL multi-turn)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_testtime  # noqa: E402


def test_budget_sweep_on_a_benchmark_pairs_the_entries(tmp_path, capsys):
    args = ["--bench", "bfcl", "--category", "multi_turn_base", "--limit", "2", "--model", "tiny",
            "--budgets", "0,1", "--out", str(tmp_path), "--", "--max-new-tokens", "8", "--max-steps", "2"]
    assert bench_testtime.main(args) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "b0" / "rehearsals.jsonl").exists()
    rehearsed = [json.loads(x) for x in (tmp_path / "b1" / "rehearsals.jsonl").read_text().splitlines()]
    assert len(rehearsed) == 2  # one imagined episode per entry
    assert set(bench_testtime.scores(tmp_path / "b0")) == set(bench_testtime.scores(tmp_path / "b1"))
    assert bench_testtime.tokens(tmp_path / "b1") > bench_testtime.tokens(tmp_path / "b0") > 0
    rows = [line for line in out.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert len(rows) == 2 and rows[0].split("|")[4].strip() == "-" and "[" in rows[1].split("|")[4]
    # a finished budget is not run again
    (tmp_path / "b1" / "rehearsals.jsonl").unlink()
    assert bench_testtime.main(args) == 0
    assert not (tmp_path / "b1" / "rehearsals.jsonl").exists()
