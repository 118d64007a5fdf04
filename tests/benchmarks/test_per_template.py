"""benchmarks/per_template.py --failures: how a template's eval episodes failed, start -> end,
read from a real run directory (a tiny run's step-0 eval, plus a later eval written as a run
would write it)."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

from envace.experiments.config import load_config
from envace.experiments.train_job import train

ROOT = Path(__file__).resolve().parents[2]


def _episode(task_id: str, step: int, reward: float, parse_failures: int, unmet: list[str]) -> dict:
    kinds = ["called", "state", "answer_contains", "answer_plain"]
    return {"task_id": task_id, "step": step, "kind": "eval", "source": "real", "trajectory_index": 0,
            "messages": [{"role": "user", "content": "q"}], "reward": reward, "parse_failures": parse_failures,
            "verdicts": [{"item": {"kind": k}, "met": k not in unmet, "detail": ""} for k in kinds]}


def test_failure_modes_are_shares_of_the_templates_episodes(tmp_path):
    cfg = {"model": "tiny", "worlds": ["shop"], "difficulties": [1], "tool_distractors": 0, "steps": 0,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 6, "max_batch": 8},
           "prompt": {"max_examples": 1}, "sft": {"enabled": False}, "eval": {"tasks": 1, "samples": 2, "temperature": 1.0},
           "out": str(tmp_path / "runs")}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = train(load_config(path), log=lambda *_: None)
    evals = run.path / "evals.jsonl"
    first = [json.loads(line) for line in evals.read_text().splitlines()]
    tid = first[0]["task_id"]
    # step 1 of that task: one malformed call that failed a tool check, one answer-only failure, one success
    later = [_episode(tid, 1, 0.0, 2, ["called", "state"]), _episode(tid, 1, 0.5, 0, ["answer_contains"]),
             _episode(tid, 1, 1.0, 0, [])]
    with evals.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in later)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/per_template.py"), str(run.path), "--failures"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    table = out.stdout.split("start -> end")[1]
    row = next(line for line in table.splitlines() if line.startswith("| shop: "))
    start = first  # one task: one template
    cells = [c.strip() for c in row.split("|")[2:5]]
    assert [c.split(" -> ")[1] for c in cells] == ["0.333", "0.333", "0.333"]
    # the start side counts the tiny model's own episodes: every one failed, none solved
    shares = [float(c.split(" -> ")[0]) for c in cells]
    assert shares[1] + shares[2] == 1.0 and shares[0] == sum(e["parse_failures"] > 0 for e in start) / len(start)
