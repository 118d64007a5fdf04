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
    proc = subprocess.Popen([sys.executable, "-m", "envace.cli.main", "train", "--config", str(SMOKE),
                             "--set", "out=runs"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
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
