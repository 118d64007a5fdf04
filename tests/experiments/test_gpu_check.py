"""benchmarks/gpu_check.sh, the one-command GPU comparison, run end to end at a tiny size on CPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.experiments.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--set steps=1 --set tasks_per_step=1 --set group_size=2 --set worlds=[shop] --set sft.trajectories=2 "
        "--set sft.simulator_trajectories=1 --set sft.epochs=1 --set eval.tasks=2 --set eval.samples=2 "
        "--set rollout.caller_max_new_tokens=8 --set rollout.simulator_max_new_tokens=8 --set lora.r=2 "
        "--set threads=1 --set checkpoint.every=1")


@pytest.mark.slow  # four tiny training jobs in subprocesses
def test_gpu_check_runs_every_source_from_one_warm_start_and_prints_the_paired_table(tmp_path):
    env = {**os.environ, "SETS": TINY, "DEVICE": "cpu", "PRECISION": "bf16",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "check"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "tiny", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "table.md").read_text().splitlines()
    rows = [r for r in table if r.startswith("| /") or r.startswith(f"| {out}")]
    assert len(rows) == 3 and all("(start run)" in r for r in rows), table
    base = RunDir.open(next((out / "rehearsal").iterdir()))
    assert base.config()["sft"]["init_from"] is None  # the one warm start is trained here
    assert base.config()["mixed_precision"] == "bf16"
    for src in ("real", "simulator"):
        cfg = RunDir.open(next((out / src).iterdir())).config()
        assert cfg["source"] == src and cfg["sft"]["init_from"] == str(base.path / "sft")
        assert cfg["eval"]["at_start"] is False
    assert (out / "curves.png").stat().st_size > 0 and "no GPU" in (out / "machine.txt").read_text()
