"""The episode engine: (user) -> Act -> (validate) -> source -> Act ... batched over all running episodes.

Each step renders the caller prompt of every running episode (G per task, many tasks), generates
them in one batched call, parses tool calls, answers the valid ones through the response source
in one more batched call, and appends the tool messages. Invalid calls are answered here with a
structured error, as a real API would, and the episode goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Protocol

from envace.core.types import Message, Task, ToolCall, Trajectory, TurnSample, Verdict
from envace.reward.checklist import Judge, judge_trajectory
from envace.rollout.actors import Actor, ActorView
from envace.rollout.caller_turn import read_caller_turn
from envace.rollout.sources import ResponseSource, ToolRequest, ToolResponse, dump_result
from envace.rollout.stats import RolloutStats

@dataclass
class RolloutConfig:
    group_size: int = 1  # G trajectories per task
    max_turns: int | None = 4  # caller turns per episode (None: only the episodes' own limits)
    # Index of each task's first episode: a second batch of a task's group (episodes with a
    # rehearsal memory in training) continues the numbering, so (task, index) names one trajectory.
    first_index: int = 0
    # Training reward only: an unsolved episode of a task with a reference earns this share of its
    # in-order progress along the reference calls (reward/checklist.py:judge_trajectory); 0: off.
    progress_weight: float = 0.0


@dataclass
class Episode:
    """One running episode. ``history`` is what the caller sees, ``log`` what happened (they differ
    only where a :class:`UserTurns` hook shows the caller other context, e.g. gold history);
    ``turns`` holds the calls of each caller step, per user turn."""

    task: Task
    index: int
    state: Any
    history: list[Message] = field(default_factory=list)
    log: list[Message] = field(default_factory=list)
    turns: list[list[list[ToolCall]]] = field(default_factory=lambda: [[]])
    samples: list[TurnSample] = field(default_factory=list)
    earlier: list[tuple[ToolCall, str]] = field(default_factory=list)
    stop_reason: str | None = None
    forced: bool = False  # stopped by a limit, not by the caller or the user
    awaiting_user: bool = False
    steps: int = 0  # caller steps since the last user message
    max_steps: int | None = None  # caller steps per user turn before the episode is force-stopped
    execute: bool = True  # False: calls are recorded and scored, never answered (single-response benchmarks)
    tool_calls: int = 0
    parse_failures: int = 0
    sim_format_failures: int = 0
    gen_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def add(self, message: Message) -> None:
        self.history.append(message)
        self.log.append(message)

    def stop(self, reason: str, forced: bool = False) -> None:
        self.stop_reason, self.forced = reason, forced

    def trajectory(self, source: str) -> Trajectory:
        return Trajectory(
            task_id=self.task.id, source=source, trajectory_index=self.index,
            messages=[Message(role="user", content=self.task.instruction), *self.log],
            samples=self.samples, stop_reason=self.stop_reason or "max_turns", tool_calls=self.tool_calls,
            parse_failures=self.parse_failures, sim_format_failures=self.sim_format_failures,
            timings={"generation_s": round(self.gen_seconds, 4),
                     "episode_s": round(time.perf_counter() - self.started, 4)})


class UserTurns(Protocol):
    """The user's side of multi-turn episodes (a benchmark's scripted or simulated user). Without
    one, an episode is one user request and ends at the caller's first final answer."""

    def begin(self, episodes: list[Episode]) -> None:
        """Before the first caller turn: may rewrite each episode's task (its opening message) and
        set its limits (``max_steps``, ``execute``)."""

    def reply(self, episodes: list[Episode]) -> list[str | None]:
        """The next user message of each episode whose caller just answered; None: the user is
        done. May change what the caller sees from then on (``history``, ``task.tools``) or stop
        the episode itself (``Episode.stop``)."""


# (reward, verdicts) of a finished episode; the default judges the task's checklist.
Scorer = Callable[[Episode, Trajectory], tuple[float, list[Verdict]]]


def _user_step(eps: list[Episode], user: UserTurns) -> None:
    waiting = [e for e in eps if e.stop_reason is None and e.awaiting_user]
    if not waiting:
        return
    for e, text in zip(waiting, user.reply(waiting)):
        e.awaiting_user = False
        if e.stop_reason is not None:  # the hook stopped it (e.g. its user-turn limit)
            continue
        if text is None:
            e.stop("final_answer")
            continue
        e.add(Message(role="user", content=text))
        e.turns.append([])
        e.steps = 0


def _step_callers(eps: list[Episode], actor: Actor, turn: int, stats: RolloutStats, multi_turn: bool
                  ) -> list[tuple[Episode, list[tuple[ToolCall | None, dict | None]]]]:
    """One batched caller turn. Returns, per episode that called tools, each call with its
    immediate error (None when the call should go to the source)."""
    t0 = time.perf_counter()
    turns = actor.act([ActorView(task=e.task, history=e.history, turn=turn) for e in eps], turn)
    dt = time.perf_counter() - t0
    stats.caller_seconds += dt
    pending = []
    for ep, at in zip(eps, turns):
        if at is None:
            ep.stop("context_limit", forced=True)
            continue
        stats.caller_tokens += len(at.gen_ids)
        ep.gen_seconds += dt / len(eps)
        ct = read_caller_turn(at, ep.task, ep.task.id, ep.index, turn)
        if ct.sample is not None:
            ep.samples.append(ct.sample)
        ep.add(ct.message)
        if ct.final:
            if not ep.execute:  # a single-response episode: the reply is the answer
                ep.turns[-1].append([])
            if multi_turn and ep.execute:
                ep.awaiting_user = True
            else:
                ep.stop("final_answer")
            continue
        ep.steps += 1
        ep.parse_failures += int(ct.parse_failed)
        ep.tool_calls += len(ct.message.tool_calls)
        ep.turns[-1].append(list(ct.message.tool_calls))
        pending.append((ep, ct.calls))
        if not ep.execute:
            ep.stop("final_answer")
    return pending


def _answer_calls(pending: list[tuple[Episode, list[tuple[ToolCall | None, dict | None]]]], source: ResponseSource,
                  turn: int, stats: RolloutStats) -> None:
    """Every valid call of the turn goes to the source in one batch; invalid ones are answered
    here with their structured error."""
    requests = [ToolRequest(task=ep.task, call=call, earlier=list(ep.earlier), state=ep.state,
                            trajectory_index=ep.index, turn=turn)
                for ep, calls in pending if ep.execute for call, err in calls if err is None]
    responses = iter(source.respond(requests))
    for ep, calls in pending:
        if not ep.execute:
            continue
        for call, err in calls:
            resp = ToolResponse(text=dump_result(err), rehearsed=False) if err is not None else next(responses)
            if resp.sample is not None:
                ep.samples.append(resp.sample)
                stats.simulator_tokens += len(resp.sample.gen_ids)
            stats.simulator_seconds += resp.gen_seconds
            ep.gen_seconds += resp.gen_seconds
            ep.sim_format_failures += int(not resp.format_ok)
            ep.add(Message(role="tool", name=call.name if call else None, content=resp.text, rehearsed=resp.rehearsed))
            if call is not None:
                ep.earlier.append((call, resp.text))
        if ep.stop_reason is None and ep.max_steps is not None and ep.steps >= ep.max_steps:
            ep.stop("max_turns", forced=True)


def run_episodes(
    tasks: list[Task],
    actor: Actor,
    source: ResponseSource,
    cfg: RolloutConfig,
    judge: Judge | None = None,
    user: UserTurns | None = None,
    score: Scorer | None = None,
    on_turn: Callable[[int, int, int], None] | None = None,
) -> tuple[list[Trajectory], RolloutStats]:
    """Run ``cfg.group_size`` episodes per task; return finished, scored trajectories in task order.

    The one episode loop of envace (training rollouts, evaluation, test-time rehearsal, SFT data,
    benchmarks). ``user`` plays later user turns (default: none, the episode is one request);
    ``score`` scores a finished episode (default: the task's checklist, with the episode's world
    where the source is real); ``on_turn(turn, finished, total)`` is called after every batched
    turn (progress on long runs).
    """
    wall0 = time.perf_counter()
    stats = RolloutStats()
    episodes = [Episode(task=t, index=cfg.first_index + g, state=source.start(t))
                for t in tasks for g in range(cfg.group_size)]
    if user is not None:
        user.begin(episodes)
    turn = 0
    while cfg.max_turns is None or turn < cfg.max_turns:
        if user is not None:
            _user_step(episodes, user)
        running = [e for e in episodes if e.stop_reason is None]
        if not running:
            break
        pending = _step_callers(running, actor, turn, stats, multi_turn=user is not None)
        _answer_calls(pending, source, turn, stats)
        turn += 1
        if on_turn is not None:
            on_turn(turn, sum(e.stop_reason is not None for e in episodes), len(episodes))
    trajectories = []
    for ep in episodes:
        if ep.stop_reason is None:
            ep.stop("max_turns", forced=True)
        traj = ep.trajectory(source.name)
        try:
            if score is not None:
                traj.reward, traj.verdicts = score(ep, traj)
            else:
                world = ep.state if source.name == "real" else None
                traj.reward, traj.verdicts = judge_trajectory(ep.task, traj, world=world, judge=judge,
                                                              progress_weight=cfg.progress_weight)
        finally:
            finish = getattr(source, "finish", None)
            if callable(finish):
                finish(ep.state)  # a real episode's environment closes (an MCP session, its server)
        trajectories.append(traj)
    stats.episodes = len(episodes)
    stats.wall_seconds = time.perf_counter() - wall0
    return trajectories, stats
