"""benchmarks/eval_sides.py: one model, a training config's held-out tasks, two sets of overrides,
rounds alternated; a real tiny model and real worlds."""

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_two_override_sets_alternate_and_pair(tmp_path):
    cfg = {"model": "tiny", "worlds": ["shop"], "difficulties": [1], "tool_distractors": 0,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 6, "max_batch": 8},
           "prompt": {"max_examples": 1}, "eval": {"temperature": 0.7}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/eval_sides.py"), "--config", str(path),
                          "--model", "tiny", "--a", "rollout.kv_reuse_tokens=0", "--b",
                          "rollout.kv_reuse_tokens=4096", "--tasks", "2", "--samples", "2", "--rounds", "2"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|")[2].strip() for line in out.stdout.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()]
    assert rows == ["A", "B", "B", "A"]
    assert "B speed-up (median A s / median B s):" in out.stdout
    assert "success, B minus A, paired over 2 tasks:" in out.stdout
