"""Test-time private rehearsal: imagine N episodes, condense them, then run once for real.

* **parallel** — N independent sampled episodes per task, in one batched ``run_episodes`` call
  (``group_size=N``), every tool call answered by a model source (the policy rehearsing).
* **sequential** — N attempts one after the other; attempt k's caller prompt holds the memory
  of attempts 1..k-1, so it can revise.

The attempts are condensed into a rehearsal memory (:mod:`envace.testtime.memory`), and the
committed run goes once against the real world with that memory in the caller's system prompt
(:class:`MemoryActor` sets ``ActorView.memory``). No real tool is called while rehearsing:
:func:`rehearse` refuses a real source, and the committed run's :class:`RecordingRealSource`
only builds worlds when the committed run starts them, so every call any real world received is
counted and attributed to the committed run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envace.core.types import Task, Trajectory
from envace.rollout.actors import Actor, ActorTurn, ActorView
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.stats import RolloutStats, log_turns
from envace.rollout.sources import RealSource, ResponseSource, ToolRequest, ToolResponse
from envace.testtime.memory import NO_MEMORY, Memory, MemoryWriter, RuleMemoryWriter

REHEARSE_MODES = ("parallel", "sequential")
MODES = ("none", *REHEARSE_MODES)

Log = Callable[[str], None]


def check_mode_budget(mode: str, budget: int) -> None:
    """``none`` takes budget 0; ``parallel``/``sequential`` need a budget of at least 1."""
    if mode not in MODES:
        raise ValueError(f"unknown rehearse mode {mode!r}; choose one of {', '.join(MODES)}")
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise ValueError(f"rehearsal budget must be an integer, got {budget!r}")
    if mode == "none" and budget != 0:
        raise ValueError(f"a rehearsal budget ({budget}) needs --rehearse parallel or sequential")
    if mode != "none" and budget < 1:
        raise ValueError(f"--rehearse {mode} needs a budget >= 1 (got {budget}); "
                         "budget 0 means no rehearsal (--rehearse none, or 0 in a --sweep)")


def _strip_samples(traj: Trajectory) -> Trajectory:
    return traj.model_copy(update={"samples": []})


def _caller_tokens(traj: Trajectory) -> int:
    return sum(len(s.gen_ids) for s in traj.samples if s.role == "caller")


def _reseeded(obj: Any, k: int) -> Any:
    """A copy of a seeded dataclass actor/source with the seed moved by attempt ``k``, so that
    sequential attempts draw fresh samples; other objects as they are."""
    if k and dataclasses.is_dataclass(obj) and getattr(obj, "seed", None) is not None:
        return dataclasses.replace(obj, seed=obj.seed + 1009 * k)
    return obj


# ---------------------------------------------------------------- actor and sources


@dataclass
class MemoryActor:
    """Wraps an actor and puts each task's rehearsal memory into its views (``ActorView.memory``),
    which :class:`~envace.rollout.actors.PolicyActor` renders at the end of the caller's system
    prompt. Actors that render no prompt (the scripted oracle) ignore it."""

    inner: Actor
    memories: Mapping[str, str]

    def act(self, views: list[ActorView], turn: int) -> list[ActorTurn | None]:
        return self.inner.act([dataclasses.replace(v, memory=self.memories.get(v.task.id, v.memory))
                               for v in views], turn)


@dataclass
class CountingSource:
    """A model response source that also counts what it generated per episode (the engine only
    counts simulator tokens of recorded samples, and rehearsal records none)."""

    inner: ResponseSource
    tokens: dict[tuple[str, int], int] = field(default_factory=dict)
    calls: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def name(self):  # the trajectories' ``source``
        return self.inner.name

    def start(self, task: Task) -> Any:
        return self.inner.start(task)

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        out = self.inner.respond(requests)
        for r, resp in zip(requests, out):
            key = (r.task.id, r.trajectory_index)
            n = resp.extra.get("gen_tokens", len(resp.sample.gen_ids) if resp.sample is not None else 0)
            self.tokens[key] = self.tokens.get(key, 0) + int(n)
            self.calls[key] = self.calls.get(key, 0) + 1
        return out


class RecordingRealSource(RealSource):
    """The real source, keeping every world it builds; a world is only built when an episode
    against it starts, so before the committed run there is no world that could be called."""

    def __init__(self, world: Any = None) -> None:
        super().__init__(world)
        self.worlds: list[tuple[str, Any]] = []

    def start(self, task: Task) -> Any:
        world = super().start(task)
        self.worlds.append((task.id, world))
        return world

    def total_calls(self) -> int:
        return sum(len(w.calls) for _, w in self.worlds)

    def calls_by_task(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tid, w in self.worlds:
            out[tid] = out.get(tid, 0) + len(w.calls)
        return out


def _refuse_real(source: Any) -> None:
    if isinstance(source, RealSource) or getattr(source, "name", None) == "real":
        raise ValueError("private rehearsal must not call the real world: give it a model source "
                         "(ModelSource with the policy, record_samples=False)")


# ---------------------------------------------------------------- rehearsal


@dataclass
class Rehearsal:
    """One imagined episode of one task."""

    task_id: str
    attempt: int  # 0-based: the group index (parallel) or the attempt number (sequential)
    trajectory: Trajectory
    memory_seen: str = ""  # the memory in this attempt's caller prompt (sequential, attempt >= 1)
    caller_tokens: int = 0
    simulator_tokens: int = 0
    seconds: float = 0.0  # generation time attributed to this episode

    @property
    def tokens(self) -> int:
        return self.caller_tokens + self.simulator_tokens

    def to_row(self, mode: str) -> dict[str, Any]:
        return {"mode": mode, "task_id": self.task_id, "attempt": self.attempt, "memory_seen": self.memory_seen,
                "caller_tokens": self.caller_tokens, "simulator_tokens": self.simulator_tokens,
                "seconds": round(self.seconds, 4),
                "trajectory": _strip_samples(self.trajectory).model_dump(mode="json", exclude_none=True)}


@dataclass
class RehearsalSet:
    """All attempts of one mode for a list of tasks, plus the memories condensed from prefixes."""

    mode: str
    budget: int
    attempts: dict[str, list[Rehearsal]]
    memories: dict[tuple[str, int], Memory] = field(default_factory=dict)  # (task id, #attempts) -> memory
    wall_seconds: float = 0.0

    def prefix(self, task_id: str, b: int) -> list[Rehearsal]:
        return self.attempts.get(task_id, [])[:b]


def rehearse(tasks: list[Task], actor: Actor, simulator: ResponseSource, mode: str, budget: int,
             memory_writer: MemoryWriter | None = None, max_turns: int = 4, log: Log | None = None,
             play: Callable[..., tuple[list[Trajectory], Any]] = run_episodes) -> RehearsalSet:
    """Imagine ``budget`` episodes per task with ``simulator`` answering every call.

    ``actor`` should sample (temperature > 0) so that attempts differ; ``memory_writer`` (rule
    by default) condenses earlier attempts for the sequential mode. ``play`` runs the episodes
    (``run_episodes`` signature; a benchmark passes its user turns and scorer, see
    ``experiments.bench_runner.bench_play``).
    """
    check_mode_budget(mode, budget)
    if mode == "none":
        raise ValueError("rehearse() needs mode parallel or sequential")
    _refuse_real(simulator)
    writer = memory_writer or RuleMemoryWriter()
    t0 = time.perf_counter()
    rset = RehearsalSet(mode=mode, budget=budget, attempts={t.id: [] for t in tasks})
    if mode == "parallel":
        counting = CountingSource(simulator)
        trajs, _ = play(tasks, actor, counting, RolloutConfig(group_size=budget, max_turns=max_turns),
                        on_turn=log_turns(log, f"  {mode} rehearsal: ", max_turns) if log else None)
        for traj in trajs:
            rset.attempts[traj.task_id].append(Rehearsal(
                task_id=traj.task_id, attempt=traj.trajectory_index, trajectory=traj,
                caller_tokens=_caller_tokens(traj),
                simulator_tokens=counting.tokens.get((traj.task_id, traj.trajectory_index), 0),
                seconds=traj.timings.get("generation_s", 0.0)))
    else:
        for k in range(budget):
            memories = memories_after(rset, tasks, k, writer) if k else {}
            texts = {tid: m.text for tid, m in memories.items()}
            counting = CountingSource(_reseeded(simulator, k))
            trajs, _ = play(tasks, MemoryActor(_reseeded(actor, k), texts), counting,
                            RolloutConfig(group_size=1, max_turns=max_turns),
                            on_turn=log_turns(log, f"  attempt {k + 1}/{budget}: ", max_turns) if log else None)
            for traj in trajs:
                rset.attempts[traj.task_id].append(Rehearsal(
                    task_id=traj.task_id, attempt=k, trajectory=traj, memory_seen=texts.get(traj.task_id, ""),
                    caller_tokens=_caller_tokens(traj), simulator_tokens=counting.tokens.get((traj.task_id, 0), 0),
                    seconds=traj.timings.get("generation_s", 0.0)))
            if log:
                log(f"  sequential attempt {k + 1}/{budget} done ({time.perf_counter() - t0:.0f} s)")
    rset.wall_seconds = time.perf_counter() - t0
    if log:
        log(f"  {mode} rehearsal: {budget} x {len(tasks)} imagined episodes in {rset.wall_seconds:.0f} s")
    return rset


def memories_after(rset: RehearsalSet, tasks: list[Task], b: int, writer: MemoryWriter) -> dict[str, Memory]:
    """The memory of each task condensed from its first ``b`` attempts (cached in ``rset``).

    In the sequential mode the memory after b attempts is also what attempt b+1 saw, so the
    sweep's budgets reuse one run's memories exactly.
    """
    missing = [t for t in tasks if (t.id, b) not in rset.memories]
    if missing:
        if b == 0:
            written = [NO_MEMORY] * len(missing)
        else:
            written = writer.write([(t, [r.trajectory for r in rset.prefix(t.id, b)]) for t in missing])
        for t, m in zip(missing, written):
            rset.memories[(t.id, b)] = m
    return {t.id: rset.memories[(t.id, b)] for t in tasks}


# ---------------------------------------------------------------- committed run


@dataclass
class TaskOutcome:
    """One task under one condition: its memory, the committed real trajectory, and the costs."""

    task_id: str
    mode: str
    budget: int
    memory: Memory
    trajectory: Trajectory  # the committed run, against the real world
    real_calls: int  # calls the real world received in the committed run
    real_calls_during_rehearsal: int  # always 0: counted, not assumed
    rehearsal_tokens: int = 0
    memory_tokens: int = 0
    commit_tokens: int = 0
    rehearsal_seconds: float = 0.0
    memory_seconds: float = 0.0
    commit_seconds: float = 0.0
    imagined_rewards: list[float] = field(default_factory=list)  # for analysis only, never used by the agent

    @property
    def condition(self) -> str:
        return condition_name(self.mode, self.budget)

    @property
    def success(self) -> bool:
        return self.trajectory.solved

    @property
    def tokens(self) -> int:
        return self.rehearsal_tokens + self.memory_tokens + self.commit_tokens

    @property
    def seconds(self) -> float:
        return self.rehearsal_seconds + self.memory_seconds + self.commit_seconds

    def to_row(self) -> dict[str, Any]:
        return {
            "condition": self.condition, "mode": self.mode, "budget": self.budget, "task_id": self.task_id,
            "success": self.success, "reward": self.trajectory.reward,
            "memory": self.memory.text, "memory_source": self.memory.source, "memory_note": self.memory.note,
            "memory_raw": self.memory.raw,
            "real_calls": self.real_calls, "real_calls_during_rehearsal": self.real_calls_during_rehearsal,
            "tokens": {"rehearsal": self.rehearsal_tokens, "memory": self.memory_tokens,
                       "commit": self.commit_tokens, "total": self.tokens},
            "seconds": {"rehearsal": round(self.rehearsal_seconds, 4), "memory": round(self.memory_seconds, 4),
                        "commit": round(self.commit_seconds, 4), "total": round(self.seconds, 4)},
            "imagined_rewards": self.imagined_rewards,
            "trajectory": _strip_samples(self.trajectory).model_dump(mode="json", exclude_none=True),
        }


def condition_name(mode: str, budget: int) -> str:
    return "none" if mode == "none" or budget == 0 else f"{mode}-{budget}"


@dataclass
class ConditionResult:
    mode: str
    budget: int
    outcomes: list[TaskOutcome]
    real_calls_during_rehearsal: int
    wall_seconds: float  # the committed run (and memories) of this condition; rehearsal is in RehearsalSet

    @property
    def name(self) -> str:
        return condition_name(self.mode, self.budget)

    @property
    def success_rate(self) -> float:
        return sum(o.success for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0


def commit(tasks: list[Task], actor: Actor, real_source: RealSource, memories: Mapping[str, str],
           max_turns: int = 4, judge: Any = None, log: Log | None = None) -> list[Trajectory]:
    """The one committed run per task, in the real world, with each task's memory in the prompt
    (``judge``: the judge of ``judge`` checklist items, if any; ``log``: progress per turn)."""
    trajs, _ = run_episodes(tasks, MemoryActor(actor, memories), real_source,
                            RolloutConfig(group_size=1, max_turns=max_turns), judge=judge,
                            on_turn=log_turns(log, "  committed run: ", max_turns) if log else None)
    return trajs


def commit_condition(tasks: list[Task], commit_actor: Actor, rset: RehearsalSet | None, budget: int,
                     writer: MemoryWriter, max_turns: int = 4, real_source: RecordingRealSource | None = None,
                     log: Log | None = None, world: Any = None, judge: Any = None) -> ConditionResult:
    """Condense the first ``budget`` attempts of ``rset`` (none when budget is 0) and commit.

    ``real_source`` should be created before the rehearsal it follows (its calls up to the
    commit are reported as ``real_calls_during_rehearsal``); default: a fresh one.
    """
    mode = "none" if rset is None or budget == 0 else rset.mode
    check_mode_budget(mode, budget)
    if rset is not None and budget > rset.budget:
        raise ValueError(f"budget {budget} exceeds the {rset.budget} rehearsed attempts")
    source = real_source if real_source is not None else RecordingRealSource(world)
    t0 = time.perf_counter()
    memories = memories_after(rset, tasks, budget, writer) if rset is not None and budget else {
        t.id: NO_MEMORY for t in tasks}
    # The source was made before the rehearsal (by the caller, or fresh here): whatever its worlds
    # received so far was received before the committed run, i.e. during rehearsal. Counted, so
    # "zero real calls while rehearsing" is shown rather than assumed.
    during = source.total_calls()
    try:
        trajs = commit(tasks, commit_actor, source, {tid: m.text for tid, m in memories.items()}, max_turns, judge, log)
    finally:
        source.close()  # MCP servers and loops; the recorded calls stay readable
    wall = time.perf_counter() - t0
    calls = source.calls_by_task()
    outcomes = []
    for task, traj in zip(tasks, trajs):
        mem = memories[task.id]
        reh = rset.prefix(task.id, budget) if rset is not None else []
        if rset is not None and rset.mode == "sequential":  # the memories attempts 2..b saw, and the final one
            mem_cost = [rset.memories[(task.id, k)] for k in range(1, budget + 1) if (task.id, k) in rset.memories]
        else:
            mem_cost = [mem]
        outcomes.append(TaskOutcome(
            task_id=task.id, mode=mode, budget=budget, memory=mem, trajectory=traj,
            real_calls=calls.get(task.id, 0), real_calls_during_rehearsal=during,
            rehearsal_tokens=sum(r.tokens for r in reh), memory_tokens=sum(m.tokens for m in mem_cost),
            commit_tokens=_caller_tokens(traj), rehearsal_seconds=sum(r.seconds for r in reh),
            memory_seconds=sum(m.seconds for m in mem_cost), commit_seconds=traj.timings.get("generation_s", 0.0),
            imagined_rewards=[r.trajectory.reward for r in reh]))
    result = ConditionResult(mode=mode, budget=budget, outcomes=outcomes, real_calls_during_rehearsal=during,
                             wall_seconds=wall)
    if log:
        log(f"  committed run [{result.name}]: success {result.success_rate:.3f} on {len(tasks)} tasks, "
            f"{source.total_calls()} real calls, {wall:.0f} s")
    return result


def run_private_rehearsal(tasks: list[Task], rehearsal_actor: Actor, commit_actor: Actor,
                          simulator: ResponseSource, mode: str, budget: int,
                          memory_writer: MemoryWriter | None = None, max_turns: int = 4,
                          real_source: RecordingRealSource | None = None, log: Log | None = None,
                          world: Any = None, judge: Any = None) -> tuple[ConditionResult, RehearsalSet | None]:
    """Rehearse ``budget`` imagined episodes per task (``mode``), condense, commit once for real.

    ``mode='none'`` (budget 0) is the plain real-world run, the baseline of the sweep.
    """
    check_mode_budget(mode, budget)
    writer = memory_writer or RuleMemoryWriter()
    source = real_source if real_source is not None else RecordingRealSource(world)
    rset = None
    if mode != "none":
        rset = rehearse(tasks, rehearsal_actor, simulator, mode, budget, writer, max_turns, log)
    return commit_condition(tasks, commit_actor, rset, budget, writer, max_turns, source, log, judge=judge), rset


def budget_sweep(tasks: list[Task], rehearsal_actor: Actor, commit_actor: Actor, simulator: ResponseSource,
                 budgets: list[int], modes: tuple[str, ...] = REHEARSE_MODES,
                 memory_writer: MemoryWriter | None = None, max_turns: int = 4, log: Log | None = None,
                 world: Any = None, judge: Any = None) -> tuple[list[ConditionResult], dict[str, RehearsalSet]]:
    """Success and cost for every budget of every mode; budget 0 (no rehearsal) is run once.

    Each mode rehearses once with the largest budget and budget b uses the first b attempts. For
    the sequential mode that is exact (attempt k only depends on attempts < k); for the parallel
    mode the first b of N independent samples are b independent samples, and the budgets share
    them, which pairs the comparison across budgets. Each condition commits on fresh worlds.
    """
    budgets = sorted(set(budgets))
    if not budgets or any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in budgets):
        raise ValueError(f"sweep budgets must be integers >= 0, got {budgets}")
    for m in modes:
        check_mode_budget(m, 1)
        if m == "none":
            raise ValueError("sweep modes are parallel and/or sequential (budget 0 is the no-rehearsal run)")
    writer = memory_writer or RuleMemoryWriter()
    results: list[ConditionResult] = []
    if 0 in budgets:
        if log:
            log("condition none (no rehearsal)")
        results.append(commit_condition(tasks, commit_actor, None, 0, writer, max_turns, log=log, world=world,
                                        judge=judge))
    rsets: dict[str, RehearsalSet] = {}
    positive = [b for b in budgets if b > 0]
    for m in modes if positive else ():
        if log:
            log(f"mode {m}: rehearsing {max(positive)} attempts per task")
        sources = {b: RecordingRealSource(world) for b in positive}  # before rehearsing: see commit_condition
        rsets[m] = rset = rehearse(tasks, rehearsal_actor, simulator, m, max(positive), writer, max_turns, log)
        for b in positive:
            results.append(commit_condition(tasks, commit_actor, rset, b, writer, max_turns, sources[b], log,
                                            judge=judge))
    return results, rsets


# ---------------------------------------------------------------- training with a memory


def episodes_with_memory(tasks: list[Task], actor: Actor, source: ResponseSource, cfg: RolloutConfig,
                         with_memory: int, memory_writer: MemoryWriter | None = None,
                         judge: Any = None) -> tuple[list[Trajectory], RolloutStats, dict[str, str]]:
    """A task's ``cfg.group_size`` training episodes, the last ``with_memory`` of them with a
    rehearsal memory in the caller's prompt, condensed from the task's other episodes.

    What test-time rehearsal does, inside a training group: the first G-k episodes play plain,
    their memory goes into the prompts of the last k (numbered on, so (task, index) still names
    one trajectory). GRPO then compares episodes with and without a memory of the same task, so
    the policy learns to use a memory (or to ignore a misleading one) instead of meeting one for
    the first time at test time. With ``source`` the policy rehearsing, the memory comes from
    imagined attempts, as at test time. Returns the trajectories in task order (plain ones first
    per task), the rollout stats of both batches, and each task's memory.
    """
    g = cfg.group_size
    if isinstance(with_memory, bool) or not isinstance(with_memory, int) or not 0 <= with_memory < g:
        raise ValueError(f"episodes with a memory must be 0..group_size-1 ({g - 1}), got {with_memory!r}: "
                         "at least one episode per task plays plain, to write the memory from")
    if len({t.id for t in tasks}) != len(tasks):
        raise ValueError("episodes with a memory: the tasks must have distinct ids (the memory is keyed by task id)")
    first, stats = run_episodes(tasks, actor, source, dataclasses.replace(cfg, group_size=g - with_memory),
                                judge=judge)
    if not with_memory:
        return first, stats, {}
    writer = memory_writer or RuleMemoryWriter()
    by_task: dict[str, list[Trajectory]] = {t.id: [] for t in tasks}
    for traj in first:
        by_task[traj.task_id].append(traj)
    memories = {t.id: m.text for t, m in zip(tasks, writer.write([(t, by_task[t.id]) for t in tasks]))}
    second, stats2 = run_episodes(tasks, MemoryActor(_reseeded(actor, 1), memories), _reseeded(source, 1),
                                  dataclasses.replace(cfg, group_size=with_memory, first_index=g - with_memory),
                                  judge=judge)
    for traj in second:
        by_task[traj.task_id].append(traj)
    return [tr for t in tasks for tr in by_task[t.id]], stats + stats2, memories
