"""`envace train` on 2 CPU processes (gloo), launched the way a user launches it:
``accelerate launch --num_processes 2 -m envace.cli.main train --config ...``.

One run of 1 step, then ``--resume`` to step 2, both on 2 processes, with DDP and with FSDP
(``--set parallel=fsdp``: sharded training, a whole-weight replica per rank for rollouts). Checked:

* the run directory is complete and written once (one directory, one row per step, every rank's
  trajectories gathered, checkpoints, evals, report);
* the first update equals the update one process takes on the same global batch (the 2-process
  run's step-1 trajectories, read back from its trajectories.jsonl): same weights after the step,
  same loss and gradient norm;
* the resumed run continues from the checkpoint on both ranks (the job itself checks, at every
  checkpoint, that the ranks' weights are equal) and writes step 2 once;
* the checkpoint loads as a model (``envace eval --model <checkpoint>``).

The tasks are real shop tasks (real SQLite worlds for the evals) whose checklist caps the final
answer's length at a few sizes (``answer_plain``, each cap exceeded halves the reward): the tiny
random model's answers vary in length, so it earns rewards that differ within a group, and the
step has nonzero advantages to learn from. (Letters inside words would not do: ``answer_contains``
matches whole words only.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from scale_helpers import finish, launch_two

from envace.core.jsonl import read_jsonl_dicts
from envace.core.types import ChecklistItem, Trajectory
from envace.experiments.config import parse_config
from envace.experiments.rundir import RunDir
from envace.experiments.tasks import select_tasks
from envace.experiments.tasksets import step_tasks, train_tasks
from envace.experiments.train_job import CKPT_DIR, prepare, rl_tasks
from envace.policy.loading import load_model
from envace.train.advantages import advantage_stats, compute_advantages
from envace.train.step import update_for_mode

TIMEOUT_S = 900  # each launch is ~20 s of CPU; a shared, loaded 2-core box stretches that to minutes
CAPS = (40, 48, 56, 64)  # the tiny model's 8-token answers run about 35 to 65 characters
TASKS_PER_STEP, G, EVAL_TASKS = 3, 2, 3  # 3 tasks on 2 ranks: uneven shards (2 and 1)


def _task_file(path: Path) -> Path:
    tasks = select_tasks("shop", "all", None, difficulties=[1], tool_distractors=0, tasks_per_world=60)
    checklist = [ChecklistItem(kind="answer_plain", max_chars=c) for c in CAPS]
    # A short reference answer meets every cap, so the oracle trajectories of the SFT warm start still score 1.
    rows = [t.model_copy(update={"checklist": checklist, "reference": t.reference.model_copy(
        update={"answer": "Done."})}).model_dump(mode="json", exclude_none=True)
        for t in tasks]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tmp: Path) -> Path:
    cfg = {
        "model": "tiny", "task_file": str(_task_file(tmp / "tasks.jsonl")), "tool_distractors": 0, "steps": 1,
        "tasks_per_step": TASKS_PER_STEP, "group_size": G, "threads": 1,
        # fp32, no anchor, no caller repeats and the SFT rate as set, as the 1-process reference update
        # below computes it: a task-file run would otherwise take the fitted recipe's bf16, warm-start
        # anchor, sft.caller_repeats and sft.lr (experiments/data_defaults.py)
        "rollout": {"max_turns": 2, "caller_max_new_tokens": 8, "simulator_max_new_tokens": 8, "max_batch": 8,
                    "dtype": "float32", "temperature": 1.0, "simulator_temperature": None},
        "mixed_precision": "no",
        "prompt": {"max_examples": 1},
        "grpo": {"lr": 1e-3, "anchor_coef": 0.0, "warmup_steps": 0, "norm_by_std": False},
        "lora": {"enabled": True, "r": 2, "alpha": 4},
        "sft": {"trajectories": 2, "epochs": 1, "caller_repeats": 1, "lr": 2e-4},
        "eval": {"every": 0, "tasks": EVAL_TASKS, "samples": 1},  # set: a task file would get fitted samples
        "checkpoint": {"every": 1, "keep_last": 3},
        "out": str(tmp / "runs"),
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _launch(tmp: Path, *args: str) -> subprocess.Popen:
    """What a user types: ``accelerate launch ... -m envace.cli.main train ARGS``."""
    return launch_two(["-m", "envace.cli.main", "train", *args], tmp)


def _wait(proc: subprocess.Popen) -> str:
    code, output = finish(proc, TIMEOUT_S)
    assert code == 0, f"accelerate launch exited {code}:\n{output[-6000:]}"
    return output


def _rows(run: RunDir) -> list[tuple[str, int]]:
    return [(r["phase"], r["step"]) for r in run.metrics()]


def _step_trajectories(run_path: Path, step: int) -> list[Trajectory]:
    rows = [r for r in read_jsonl_dicts(run_path / "trajectories.jsonl") if r["step"] == step]
    return [Trajectory.model_validate({k: v for k, v in r.items() if k not in ("step", "kind")}) for r in rows]


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _as_run(src: Path, dst: Path, checkpoints: bool) -> Path:
    """A copy of a run directory to prepare() a 1-process state from (with or without its checkpoints)."""
    shutil.copytree(src, dst, ignore=None if checkpoints else shutil.ignore_patterns(CKPT_DIR))
    return dst


@pytest.mark.slow  # two training processes plus the one-process reference: ~1 CPU-minute each
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_train_on_two_processes_matches_one_and_resumes(tmp_path, parallel):
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    cfg_path = _config(tmp_path)
    out1 = _wait(_launch(tmp_path, "--config", str(cfg_path), "--set", f"parallel={parallel}"))
    t_first = time.perf_counter() - t0

    # ---- the run directory: complete, written once
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, runs  # only rank 0 created a run directory
    run = RunDir(runs[0])
    assert out1.count("done: ") == 1 and out1.count("run directory: ") == 1
    for name in ("config.yaml", "meta.json", "trajectories.jsonl", "metrics.jsonl", "evals.jsonl", "summary.md",
                 "learning_curve.png", "sft", f"{CKPT_DIR}/step-00000001/trainer_state.json"):
        assert (run.path / name).exists(), name
    assert [r for r in _rows(run) if r[0] != "sft"] == [("eval", 0), ("train", 1), ("eval", 1)]
    cfg = parse_config(run.config())
    assert cfg.parallel == parallel  # kept in the run's config: --resume trains the same way
    saved_opt = torch.load(run.path / CKPT_DIR / "step-00000001" / "optimizer-policy.pt", weights_only=True)
    # FSDP saves the full state gathered from the shards (keyed by parameter name), DDP rank 0's optimiser's own.
    assert isinstance(saved_opt["param_groups"][0]["params"][0], str) == (parallel == "fsdp")
    want_tasks = [t.id for t in step_tasks(rl_tasks(cfg, train_tasks(cfg)), cfg, 1)]
    trajs = _step_trajectories(run.path, 1)  # both ranks' trajectories, in the step's task order
    assert [(t.task_id, t.trajectory_index) for t in trajs] == [(t, g) for t in want_tasks for g in range(G)]
    evals = read_jsonl_dicts(run.path / "evals.jsonl")
    assert sorted(r["step"] for r in evals) == [0] * EVAL_TASKS + [1] * EVAL_TASKS
    row1 = next(r for r in run.metrics() if r["phase"] == "train")
    assert row1["policy/processes"] == 2.0 and row1["policy/optimizer_steps"] == 1.0, row1
    assert row1["adv_zero_frac/caller"] < 1.0  # something to learn from: the comparison below means something

    # ---- resume to step 2 on 2 processes, while this process computes the 1-process reference
    before = (run.path / "metrics.jsonl").read_text()
    ref_start = _as_run(run.path, tmp_path / "ref-start", checkpoints=False)
    ref_step1 = _as_run(run.path, tmp_path / "ref-step1", checkpoints=True)
    t1 = time.perf_counter()
    resumed = _launch(tmp_path, "--resume", str(run.path), "--set", "steps=2")

    quiet = lambda *_: None  # noqa: E731
    one = prepare(cfg, ref_start, quiet)  # the warm-started policy both runs started from
    assert one.accelerator is None and one.start_step == 0
    start = _trainable(one.models.trained["policy"])
    tok = one.models.tokenizer
    scored = compute_advantages(trajs, norm_by_std=cfg.grpo.norm_by_std, empty_penalty=cfg.grpo.empty_penalty,
                                content_free_ids={tok.eos_token_id}, format_bonus=cfg.grpo.sim_format_reward)
    ref_stats = update_for_mode(one.models.spec, one.updaters, scored)
    want = _trainable(one.models.trained["policy"])
    two = prepare(cfg, ref_step1, quiet)  # loads the 2-process run's step-1 checkpoint (weights and optimiser)
    assert two.start_step == 1
    got = _trainable(two.models.trained["policy"])
    loaded, _ = load_model(str(ref_step1 / CKPT_DIR / "step-00000001" / "policy"))  # what `envace eval --model` loads
    adapter = dict(loaded.named_parameters())
    assert all(torch.equal(adapter[k], v) for k, v in got.items())

    assert got.keys() == want.keys() and len(got) > 0
    moved = max((want[k] - start[k]).abs().max().item() for k in want)
    assert moved > 1e-5, "the 1-process update did not move the weights"
    gap = max((got[k] - want[k]).abs().max().item() for k in want)
    for k in want:
        torch.testing.assert_close(got[k] - start[k], want[k] - start[k], rtol=1e-4, atol=1e-6, msg=k)
    for k in ("policy/loss", "policy/grad_norm", "policy/entropy", "policy/ratio_mean"):
        if k in ref_stats:
            assert row1[k] == pytest.approx(ref_stats[k], rel=1e-4, abs=1e-6), k
    for k in ("policy/tokens", "policy/samples/caller", "policy/skipped_zero_adv", "policy/optimizer_steps"):
        assert row1[k] == ref_stats[k], k
    for k, v in advantage_stats(scored).items():
        assert row1[k] == pytest.approx(v, abs=1e-12), k
    grad_rel = abs(row1["policy/grad_norm"] - ref_stats["policy/grad_norm"]) / ref_stats["policy/grad_norm"]
    print(f"\n{parallel}: 2 vs 1 process, step 1: max |update difference| {gap:.2e} (largest update {moved:.2e}); "
          f"grad norm {row1['policy/grad_norm']:.6g} vs {ref_stats['policy/grad_norm']:.6g} (rel {grad_rel:.1e}); "
          f"loss {row1['policy/loss']:.6g} vs {ref_stats['policy/loss']:.6g}")

    # ---- the resumed run
    out2 = _wait(resumed)
    t_resume = time.perf_counter() - t1
    assert out2.count("done: ") == 1 and "resuming" in out2
    assert [r for r in _rows(run) if r[0] != "sft"] == [("eval", 0), ("train", 1), ("eval", 1), ("train", 2),
                                                         ("eval", 2)]
    assert (run.path / "metrics.jsonl").read_text().startswith(before)  # steps 1 and before kept as they were
    assert [t.task_id for t in _step_trajectories(run.path, 2)] == \
        [t.id for t in step_tasks(rl_tasks(cfg, train_tasks(cfg)), cfg, 2) for _ in range(G)]
    assert len(_step_trajectories(run.path, 1)) == TASKS_PER_STEP * G  # not written again
    assert (run.path / CKPT_DIR / "step-00000002" / "trainer_state.json").exists()
    # The optimiser state was restored, not restarted: AdamW has counted both steps.
    saved2 = torch.load(run.path / CKPT_DIR / "step-00000002" / "optimizer-policy.pt", weights_only=True)
    assert saved2["state"] and all(float(v["step"]) == 2.0 for v in saved2["state"].values())
    assert len(list((tmp_path / "runs").iterdir())) == 1
    print(f"first launch (1 step) {t_first:.0f} s, resumed launch (step 2) + reference {t_resume:.0f} s")


@pytest.mark.slow  # one 2-process launch: ~1 CPU-minute
def test_dynamic_sampling_on_two_processes_agrees_on_its_rounds(tmp_path):
    """Both ranks roll out the same rounds (a rank that stopped early would hang the other), the
    row counts every rank's groups with signal, and every round's tasks are fresh."""
    from envace.train.advantages import groups_with_signal

    torch.set_num_threads(1)
    cfg_path = _config(tmp_path)
    _wait(_launch(tmp_path, "--config", str(cfg_path), "--set", "dynamic_sampling=2", "--set", "eval.at_start=false"))
    run = RunDir(next((tmp_path / "runs").iterdir()))
    cfg = parse_config(run.config())
    row = next(r for r in run.metrics() if r["phase"] == "train")
    trajs = _step_trajectories(run.path, 1)
    eos = load_model(cfg.model)[1].eos_token_id
    signal = groups_with_signal(compute_advantages(trajs, norm_by_std=cfg.grpo.norm_by_std, content_free_ids={eos},
                                                   empty_penalty=cfg.grpo.empty_penalty))
    rounds = int(row["rollout_rounds"])
    assert 1 <= rounds <= 3 and row["groups_trained"] == len(signal)
    assert len(signal) >= TASKS_PER_STEP or rounds == 3
    ids = [t.task_id for t in trajs[::G]]
    assert len(ids) == len(set(ids)) == TASKS_PER_STEP * rounds
    assert ids[:TASKS_PER_STEP] == [t.id for t in step_tasks(rl_tasks(cfg, train_tasks(cfg)), cfg, 1)]
    assert row["policy/processes"] == 2.0
