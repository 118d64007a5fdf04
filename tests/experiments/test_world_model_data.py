"""benchmarks/world_model_data.sh run end to end at a tiny size: two SFT stages on one adapter and a
fidelity table for each model."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from envace.experiments.config import load_config
from envace.experiments.train_job import train

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny", "worlds=[bank]", "difficulties=[1]", "tool_distractors=0", "sft.trajectories=2",
        "sft.epochs=1", "rollout.caller_max_new_tokens=8", "rollout.simulator_max_new_tokens=8", "lora.r=2",
        "lora.alpha=4", "threads=1", "tasks_per_world=40", "eval.tasks=2"]


@pytest.mark.slow  # three tiny SFT runs and three fidelity evals in subprocesses
def test_world_model_data_trains_one_adapter_in_two_stages_and_measures_each(tmp_path):
    warm = train(load_config(ROOT / "configs" / "smollm2_cpu.yaml", TINY + ["steps=0", "out=" + str(tmp_path / "w")]),
                 log=lambda *_: None)
    env = {**os.environ, "SETS": " ".join(f"--set {s}" for s in TINY[1:]),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "wmd"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "world_model_data.sh"), str(warm.path), str(out), "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    adapters = [load_file(next((out / stage).glob("train-*")) / "sft" / "step-00000000" / "adapter_model.safetensors")
                for stage in ("sim", "probes")]
    first = load_file(warm.path / "sft" / "step-00000000" / "adapter_model.safetensors")
    assert first.keys() == adapters[0].keys() == adapters[1].keys()  # one adapter trained on, stage by stage
    for a, b in ((first, adapters[0]), (adapters[0], adapters[1])):
        assert any(not (a[k] == b[k]).all() for k in a)
    for name in ("warm", "sim", "probes"):
        assert "| probe | bank |" in (out / "fidelity" / name / "summary.md").read_text()
    assert proc.stdout.count("| oracle | bank |") == 3
