"""What a training run plays: a TaskSet. It says which tasks GRPO draws from (``train_pool``),
which the eval runs (``held_out``), how a batch of episodes is played and scored (``play``) and
how the eval's are (``evaluate``). Two kinds:

* :class:`WorldTasks`: the embedded worlds' generated tasks or a task file; the episode engine
  plays them, the task's checklist scores them, the eval runs in their real worlds (or, with none,
  rehearsal-judged);
* :class:`BenchTasks`: a paper benchmark's entries (``bench:``); its own user turns, step limits
  and scorer (experiments/bench_train.py), its real environment for the eval.

The training job does not ask which kind it has.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from envace.core.types import Task, Trajectory
from envace.envs.registry import spec_label
from envace.experiments.bench_train import BenchTaskSet, bench_episodes, bench_task_set
from envace.experiments.config import TrainConfig
from envace.experiments.factory import GenerationSettings, make_source
from envace.experiments.tasks import select_tasks
from envace.rollout.engine import run_episodes
from envace.rollout.stats import log_turns
from envace.rollout.sources import RealSource, ResponseSource
from envace.testtime.memory import make_memory_writer
from envace.testtime.rehearsal import episodes_with_memory

EvalKind = Literal["real", "rehearsal"]


def train_tasks(cfg: TrainConfig) -> list[Task]:
    return select_tasks(",".join(cfg.worlds), "train", None, cfg.task_file, cfg.difficulties, cfg.tool_distractors,
                        cfg.n_examples, cfg.grounding, cfg.tasks_per_world, real_world=cfg.world,
                        trust_task_worlds=cfg.trust_task_worlds)


def eval_world(cfg: TrainConfig) -> Any:
    """The real environment of the evals: ``eval.world`` where given (a schema-only run evaluated
    against the real tools), else the run's."""
    return cfg.eval.world if cfg.eval.world is not None else cfg.world


def eval_tasks(cfg: TrainConfig) -> list[Task]:
    return select_tasks(",".join(cfg.worlds), cfg.eval.split, cfg.eval.tasks, cfg.task_file, cfg.difficulties,
                        cfg.tool_distractors, cfg.n_examples, cfg.grounding, cfg.tasks_per_world,
                        real_world=eval_world(cfg), trust_task_worlds=cfg.trust_task_worlds)


def has_real_world(task: Task, cfg: TrainConfig, world: Any = None) -> bool:
    """Whether ``task`` has a real environment: its own, or ``world`` (default: the run's)."""
    world = cfg.world if world is None else world
    return (task.env is not None and task.env.world is not None) or world is not None


def eval_kind(cfg: TrainConfig, tasks: list[Task]) -> EvalKind:
    """``real``: the eval tasks run in their real environment; ``rehearsal``: none has one (a
    schema-only task file and no --world), so the policy answers its own calls and success is
    judged on what a trajectory shows (called / answer_contains / judge items)."""
    if cfg.bench is not None:
        return "real"
    real = [has_real_world(t, cfg, eval_world(cfg)) for t in tasks]
    if all(real):
        return "real"
    if not any(real):
        return "rehearsal"
    missing = next(t.id for t, r in zip(tasks, real) if not r)
    raise ValueError(f"{real.count(False)} of the {len(tasks)} eval tasks have no real world (e.g. {missing}) and "
                     "the others do: give the run a world (--world / world:) or every task its env")


def sampled_pool(cfg: TrainConfig, pool: list) -> list:
    """With ``rl_pool``, a fixed sample of ``pool`` (seeded): GRPO draws only from those."""
    if cfg.rl_pool is not None:
        pool = random.Random(cfg.seed).sample(pool, min(cfg.rl_pool, len(pool)))
    return pool


def real_eval_tasks(cfg: TrainConfig, pool: list[Task], bench: BenchTaskSet | None = None) -> list[Task]:
    """The tasks of the real-world eval: held-out ones, or with ``eval.split: pool`` the first of
    the GRPO pool (does training carry over to the real worlds on the tasks it trains on?)."""
    if cfg.eval.split == "pool":
        return pool[:cfg.eval.tasks]
    return bench.test[:cfg.eval.tasks] if bench is not None else eval_tasks(cfg)


def step_tasks(pool: list[Task], cfg: TrainConfig, step: int, round_: int = 0,
               drawn: frozenset[str] = frozenset()) -> list[Task]:
    """The tasks of one step: a function of (seed, step) only, so a resumed run draws the same.
    ``round_`` > 0 (``dynamic_sampling``): that round's fresh tasks, none of ``drawn`` (the ids of
    the step's earlier rounds); fewer, or none, when the pool runs out."""
    if round_ == 0:
        return random.Random(cfg.seed * 1_000_003 + step).sample(pool, min(cfg.tasks_per_step, len(pool)))
    rest = [t for t in pool if t.id not in drawn]
    rng = random.Random((cfg.seed * 1_000_003 + step) * 1_009 + round_)
    return rng.sample(rest, min(cfg.tasks_per_step, len(rest)))


@dataclass
class TaskSet(ABC):
    """A run's tasks (see the module docstring); subclasses say how episodes are played."""

    cfg: TrainConfig
    train_pool: list
    held_out: list
    kind: EvalKind  # how the eval answers tool calls: the real world, or the policy rehearsing
    # Scored by the task's checklist (its verdicts name why an episode failed: experiments/failures.py)
    checklist: ClassVar[bool] = True
    # The real worlds' source, one for the run (training with source real, and every eval), so that
    # worlds resolve (an MCP server's tools are listed) once; None: the benchmark's environment.
    real: RealSource | None = None

    @abstractmethod
    def play(self, tasks: list, actor: Any, source: ResponseSource | None, backend: Any, seed: int | None,
             judge: Any = None) -> tuple[list[Trajectory], float]:
        """``cfg.group_size`` training episodes of each of ``tasks``, scored; ``source`` None: the
        real world answers. Returns them in task order and the generated tokens per second."""

    @abstractmethod
    def evaluate(self, tasks: list, actor: Any, backend: Any, gen: GenerationSettings, seed: int | None,
                 judge: Any = None, log: Any = None) -> list[Trajectory]:
        """``eval.samples`` scored eval episodes of each of ``tasks`` (``log``: a line per turn)."""

    @abstractmethod
    def describe_eval(self) -> str:
        """The log line saying what the eval runs on."""

    def close(self) -> None:
        if self.real is not None:
            self.real.close()


@dataclass
class WorldTasks(TaskSet):
    """The embedded worlds' tasks or a task file's, played by the episode engine."""

    @classmethod
    def load(cls, cfg: TrainConfig, trainable: Callable[[TrainConfig, list[Task]], list[Task]]) -> WorldTasks:
        """``trainable(cfg, train tasks)``: those GRPO may draw from (e.g. the ones the warm start did
        not imitate); ``rl_pool`` then samples them."""
        pool = sampled_pool(cfg, trainable(cfg, train_tasks(cfg)))
        held_out = real_eval_tasks(cfg, pool)
        if cfg.source == "real" and not all(has_real_world(t, cfg) for t in pool):
            raise ValueError("source real: the train tasks have no real world; give the run one (--world / world:) "
                             "or train by rehearsal")
        return cls(cfg, pool, held_out, eval_kind(cfg, held_out), RealSource(eval_world(cfg)))

    def play(self, tasks: list, actor: Any, source: ResponseSource | None, backend: Any, seed: int | None,
             judge: Any = None) -> tuple[list[Trajectory], float]:
        cfg = self.cfg
        episodes = cfg.rollout.episodes(cfg.group_size)
        source = self.real if source is None else source
        if cfg.memory_episodes:  # the group's last k episodes see a memory of its first G-k
            trajs, stats, _ = episodes_with_memory(tasks, actor, source, episodes, cfg.memory_episodes,
                                                   make_memory_writer(cfg.memory_style), judge=judge)
        else:
            trajs, stats = run_episodes(tasks, actor, source, episodes, judge=judge)
        return trajs, stats.tokens_per_second

    def evaluate(self, tasks: list, actor: Any, backend: Any, gen: GenerationSettings, seed: int | None,
                 judge: Any = None, log: Any = None) -> list[Trajectory]:
        cfg = self.cfg
        source: Any = self.real
        if self.kind == "rehearsal":  # no real world: the policy rehearses the responses, nothing recorded
            source = make_source("rehearsal", backend, gen, seed)
            source.record_samples = False
        progress = log_turns(log, "  eval: ", cfg.rollout.max_turns) if log else None
        trajs, _ = run_episodes(tasks, actor, source,
                                replace(cfg.rollout.episodes(cfg.eval.samples), progress_weight=0.0),
                                judge=judge, on_turn=progress)
        return trajs

    def describe_eval(self) -> str:
        cfg, n = self.cfg, len(self.held_out)
        if self.kind == "rehearsal":
            return (f"evaluation: rehearsal-judged on {n} {cfg.eval.split} tasks (no real environment: the policy "
                    "rehearses the tool responses; only called / answer_contains / judge items count)")
        world = eval_world(cfg)
        where = f"world {spec_label(world)}" if world is not None else "the tasks' own worlds"
        return f"evaluation: real-world on {n} {cfg.eval.split} tasks ({where})"


@dataclass
class BenchTasks(TaskSet):
    """A paper benchmark's entries: its user, step limits and scorer; its environment for the eval."""

    bench: BenchTaskSet | None = None
    checklist: ClassVar[bool] = False  # the benchmark's own scorer

    @classmethod
    def load(cls, cfg: TrainConfig) -> BenchTasks:
        if cfg.bench is None:
            raise ValueError("BenchTasks: the config has no bench section")
        if cfg.sft.enabled and cfg.sft.init_from is None:
            raise ValueError("sft.enabled: the SFT warm start imitates the embedded worlds' scripted oracle; with "
                             "bench: set sft.enabled: false, or sft.init_from a warm start")
        bench = bench_task_set(cfg.bench)
        pool = sampled_pool(cfg, bench.train)
        return cls(cfg, pool, real_eval_tasks(cfg, pool, bench), "real", None, bench)

    def play(self, tasks: list, actor: Any, source: ResponseSource | None, backend: Any, seed: int | None,
             judge: Any = None) -> tuple[list[Trajectory], float]:
        return bench_episodes(self.bench, tasks, actor, source, backend, seed, self.cfg.group_size)

    def evaluate(self, tasks: list, actor: Any, backend: Any, gen: GenerationSettings, seed: int | None,
                 judge: Any = None, log: Any = None) -> list[Trajectory]:
        trajs, _ = bench_episodes(self.bench, tasks, actor, None, backend, seed, group_size=self.cfg.eval.samples)
        return trajs

    def describe_eval(self) -> str:
        return f"evaluation: real-world on {len(self.held_out)} {self.cfg.eval.split} tasks (benchmark {self.cfg.bench.name})"


def task_set(cfg: TrainConfig, trainable: Callable[[TrainConfig, list[Task]], list[Task]]) -> TaskSet:
    """The run's TaskSet: a benchmark's (``bench:``) or the worlds' / task file's, whose train tasks
    ``trainable`` filters (see :meth:`WorldTasks.load`)."""
    return BenchTasks.load(cfg) if cfg.bench is not None else WorldTasks.load(cfg, trainable)
