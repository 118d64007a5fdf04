import json

import pytest
import torch

from envace.cli.main import main
from envace.experiments.config import ConfigError, load_config
from envace.experiments.rundir import RunDir
from envace.experiments.train_job import train

TINY = {
    "model": "tiny", "worlds": ["shop"], "difficulties": [1], "tool_distractors": 0, "steps": 2,
    "tasks_per_step": 2, "group_size": 2,
    "rollout": {"max_turns": 2, "caller_max_new_tokens": 8, "simulator_max_new_tokens": 8, "max_batch": 8},
    "prompt": {"max_examples": 1},
    "grpo": {"lr": 1e-3},
    "lora": {"enabled": True, "r": 2, "alpha": 4},
    "sft": {"trajectories": 2, "epochs": 1},
    "eval": {"every": 0, "tasks": 2},
    "checkpoint": {"every": 1, "keep_last": 2},
}


def _cfg(tmp_path, **over):
    import yaml

    data = json.loads(json.dumps(TINY))
    data["out"] = str(tmp_path / "runs")
    data.update(over)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_bad_config_names_file_and_field(tmp_path):
    path = _cfg(tmp_path, grpo={"lr": -1})
    with pytest.raises(ConfigError, match=r"cfg.yaml: field 'grpo.lr'"):
        load_config(path)
    path = _cfg(tmp_path, rollout={"max_turn": 3})
    with pytest.raises(ConfigError, match=r"field 'rollout.max_turn': Extra inputs"):
        load_config(path)
    assert main(["train", "--config", str(path)]) == 2  # one clear line, no traceback
    with pytest.raises(ConfigError, match=r"field 'device'"):
        load_config(_cfg(tmp_path, device="gpu0"))
    assert load_config(_cfg(tmp_path, device="cuda:1")).device == "cuda:1"


def _assert_tensorboard_mirrors(run: RunDir, evals: list[dict]) -> None:
    """With report_to tensorboard (the test extra has it), the eval rows are also scalars there."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        pytest.skip("tensorboard not installed")
    acc = EventAccumulator(str(run.path / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("eval/success")]
    assert got == [(r["step"], pytest.approx(r["eval/success"])) for r in evals]
    assert "train/reward" in acc.Tags()["scalars"]


def _train_rows(run: RunDir):
    return {r["step"]: r for r in run.metrics() if r["phase"] == "train"}


def test_train_writes_a_complete_run_and_resume_reproduces_the_next_step(tmp_path):
    warm = {"lr": 1e-3, "warmup_steps": 2}  # the lr ramp must survive the resume too
    full = train(load_config(_cfg(tmp_path, report_to=["tensorboard"], grpo=warm),
                             ["steps=3", "out=" + str(tmp_path / "a")]), log=lambda *_: None)
    rows = _train_rows(full)
    assert sorted(rows) == [1, 2, 3]
    assert [rows[s]["policy/lr"] for s in (1, 2, 3)] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])
    for name in ("config.yaml", "meta.json", "trajectories.jsonl", "metrics.jsonl", "evals.jsonl",
                 "summary.md", "learning_curve.png"):
        assert (full.path / name).exists(), name
    assert sorted(p.name for p in (full.path / "checkpoints").iterdir() if p.name.startswith("step-")) == \
        ["step-00000002", "step-00000003"]
    assert (full.path / "checkpoints" / "step-00000003" / "policy" / "adapter_config.json").exists() or \
        any((full.path / "checkpoints" / "step-00000003").rglob("adapter_config.json"))
    evals = [r for r in full.metrics() if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 3]
    _assert_tensorboard_mirrors(full, evals)

    # A run stopped after step 2, then resumed, does the same step 3 as the uninterrupted run.
    part = train(load_config(_cfg(tmp_path, grpo=warm), ["out=" + str(tmp_path / "b")]), log=lambda *_: None)
    assert sorted(_train_rows(part)) == [1, 2]
    for k in ("reward", "policy/loss"):
        assert _train_rows(part)[1][k] == pytest.approx(rows[1][k], abs=1e-6)  # same seed, same first step
    resumed_cfg = load_config(None, [])  # the CLI path reads the run's own config; mirror it here
    from envace.experiments.config import apply_overrides, parse_config

    resumed_cfg = parse_config(apply_overrides(part.config(), ["steps=3"]))
    resumed = train(resumed_cfg, resume=part.path, log=lambda *_: None)
    again = _train_rows(resumed)
    assert sorted(again) == [1, 2, 3]
    for k in ("reward", "policy/loss", "policy/lr"):
        assert again[3][k] == pytest.approx(rows[3][k], rel=1e-4, abs=1e-6), k


def test_resume_drops_log_rows_after_the_checkpoint(tmp_path):
    run = train(load_config(_cfg(tmp_path), ["steps=1", "out=" + str(tmp_path / "c")]), log=lambda *_: None)
    # as if the process died after logging step 2 but before its checkpoint
    run.log_metrics({"phase": "train", "step": 2, "reward": 123.0})
    resumed = train(load_config(None, []).model_validate({**run.config(), "steps": 2}), resume=run.path,
                    log=lambda *_: None)
    assert _train_rows(resumed)[2]["reward"] != 123.0
    assert [r["step"] for r in resumed.metrics() if r["phase"] == "train"] == [1, 2]


def test_a_killed_run_resumes_and_redoes_the_lost_step_identically(tmp_path):
    """SIGKILL mid-run (no clean shutdown), then ``envace train --resume``: the steps after the
    last checkpoint are redone exactly as an uninterrupted run does them."""
    import os
    import subprocess
    import sys

    # The child kills itself at a fixed point -- step 3 logged, its checkpoint not yet written -- so
    # the test does not race the run (polling from outside missed the window on a fast CI machine).
    crash = (
        "import os, signal, sys\n"
        "from envace.experiments import train_job\n"
        "from envace.cli.main import main\n"
        "save = train_job.save_checkpoint\n"
        "def save_or_die(*a, step, **k):\n"
        "    if step == 3:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return save(*a, step=step, **k)\n"
        "train_job.save_checkpoint = save_or_die\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    steps = 6
    cfg = _cfg(tmp_path, steps=steps)
    full = train(load_config(cfg, ["out=" + str(tmp_path / "full")]), log=lambda *_: None)
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", crash, "train", "--config", str(cfg), "--set", f"out={out}"],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=240)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    (run_dir,) = list(out.iterdir())
    done = sorted(r["step"] for r in RunDir(run_dir).metrics() if r["phase"] == "train")
    assert done == [1, 2, 3]  # step 3 was logged but never checkpointed: it is the lost step
    assert main(["train", "--resume", str(run_dir)]) == 0
    again, rows = _train_rows(RunDir(run_dir)), _train_rows(full)
    assert sorted(again) == list(range(1, steps + 1))
    for step in range(3, steps + 1):
        for k in ("reward", "policy/loss"):
            assert again[step][k] == pytest.approx(rows[step][k], rel=1e-4, abs=1e-6), (step, k)


def test_grpo_draws_from_train_tasks_the_warm_start_did_not_imitate(tmp_path):
    from envace.experiments.tasksets import train_tasks
    from envace.experiments.train_job import rl_tasks, sft_tasks

    cfg = load_config(_cfg(tmp_path), ["sft.trajectories=5"])
    pool = train_tasks(cfg)
    seen = {t.id for t in sft_tasks(cfg, pool)}
    fresh = rl_tasks(cfg, pool)
    assert len(seen) == 5 and len(fresh) == len(pool) - 5 and not seen & {t.id for t in fresh}
    assert rl_tasks(load_config(_cfg(tmp_path), ["rl_fresh_tasks=false"]), pool) == pool
    assert rl_tasks(load_config(_cfg(tmp_path), ["sft.enabled=false"]), pool) == pool
    everything = load_config(_cfg(tmp_path), [f"sft.trajectories={len(pool)}"])
    assert rl_tasks(everything, pool) == pool  # nothing left over: fall back to all of them


def test_the_warm_start_renders_its_simulator_samples_in_the_runs_simulator_context(tmp_path):
    # The rehearse role must be SFT'd in the context it will see during RL and eval.
    from envace.experiments.tasksets import train_tasks
    from envace.experiments.train_job import sft_tasks, warm_start_samples
    from envace.policy.loading import load_model

    _, tok = load_model("tiny")
    prompts = {}
    for context in ("call", "conversation"):
        cfg = load_config(_cfg(tmp_path), ["sft.trajectories=2", f"prompt.simulator_context={context}"])
        tasks = sft_tasks(cfg, train_tasks(cfg))
        sims = [s for s in warm_start_samples(cfg, tasks, tok) if s.role == "simulator"]
        assert sims
        prompts[context] = [tok.decode(s.prompt_ids) for s in sims]
        requests = [any(t.instruction in p for t in tasks) for p in prompts[context]]
        assert all(requests) if context == "conversation" else not any(requests)
    assert len(prompts["conversation"]) == len(prompts["call"])
    assert all(len(a) > len(b) for a, b in zip(prompts["conversation"], prompts["call"]))


def test_rl_pool_keeps_grpo_on_the_same_few_tasks_and_the_eval_can_run_on_them(tmp_path):
    from envace.experiments.tasksets import train_tasks
    from envace.experiments.train_job import rl_tasks

    cfg = load_config(_cfg(tmp_path), ["steps=3", "rl_pool=3", "eval.split=pool", "eval.tasks=5",
                                       "out=" + str(tmp_path / "p")])
    run = train(cfg, log=lambda *_: None)
    trajs = [json.loads(line) for line in (run.path / "trajectories.jsonl").open()]
    by_step = {}
    for t in trajs:
        by_step.setdefault(t["step"], set()).add(t["task_id"])
    used = set().union(*by_step.values())
    fresh = {t.id for t in rl_tasks(cfg, train_tasks(cfg))}
    assert sorted(by_step) == [1, 2, 3] and all(len(ids) == 2 for ids in by_step.values())
    assert len(used) <= 3 < len(fresh) and used <= fresh  # 6 draws from the same 3 fresh tasks
    # eval.split=pool: the real-world eval runs on those 3 tasks (all of them: fewer than eval.tasks)
    evals = [json.loads(line) for line in (run.path / "evals.jsonl").open()]
    for step in (0, 3):
        ids = {t["task_id"] for t in evals if t["step"] == step}
        assert len(ids) == 3 and used <= ids <= fresh
    # and the report does not call them held-out
    summary = (run.path / "summary.md").read_text()
    assert "## Real-world evaluation (the trained tasks (GRPO pool), greedy)" in summary and "held-out" not in summary
    # with the gain between the first and the last eval, paired over those tasks
    succ = {s: {t["task_id"]: float(t["reward"] >= 1.0) for t in evals if t["step"] == s} for s in (0, 3)}
    gain = sum(succ[3][k] - succ[0][k] for k in succ[0]) / 3
    assert f"Success gain from step 0 to step 3: **{gain:+.3f}**" in summary and "over 3 tasks" in summary


def test_a_data_vocabulary_run_trains_resumes_warm_starts_others_and_its_checkpoint_evaluates(tmp_path):
    """``sft.vocab``: a from-scratch model gets a tokenizer trained on the warm start's text; the
    tokenizer travels with the warm start and every checkpoint, so resume, ``sft.init_from`` and
    ``envace eval --model <checkpoint>`` all get the model's own vocabulary back."""
    from envace.experiments.config import apply_overrides, parse_config
    from envace.policy.loading import load_model
    from envace.train.checkpoint import resolve_checkpoint

    over = ["model=llama:64x1", "sft.vocab=512", "lora.enabled=false", "sft.trajectories=4", "steps=1"]
    cfg = load_config(_cfg(tmp_path), over + ["out=" + str(tmp_path / "v")])
    run = train(cfg, log=lambda *_: None)
    ckpt = run.path / "checkpoints" / "step-00000001" / "policy"
    model, tok = load_model(str(ckpt))
    assert len(tok) <= 512 and model.get_input_embeddings().weight.shape[0] == len(tok)
    assert tok.get_vocab() == load_model(str(resolve_checkpoint(run.path / "sft")))[1].get_vocab()
    first = _train_rows(run)[1]

    # resume rebuilds the model on the saved tokenizer and goes on
    resumed = train(parse_config(apply_overrides(run.config(), ["steps=2"])), resume=run.path, log=lambda *_: None)
    assert sorted(_train_rows(resumed)) == [1, 2]
    assert _train_rows(resumed)[1] == first

    # another run from this warm start: same vocabulary, same first step
    again = train(load_config(_cfg(tmp_path), over + ["out=" + str(tmp_path / "w"),
                                                      f"sft.init_from={run.path / 'sft'}"]), log=lambda *_: None)
    assert _train_rows(again)[1]["reward"] == pytest.approx(first["reward"])
    assert _train_rows(again)[1]["policy/loss"] == pytest.approx(first["policy/loss"], rel=1e-5, abs=1e-7)
    # a warm start without the data vocabulary cannot seed a run that wants one
    plain = train(load_config(_cfg(tmp_path), ["steps=0", "lora.enabled=false", "out=" + str(tmp_path / "p")]),
                  log=lambda *_: None)
    with pytest.raises(ValueError, match="sft.vocab: the warm start .* 49152-token vocabulary"):
        train(load_config(_cfg(tmp_path), over + ["out=" + str(tmp_path / "x"),
                                                  f"sft.init_from={plain.path / 'sft'}"]), log=lambda *_: None)

    assert main(["eval", "--model", str(ckpt.parent), "--world", "shop", "--tasks", "1",
                 "--max-new-tokens", "4", "--out", str(tmp_path / "e")]) == 0


def test_a_data_vocabulary_needs_a_scratch_model_and_the_warm_start(tmp_path):
    with pytest.raises(ConfigError, match="sft.vocab"):
        load_config(_cfg(tmp_path), ["sft.vocab=512"])  # model: tiny
    with pytest.raises(ConfigError, match="sft.vocab.*sft.enabled"):
        load_config(_cfg(tmp_path), ["model=llama:64x1", "sft.vocab=512", "sft.enabled=false"])


def test_turns_cut_off_at_the_token_cap_are_counted_and_warned_about_once(tmp_path):
    said = []
    run = train(load_config(_cfg(tmp_path), ["steps=2", "out=" + str(tmp_path / "t")]), log=said.append)
    rows = _train_rows(run)
    trajs = [json.loads(line) for line in (run.path / "trajectories.jsonl").open()]
    for step, row in rows.items():
        samples = [s for t in trajs if t["step"] == step for s in t["samples"] if s["role"] == "caller"]
        cut = sum(s["finish"] == "length" for s in samples)
        # an untrained model rarely ends within 8 tokens: the cap cuts most turns
        assert samples and row["truncated/caller"] == pytest.approx(cut / len(samples)) and cut > 0
    evals = [r for r in run.metrics() if r["phase"] == "eval"]
    assert evals and all(0 < r["eval/truncated/caller"] <= 1 for r in evals)
    warnings = [s for s in said if isinstance(s, str) and s.startswith("warning:")]
    # before any rollout, from the warm start's oracle turns; then from the rollouts, not every step
    oracle = [s for s in warnings if "of the oracle's caller turns are longer than rollout.caller_max_new_tokens=8" in s]
    rollouts = [s for s in warnings if "stopped at rollout.caller_max_new_tokens=8" in s]
    assert len(oracle) == 1 and len(rollouts) == 2  # the training rollouts and the eval, once each
    assert sum("caller turns in the eval stopped" in s for s in rollouts) == 1


def test_the_simulator_role_can_sample_at_its_own_temperature(tmp_path):
    """rollout.simulator_temperature reaches the rehearsing source and the GRPO scorer; the
    caller keeps rollout.temperature; left unset, both roles share it."""
    from envace.experiments.factory import make_actor, make_source
    from envace.experiments.train_job import _updater_config, generation_settings

    cfg = load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "temperature": 0.7, "simulator_temperature": 0.0}))
    gen = generation_settings(cfg)
    assert make_actor(object(), gen, seed=0).temperature == 0.7
    assert make_source("rehearsal", object(), gen, seed=0).temperature == 0.0
    assert make_source("simulator", object(), gen, seed=0, simulator=object()).temperature == 0.0
    assert _updater_config(cfg, type("T", (), {"pad_token_id": 0})()).role_temperatures() == {
        "caller": 0.7, "simulator": 1.0}
    shared = load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "temperature": 0.7}))
    assert make_source("rehearsal", object(), generation_settings(shared), seed=0).temperature == 0.7
    with pytest.raises(ConfigError, match=r"field 'rollout.simulator_temperature'"):
        load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "simulator_temperature": -1}))


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_bf16_rollouts_train_with_log_probs_recomputed_by_the_fp32_trainer(tmp_path, ppo_epochs):
    # kl_coef > 0: every sample is recomputed (without it only those with an advantage, and the
    # untrained tiny model's rewards are all 0). One epoch: in the update's own forward; two: in a
    # separate pass first, which the later epoch's ratio needs.
    run = train(load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "dtype": "bfloat16"},
                                 grpo={"lr": 1e-3, "kl_coef": 0.01, "ppo_epochs": ppo_epochs}),
                            ["steps=1", "sft.enabled=false", "out=" + str(tmp_path / "r")]), log=lambda *_: None)
    row = _train_rows(run)[1]
    # The rollouts' bf16 log-probs were replaced by the trainer's fp32 ones: the gap is bf16 rounding.
    assert 0 < row["logprob_gap_max"] < 0.5, row["logprob_gap_max"]


def test_the_truncation_warning_says_when_cut_off_turns_are_decoding_loops(tmp_path):
    """Turns cut off while repeating a span (greedy loops) call for another remedy than turns
    that are longer than the cap; the warning names the right one."""
    from envace.core.types import Message, Trajectory, TurnSample
    from envace.experiments.train_job import TruncationWatch

    cfg = load_config(_cfg(tmp_path))

    def traj(gens):
        samples = [TurnSample(role="simulator", group_id="g", trajectory_index=0, turn=i, prompt_ids=[1],
                              gen_ids=g, logprobs=[-1.0] * len(g), finish="length") for i, g in enumerate(gens)]
        return Trajectory(task_id="t", source="rehearsal", messages=[Message(role="user", content="q")],
                          samples=samples)

    loop = list(range(10)) + [5, 6, 7] * 30
    said = []
    TruncationWatch(cfg, said.append).add([traj([loop, loop, list(range(99))])])
    long = []
    TruncationWatch(cfg, long.append).add([traj([list(range(99)), list(range(99)), loop])])
    assert len(said) == 1 and "2 of the 3 were repeating themselves" in said[0]
    assert "rollout.simulator_temperature" in said[0] and "raise the cap" not in said[0]
    assert len(long) == 1 and long[0].endswith("raise the cap")
    quiet = []
    off = load_config(_cfg(tmp_path), ["rollout.truncation_warnings=false"])
    TruncationWatch(off, quiet.append).add([traj([loop, loop, list(range(99))])])
    assert quiet == []


@pytest.mark.parametrize("name", ["demo", "compare", "compare_smollm2", "smollm2_cpu", "bfcl_rehearsal", "smoke"])
def test_the_shipped_configs_load(name):
    """A field renamed in the code must not leave the README's main job failing at startup."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml"
    cfg = load_config(path)
    assert cfg.steps >= 1
    if name == "demo":  # the demo trains on a fixed pool and evaluates those tasks in the real worlds
        assert cfg.rl_pool == 16 and cfg.eval.split == "pool" and cfg.rollout.simulator_temperature == 0.0


def test_the_copy_warmup_of_a_run_copies_its_real_tool_results(tmp_path):
    """``sft.copy_warmup_data``: the run's warm-up takes the oracle's real tool results as data
    (and logs its copy metrics); with no simulator samples to copy it falls back to random spans."""
    over = ["model=llama:64x1", "sft.vocab=512", "lora.enabled=false", "sft.trajectories=2", "steps=0",
            "sft.copy_warmup_steps=3", "sft.copy_warmup_data=1.0", "sft.copy_warmup_data_span=16"]
    for extra, name in (([], "a"), (["sft.roles=[caller]"], "b")):
        run = train(load_config(_cfg(tmp_path), over + extra + ["out=" + str(tmp_path / name)]), log=lambda *_: None)
        rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
        copy = [r for r in rows if "copy/accuracy" in r and r["phase"] == "sft"]  # the summary row
        assert len(copy) == 1 and 0.0 <= copy[0]["copy/accuracy"] <= 1.0
        assert [r["copy/step"] for r in rows if r["phase"] == "copy"] == [1, 2, 3]  # and one row per step
    with pytest.raises(ConfigError, match="sft.copy_warmup_data"):
        load_config(_cfg(tmp_path), ["sft.copy_warmup_data=1.5"])


def test_the_eval_can_average_several_sampled_episodes_per_task(tmp_path):
    """eval.samples: k real-world episodes per task at eval.temperature, success averaged over all
    of them, and the share of tasks any episode solved; greedy k > 1 is refused (all the same)."""
    from envace.experiments.tasksets import eval_tasks
    from envace.experiments.train_job import evaluate_real
    from envace.policy.loading import load_model

    with pytest.raises(ConfigError, match=r"field 'eval': .*eval.samples > 1 needs eval.temperature > 0"):
        load_config(_cfg(tmp_path), ["eval.samples=2"])
    cfg = load_config(_cfg(tmp_path), ["eval.samples=3", "eval.temperature=1.0", "eval.tasks=2"])
    tasks = eval_tasks(cfg)
    model, tok = load_model("tiny")
    metrics, trajs = evaluate_real(model, tok, tasks, cfg)
    assert [t.task_id for t in trajs] == [t.id for t in tasks for _ in range(3)]
    assert sorted({t.trajectory_index for t in trajs}) == [0, 1, 2]
    wins = [t.reward >= 1.0 for t in trajs]
    assert metrics["eval/success"] == pytest.approx(sum(wins) / 6)
    solved = {t.task_id for t in trajs if t.reward >= 1.0}
    assert metrics["eval/tasks_solved"] == pytest.approx(len(solved) / 2)
    assert metrics["eval/reward"] == pytest.approx(sum(t.reward for t in trajs) / 6)


def test_a_run_from_a_shared_warm_start_can_skip_its_start_eval(tmp_path):
    """eval.at_start: false (comparing sources from one warm start): only the final eval is run."""
    base = train(load_config(_cfg(tmp_path), ["steps=1"]), log=lambda *_: None)
    assert sorted(r["step"] for r in base.metrics() if r["phase"] == "eval") == [0, 1]
    cfg = load_config(_cfg(tmp_path), ["steps=1", "eval.at_start=false", f"sft.init_from={base.path / 'sft'}",
                                       "source=real", "out=" + str(tmp_path / "real")])
    lines: list[str] = []
    run = train(cfg, log=lines.append)
    assert sorted(r["step"] for r in run.metrics() if r["phase"] == "eval") == [1]
    assert not [x for x in lines if "other prompt settings" in x]  # the same prompts as the warm start's
    # A warm start made with other prompts is used as asked, with a warning that names the setting.
    lines.clear()
    train(load_config(_cfg(tmp_path), ["steps=0", "eval.at_start=false", f"sft.init_from={base.path / 'sft'}",
                                       "prompt.simulator_context=conversation", "out=" + str(tmp_path / "conv")]),
          log=lines.append)
    (warning,) = [x for x in lines if "other prompt settings" in x]
    assert "prompt.simulator_context: call -> conversation" in warning
    from envace.core.jsonl import read_jsonl_dicts

    assert {r["step"] for r in read_jsonl_dicts(run.path / "evals.jsonl")} == {1}
    # steps: 0 with eval.at_start: false is an SFT-only run: its end is its start, so no eval at all.
    sft_only = train(load_config(_cfg(tmp_path), ["steps=0", "eval.at_start=false", "out=" + str(tmp_path / "sft")]),
                     log=lambda *_: None)
    assert not [r for r in sft_only.metrics() if r["phase"] == "eval"]
    assert (sft_only.path / "sft" / "latest").exists()


def test_grpo_settings_reach_the_updater(tmp_path):
    """grpo.gradient_checkpointing reaches the updater; bf16 rollouts at one PPO epoch take their
    old log-probs from the update's own forward, with more epochs from a recompute pass first."""
    from envace.experiments.train_job import _updater_config

    tok = type("T", (), {"pad_token_id": 0})()
    plain = _updater_config(load_config(_cfg(tmp_path)), tok)
    assert not plain.gradient_checkpointing and plain.old_logprobs == "sampler"
    cfg = load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "dtype": "bfloat16"},
                           grpo={"gradient_checkpointing": True}))
    up = _updater_config(cfg, tok)
    assert up.gradient_checkpointing and up.old_logprobs == "current"
    two = load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "dtype": "bfloat16"}, grpo={"ppo_epochs": 2}))
    assert _updater_config(two, tok).old_logprobs == "sampler"


def test_training_with_a_rehearsal_memory_in_some_episodes(tmp_path):
    """memory_episodes: the group's last episodes carry a memory of its first ones in their
    caller prompt; the step reports success with and without it; bad values are refused."""
    run = train(load_config(_cfg(tmp_path, group_size=3, memory_episodes=1, memory_style="plan"),
                            ["steps=1", "sft.enabled=false", "out=" + str(tmp_path / "r")]), log=lambda *_: None)
    row = _train_rows(run)[1]
    assert {"success/plain", "success/memory", "reward/plain", "reward/memory"} <= set(row)
    # The prompts themselves: tests/testtime/test_rehearsal.py (the run directory keeps no prompts).
    rows = [json.loads(line) for line in (run.path / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["trajectory_index"] for r in rows) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ConfigError, match="field 'memory_episodes': .*memory_episodes .2. must be below group_size .2."):
        load_config(_cfg(tmp_path, memory_episodes=2))
    with pytest.raises(ConfigError, match="field 'memory_style'"):
        load_config(_cfg(tmp_path, memory_episodes=1, memory_style="model"))


def test_a_run_on_an_adapter_directory_trains_that_adapter_on(tmp_path):
    """``model: <a run's sft or checkpoint adapter>`` continues that adapter (e.g. more SFT for one
    role); peft would otherwise stack a second adapter and leave the loaded one frozen."""
    from safetensors.torch import load_file

    from envace.policy.loading import load_model
    from envace.train.checkpoint import resolve_checkpoint

    base = train(load_config(_cfg(tmp_path), ["steps=0", "out=" + str(tmp_path / "a")]), log=lambda *_: None)
    first = resolve_checkpoint(base.path / "sft")
    more = train(load_config(_cfg(tmp_path), ["steps=0", f"model={first}", "sft.roles=[simulator]",
                                              "out=" + str(tmp_path / "b")]), log=lambda *_: None)
    second = resolve_checkpoint(more.path / "sft")
    before, after = load_file(first / "adapter_model.safetensors"), load_file(second / "adapter_model.safetensors")
    assert before.keys() == after.keys()  # one adapter, the same layout: nothing stacked
    assert any(not torch.equal(before[k], after[k]) for k in before)  # and it was trained
    assert json.loads((second / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny"
    model, _ = load_model(str(second))
    assert sum(1 for n, _ in model.named_parameters() if "lora_A" in n) == \
        sum(1 for k in before if "lora_A" in k)
    with pytest.raises(ValueError, match="r=2, alpha=4; training goes on in that adapter, so set lora.r: 2"):
        train(load_config(_cfg(tmp_path), ["steps=0", f"model={first}", "lora.r=4", "out=" + str(tmp_path / "c")]),
              log=lambda *_: None)
    with pytest.raises(ValueError, match="lora.enabled is false, but the model is a LoRA adapter"):
        train(load_config(_cfg(tmp_path), ["steps=0", f"model={first}", "lora.enabled=false",
                                           "out=" + str(tmp_path / "d")]), log=lambda *_: None)


def test_a_frozen_simulator_may_be_a_run_adapter(tmp_path):
    """``source: simulator`` with ``sim_model: <an adapter directory>`` (e.g. a world model trained
    apart) loads it frozen as it is; it was refused by the trainable-adapter checks."""
    from envace.train.checkpoint import resolve_checkpoint

    base = train(load_config(_cfg(tmp_path), ["steps=0", "out=" + str(tmp_path / "a")]), log=lambda *_: None)
    world_model = resolve_checkpoint(base.path / "sft")
    run = train(load_config(_cfg(tmp_path), ["steps=1", "source=simulator", f"sim_model={world_model}",
                                             "sft.enabled=false", "out=" + str(tmp_path / "b")]), log=lambda *_: None)
    assert 1 in _train_rows(run)


def test_sft_error_probes_reach_the_warm_start(tmp_path):
    def samples(over):
        lines: list[str] = []
        train(load_config(_cfg(tmp_path), ["steps=0", "sft.roles=[simulator]", "worlds=[bank]", "sft.trajectories=3",
                                           "out=" + str(tmp_path / over[-1])]
                          + over[:-1]), log=lambda *a: lines.append(" ".join(map(str, a))))
        (line,) = [s for s in lines if s.startswith("SFT warm start:")]
        return int(line.split(" samples")[0].rsplit(" ", 1)[-1])

    plain, probed = samples(["p"]), samples(["sft.error_probes=1", "q"])
    assert plain < probed <= plain + 3  # at most one probe per trajectory


def test_mixed_precision_reaches_the_sft_and_the_grpo_update(tmp_path):
    """mixed_precision: bf16 runs the warm start's and the update's forward in bf16 autocast: the
    same run otherwise, its SFT loss and its trainer log-probs move off the fp32 run's by rounding."""
    rows = {}
    for precision in ("no", "bf16"):
        run = train(load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "dtype": "bfloat16"},
                                     grpo={"lr": 1e-3, "kl_coef": 0.01}, mixed_precision=precision),
                                ["steps=1", "out=" + str(tmp_path / precision)]), log=lambda *_: None)
        sft = next(r for r in run.metrics() if r.get("phase") == "sft" and "sft/first_loss" in r)
        rows[precision] = (sft["sft/first_loss"], _train_rows(run)[1]["logprob_gap_max"])
    (sft32, gap32), (sft16, gap16) = rows["no"], rows["bf16"]
    assert sft16 == pytest.approx(sft32, rel=0.02) and sft16 != sft32
    assert 0 < gap16 < 0.5 and gap16 != gap32
    with pytest.raises(ConfigError, match=r"field 'mixed_precision'"):
        load_config(_cfg(tmp_path, mixed_precision="fp16"))


def test_kv_reuse_setting_reaches_the_rollout_and_eval_backends(tmp_path):
    """rollout.kv_reuse_tokens gives the run's generation backends a store of that size (one
    store where one model plays both roles); envace eval's --kv-reuse-tokens does the same, and
    a negative value is refused by name."""
    from envace.experiments.eval_job import EvalJob, validate_job
    from envace.experiments.eval_models import load_eval_backend
    from envace.experiments.rollout_backends import rollout_backends
    from envace.policy.loading import load_model

    model, tok = load_model("tiny")
    models = type("Models", (), {"trained": {"policy": model}, "for_role": lambda self, r: model})()
    for budget in (0, 5000):
        cfg = load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "kv_reuse_tokens": budget}))
        backends = rollout_backends(cfg, models, model, tok, "cpu", tmp_path)
        assert backends.caller is backends.simulator
        store = backends.caller.kv_store
        assert (store is None) if budget == 0 else (store.max_tokens == budget)
    assert load_eval_backend("tiny", kv_reuse_tokens=300).kv_store.max_tokens == 300
    with pytest.raises(ValueError, match="--kv-reuse-tokens"):
        validate_job(EvalJob(model="tiny", world="shop", max_turns=2, max_new_tokens=8, sim_max_new_tokens=8,
                             kv_reuse_tokens=-1))
    with pytest.raises(ConfigError, match=r"kv_reuse_tokens"):
        load_config(_cfg(tmp_path, rollout={**TINY["rollout"], "kv_reuse_tokens": -5}))


def test_a_run_whose_groups_give_no_gradient_says_so_once(tmp_path):
    """The random tiny model solves nothing: every group's episodes share reward 0, so from the
    third such step on the log says why nothing is learned, once."""
    from envace.experiments.train_job import FlatGroups

    lines: list[str] = []
    train(load_config(_cfg(tmp_path), ["steps=4", "out=" + str(tmp_path / "a")]), log=lines.append)
    said = [line for line in lines if "gave no gradient" in line]
    assert len(said) == 1 and said[0].startswith("note: steps 1-3:") and "rollout.temperature" in said[0]
    # a step with varied groups breaks the streak
    notes: list[str] = []
    flat = FlatGroups(notes.append)
    for step, zero in enumerate([0.9, 0.9, 0.5, 0.9, 0.9, 1.0, 1.0], 1):
        flat.check(step, {"adv_zero_frac/caller": zero, "policy/entropy": 0.02})
    assert notes == [notes[0]] and notes[0].startswith("note: steps 4-6:") and "policy/entropy 0.020" in notes[0]


def _flat_or_not(task_id: str, rewards: list[float]):
    """A task's group of real trajectories with one caller sample each, scored as given."""
    from envace.core.types import Message, Trajectory, TurnSample

    return [Trajectory(task_id=task_id, source="real", trajectory_index=i,
                       messages=[Message(role="user", content="go")], reward=r,
                       samples=[TurnSample(role="caller", group_id=task_id, trajectory_index=i, turn=0,
                                           prompt_ids=[1, 2], gen_ids=[3], logprobs=[-0.5])])
            for i, r in enumerate(rewards)]


def test_dynamic_sampling_rolls_out_fresh_tasks_until_enough_groups_have_signal(tmp_path):
    """Groups whose episodes all scored alike are dropped; more rounds of fresh tasks run until
    tasks_per_step groups have signal, or the rounds or the pool run out."""
    from envace.experiments.tasksets import step_tasks, train_tasks
    from envace.experiments.train_step import StepRollouts, dynamic_sampling
    from envace.train.advantages import compute_advantages

    base = load_config(_cfg(tmp_path), ["tasks_per_step=3", "dynamic_sampling=2"])
    pool = train_tasks(base)[:12]
    signal_every = 2  # every other task drawn has varied rewards: 1 or 2 of each round's 3
    seen: list[tuple[int, list[str]]] = []

    def roll(step, round_, tasks):
        seen.append((round_, [t.id for t in tasks]))
        trajs = [tr for t in tasks for tr in _flat_or_not(
            t.id, [0.0, 1.0] if pool.index(t) % signal_every == 0 else [1.0, 1.0])]
        return StepRollouts(trajs, compute_advantages(trajs), list(tasks), 10.0)

    def run(cfg, pool):
        seen.clear()
        return dynamic_sampling(cfg, pool, 1, roll(1, 0, step_tasks(pool, cfg, 1)), roll)

    got = run(base, pool)
    drawn = [i for _, ids in seen for i in ids]
    assert len(drawn) == len(set(drawn)) == 3 * got.rounds  # fresh tasks every round
    assert [r for r, _ in seen] == list(range(got.rounds))
    signal = {t.id for t in pool if pool.index(t) % signal_every == 0 and t.id in drawn}
    assert got.signal == signal and got.groups_trained == len(signal)
    assert got.groups_trained >= 3 or got.rounds == 3  # enough groups, or every round spent
    assert {s.sample.group_id for s in got.to_train()} == signal
    assert all(s.advantage != 0 for s in got.to_train())
    assert len(got.trajectories) == 2 * len(drawn) and len(got.scored) == 2 * len(drawn)
    # round 0 is the step's usual draw: the setting changes nothing for a run whose groups all have signal
    assert seen[0][1] == [t.id for t in step_tasks(pool, base, 1)]
    # no signal anywhere: every round runs, nothing trains
    signal_every = 10 ** 6 + 1  # only pool[0] has signal
    got = run(base, pool[1:])
    assert got.rounds == 3 and got.to_train() == [] and got.groups_trained == 0
    # a pool of 4 tasks: the second round gets the last one, then the draw stops
    got = run(base, pool[1:5])
    assert [len(ids) for _, ids in seen] == [3, 1] and got.rounds == 2
    # off: round 0 only, every group trains
    got = roll(1, 0, step_tasks(pool, base, 1))
    assert got.to_train() == got.scored


def test_dynamic_sampling_in_a_run_logs_its_rounds_and_trains_nothing_without_signal(tmp_path):
    """The random tiny model solves nothing: each step rolls out every round's fresh tasks, logs
    them, and leaves the weights as they were."""

    run = train(load_config(_cfg(tmp_path), ["steps=1", "dynamic_sampling=2", "out=" + str(tmp_path / "a")]),
                log=lambda *_: None)
    row = _train_rows(run)[1]
    assert row["rollout_rounds"] == 3.0 and row["groups_trained"] == 0.0
    assert row["adv_zero_frac/caller"] == 1.0 and row["policy/tokens"] == 0.0
    trajs = [json.loads(line) for line in (run.path / "trajectories.jsonl").read_text().splitlines()]
    ids = {t["task_id"] for t in trajs}
    assert len(trajs) == 3 * 2 * 2 and len(ids) == 3 * 2  # 3 rounds x 2 tasks x G=2, every task fresh


def test_the_anchor_in_a_run_trains_on_the_warm_starts_samples_without_grpo_signal(tmp_path):
    """The random tiny model solves nothing (no GRPO signal): with grpo.anchor_coef each step still
    steps on the step's anchor samples, drawn from the warm start's own SFT samples; the same
    draw on a rerun. Without oracle references it says so at the start."""
    from envace.experiments.config import BenchTrainConfig
    from envace.experiments.train_job import anchor_pool, run_policy
    from envace.experiments.train_step import step_anchor

    over = ["steps=2", "grpo.anchor_coef=1.0", "grpo.anchor_samples=3", "eval.at_start=false"]
    cfg = load_config(_cfg(tmp_path), over + ["out=" + str(tmp_path / "a")])
    run = train(cfg, log=lambda *_: None)
    rows = _train_rows(run)
    for step in (1, 2):
        assert rows[step]["adv_zero_frac/caller"] == 1.0  # nothing to learn from the groups
        assert rows[step]["policy/optimizer_steps"] == 1.0 and rows[step]["policy/anchor_nll"] > 0
    _, tok = run_policy(cfg)
    pool = anchor_pool(cfg, tok)
    assert len(pool) >= 3 and step_anchor(pool, cfg, 1) == step_anchor(anchor_pool(cfg, tok), cfg, 1)
    assert rows[1]["policy/anchor_tokens"] == sum(s.target_count for s in step_anchor(pool, cfg, 1))
    with pytest.raises(ValueError, match="grpo.anchor_coef"):
        anchor_pool(cfg.model_copy(update={"bench": BenchTrainConfig(name="bfcl", categories=["multi_turn_base"])}),
                    tok)
