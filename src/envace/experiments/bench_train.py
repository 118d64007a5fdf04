"""Training on a paper benchmark's tasks (``bench:`` in a train config).

The training job's loop stays the same; only where tasks come from, how episodes run and how
they are scored change:

* tasks: the benchmark's entries of the configured categories, every ``test_every``-th held out
  for the evaluation (a fixed split, so every run and source evaluates on the same entries);
* episodes: the episode engine with the benchmark's user (``run_scored_episodes``: scripted or simulated user turns,
  the benchmark's own step limits), with the run's response source — ``rehearsal`` (the policy
  writes the tool responses, its turns trained), ``simulator`` (frozen) or ``real`` (the
  benchmark's executable environment);
* reward: the benchmark's own scorer on the episode (``adapter.score``). For a rehearsed episode
  the scorer gets no world, so it judges the calls the way it judges them offline (BFCL's
  multi-turn checker executes them itself; tau2 replays them on a fresh environment): the reward
  is the benchmark's verdict on what the agent did, while every tool response the agent saw
  during training was rehearsed;
* evaluation: the caller against the benchmark's real environment on the held-out entries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.benchmarks.base import BenchItem
from envace.benchmarks.registry import get_adapter
from envace.core.types import Trajectory
from envace.experiments.bench_runner import bench_user, run_scored_episodes
from envace.experiments.config import BenchTrainConfig


@dataclass
class BenchTaskSet:
    config: BenchTrainConfig
    adapter: Any
    train: list[BenchItem]
    test: list[BenchItem]


def bench_task_set(cfg: BenchTrainConfig) -> BenchTaskSet:
    adapter = get_adapter(cfg.name)
    ok, why = adapter.available(None if cfg.data_dir is None else Path(cfg.data_dir))
    if not ok:
        raise ValueError(f"bench.name: benchmark {cfg.name} is not available: {why}")
    cats = {c.name: c for c in adapter.categories()}
    items: list[BenchItem] = []
    for cat in cfg.categories:
        c = cats.get(cat)
        if c is None:
            raise ValueError(f"bench.categories: {cfg.name} has no category {cat!r} (envace bench list)")
        if not c.runnable:
            raise ValueError(f"bench.categories: {cfg.name} category {cat!r} is not runnable here: {c.reason}")
        items += adapter.load(cat, limit=cfg.limit, data_dir=cfg.data_dir, version=cfg.data_version)
    test = items[::cfg.test_every]
    held = {i.id for i in test}
    train = [i for i in items if i.id not in held]
    if not train:
        raise ValueError(f"bench: no training entries left (limit {cfg.limit}, test_every {cfg.test_every})")
    return BenchTaskSet(cfg, adapter, train, test)


def bench_episodes(ts: BenchTaskSet, items: list[BenchItem], actor: Any, source: Any | None, user_backend: Any,
                   seed: int, group_size: int) -> tuple[list[Trajectory], float]:
    """Episodes of ``items`` scored by the benchmark; ``source`` None: its real environment.
    Returns the trajectories (reward = the benchmark's score) and generated tokens per second."""
    if hasattr(ts.adapter, "set_judge"):
        # NL assertions (tau2) and rubrics (VitaBench) are judged by the policy itself, as in
        # `envace eval --bench` without --judge-model; unjudged they would count as met.
        ts.adapter.set_judge(user_backend)
    t0 = time.perf_counter()
    scored = run_scored_episodes(ts.adapter, items, actor, source, bench_user(ts.adapter, user_backend, seed),
                                 group_size=group_size, max_steps=ts.config.max_steps,
                                 max_user_turns=ts.config.max_user_turns)
    seconds = time.perf_counter() - t0
    trajs = [r.trajectory for r in scored]
    tokens = sum(len(s.gen_ids) for t in trajs for s in t.samples)
    return trajs, tokens / seconds if seconds > 0 else 0.0
