"""Training on a benchmark's entries (``bench:`` in a train config): BFCL multi-turn, rehearsal."""

from __future__ import annotations

import pytest
import yaml

pytest.importorskip("bfcl_eval", reason="bench tests need the bench extra: pip install --no-deps bfcl-eval")

from envace.benchmarks import bfcl  # noqa: E402
from envace.core.jsonl import read_jsonl_dicts  # noqa: E402
from envace.experiments.bench_train import bench_episodes, bench_task_set  # noqa: E402
from envace.experiments.config import BenchTrainConfig, load_config  # noqa: E402
from envace.experiments.factory import GenerationSettings, make_source  # noqa: E402
from envace.experiments.train_job import train  # noqa: E402

from .helpers import ReplayActor  # noqa: E402

BENCH = BenchTrainConfig(name="bfcl", categories=["multi_turn_base"], limit=5, test_every=5, max_steps=6)


def test_split_holds_out_every_nth_entry() -> None:
    ts = bench_task_set(BENCH)
    assert [i.id for i in ts.test] == ["multi_turn_base_0"]
    assert len(ts.train) == 4 and not {i.id for i in ts.train} & {i.id for i in ts.test}
    with pytest.raises(ValueError, match="bench.categories"):
        bench_task_set(BENCH.model_copy(update={"categories": ["web_search_base"]}))


def test_reward_is_bfcls_verdict_on_the_calls_even_when_every_response_was_rehearsed(tiny_backend) -> None:
    """Gold calls earn 1 although the tiny model wrote every tool response (garbage); the same
    plan without its last step earns 0. The rehearsed turns are recorded as simulator samples."""
    ts = bench_task_set(BENCH)
    items = ts.train[:2]
    gold = {i.id: bfcl.ground_truth_turns(i) for i in items}
    cut = {k: [*v[:-1], v[-1][:-1]] for k, v in gold.items()}  # drop the last step of the last user turn
    gen = GenerationSettings(caller_max_new_tokens=8, simulator_max_new_tokens=8, max_prompt_tokens=16384)
    rehearsal = make_source("rehearsal", tiny_backend, gen, 0)
    trajs, _ = bench_episodes(ts, items, ReplayActor(gold), rehearsal, tiny_backend, seed=0, group_size=1)
    assert [t.reward for t in trajs] == [1.0, 1.0]
    assert all(m.rehearsed for t in trajs for m in t.messages if m.role == "tool")
    assert any(s.role == "simulator" for t in trajs for s in t.samples)
    wrong, _ = bench_episodes(ts, items, ReplayActor(cut), rehearsal, tiny_backend, seed=0, group_size=1)
    assert [t.reward for t in wrong] == [0.0, 0.0]


def test_envace_train_on_bfcl_with_rehearsal(tmp_path) -> None:
    cfg = {
        "model": "tiny", "seed": 0, "steps": 1, "tasks_per_step": 2, "group_size": 2, "source": "rehearsal",
        "bench": BENCH.model_dump(),
        "rollout": {"caller_max_new_tokens": 8, "simulator_max_new_tokens": 8, "max_prompt_tokens": 16384,
                    "max_batch": 8},
        "grpo": {"lr": 1e-3}, "lora": {"enabled": True, "r": 2, "alpha": 4},
        "sft": {"enabled": False}, "eval": {"every": 0, "tasks": 1},
        "out": str(tmp_path / "runs"),
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = train(load_config(path), log=lambda *_: None)
    rows = run.metrics()
    assert [(r["phase"], r["step"]) for r in rows] == [("eval", 0), ("train", 1), ("eval", 1)]
    trajs = read_jsonl_dicts(run.path / "trajectories.jsonl")
    assert len(trajs) == 4 and all(t["task_id"].startswith("multi_turn_base_") for t in trajs)
    assert "multi_turn_base_0" not in {t["task_id"] for t in trajs}  # held out
    assert [r["task_id"] for r in read_jsonl_dicts(run.path / "evals.jsonl")] == ["multi_turn_base_0"] * 2
    assert (run.path / "summary.md").exists()

    cfg["sft"] = {"enabled": True}
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match="sft.enabled"):
        train(load_config(path), log=lambda *_: None)


def test_training_episodes_have_a_judge_for_nl_assertions(tiny_backend) -> None:
    """tau2's NL assertions count as met when nothing judges them: training rewards must not."""
    pytest.importorskip("tau2", reason="needs the bench extra's tau2")
    ts = bench_task_set(BenchTrainConfig(name="tau2", categories=["retail"], limit=4, test_every=2))
    assert ts.adapter.judge is None
    bench_episodes(ts, [], None, None, tiny_backend, seed=0, group_size=1)
    assert ts.adapter.judge is not None and ts.adapter.judge.backend is tiny_backend
