"""The episode engine: Act -> (validate) -> source -> Act ... batched over all running episodes.

Each step renders the caller prompt of every running episode (G per task, many tasks), generates
them in one batched call, parses tool calls, answers the valid ones through the response source
in one more batched call, and appends the tool messages. Invalid calls are answered here with a
structured error, as a real API would, and the episode goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envace.core.errors import INVALID_TOOL_CALL_FORMAT, tool_error
from envace.core.safejson import clean_text
from envace.core.toolcall import parse_tool_calls
from envace.core.types import Message, Task, ToolCall, Trajectory, TurnSample
from envace.core.validate import validate_call
from envace.reward.checklist import Judge, judge_trajectory
from envace.rollout.actors import Actor, ActorTurn, ActorView
from envace.rollout.sources import ResponseSource, ToolRequest, ToolResponse, dump_result

# Tokens a cut-off turn's tail must repeat to count as a loop: longer than the keys between two
# values of a JSON list item, so a long but varied result does not count.
LOOP_SPAN = 24


@dataclass
class RolloutConfig:
    group_size: int = 1  # G trajectories per task
    max_turns: int = 4  # caller turns per episode


@dataclass
class RolloutStats:
    episodes: int = 0
    caller_tokens: int = 0
    simulator_tokens: int = 0
    caller_seconds: float = 0.0
    simulator_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        gen_s = self.caller_seconds + self.simulator_seconds
        return (self.caller_tokens + self.simulator_tokens) / gen_s if gen_s > 0 else 0.0


@dataclass
class _Episode:
    task: Task
    index: int
    state: Any
    history: list[Message] = field(default_factory=list)
    samples: list[TurnSample] = field(default_factory=list)
    earlier: list[tuple[ToolCall, str]] = field(default_factory=list)
    stop_reason: str | None = None
    tool_calls: int = 0
    parse_failures: int = 0
    sim_format_failures: int = 0
    gen_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)


@dataclass
class CallerTurn:
    """What one actor turn means for the episode: the assistant message, its training sample, and
    each call with its immediate error (None: send it to the source). ``calls`` is empty for a
    final answer; a malformed turn yields one ``(None, INVALID_TOOL_CALL_FORMAT)`` entry."""

    message: Message
    sample: TurnSample | None
    final: bool
    parse_failed: bool
    calls: list[tuple[ToolCall | None, dict | None]]


def read_caller_turn(at: ActorTurn, task: Task, group_id: str, index: int, turn: int) -> CallerTurn:
    """Shared by every episode loop (this engine, the benchmark runner)."""
    sample = None
    if at.trainable:
        sample = TurnSample(role="caller", group_id=group_id, trajectory_index=index, turn=turn,
                            prompt_ids=at.prompt_ids, gen_ids=at.gen_ids, logprobs=at.logprobs, finish=at.finish)
    parsed = parse_tool_calls(at.text)
    # Cleaned: a lone surrogate in the model's text would break the next prompt's tokenizer.
    message = Message(role="assistant", content=clean_text(at.text).strip(), tool_calls=parsed.calls)
    if parsed.is_final:
        calls: list[tuple[ToolCall | None, dict | None]] = []
    elif parsed.error is not None:
        calls = [(None, tool_error(INVALID_TOOL_CALL_FORMAT, parsed.error))]
    else:
        calls = [(c, validate_call(c, task.tools)) for c in parsed.calls]
    return CallerTurn(message=message, sample=sample, final=parsed.is_final,
                      parse_failed=parsed.error is not None, calls=calls)


def _step_callers(eps: list[_Episode], actor: Actor, turn: int, stats: RolloutStats
                  ) -> list[tuple[_Episode, list[tuple[ToolCall | None, dict | None]]]]:
    """One batched caller turn. Returns, per episode that called tools, each call with its
    immediate error (None when the call should go to the source)."""
    t0 = time.perf_counter()
    turns = actor.act([ActorView(task=e.task, history=e.history, turn=turn) for e in eps], turn)
    dt = time.perf_counter() - t0
    stats.caller_seconds += dt
    pending = []
    for ep, at in zip(eps, turns):
        if at is None:
            ep.stop_reason = "context_limit"
            continue
        stats.caller_tokens += len(at.gen_ids)
        ep.gen_seconds += dt / len(eps)
        ct = read_caller_turn(at, ep.task, ep.task.id, ep.index, turn)
        if ct.sample is not None:
            ep.samples.append(ct.sample)
        ep.history.append(ct.message)
        if ct.final:
            ep.stop_reason = "final_answer"
            continue
        ep.parse_failures += int(ct.parse_failed)
        ep.tool_calls += len(ct.message.tool_calls)
        pending.append((ep, ct.calls))
    return pending


def run_episodes(
    tasks: list[Task],
    actor: Actor,
    source: ResponseSource,
    cfg: RolloutConfig,
    judge: Judge | None = None,
) -> tuple[list[Trajectory], RolloutStats]:
    """Run ``cfg.group_size`` episodes per task; return finished, judged trajectories in task order."""
    wall0 = time.perf_counter()
    stats = RolloutStats()
    episodes = [_Episode(task=t, index=g, state=source.start(t)) for t in tasks for g in range(cfg.group_size)]
    for turn in range(cfg.max_turns):
        running = [e for e in episodes if e.stop_reason is None]
        if not running:
            break
        pending = _step_callers(running, actor, turn, stats)
        requests: list[ToolRequest] = []
        for ep, calls in pending:
            for call, err in calls:
                if err is None:
                    requests.append(ToolRequest(task=ep.task, call=call, earlier=list(ep.earlier), state=ep.state,
                                                trajectory_index=ep.index, turn=turn))
        responses = iter(source.respond(requests))
        for ep, calls in pending:
            for call, err in calls:
                resp = ToolResponse(text=dump_result(err), rehearsed=False) if err is not None else next(responses)
                if resp.sample is not None:
                    ep.samples.append(resp.sample)
                    stats.simulator_tokens += len(resp.sample.gen_ids)
                stats.simulator_seconds += resp.gen_seconds
                ep.gen_seconds += resp.gen_seconds
                ep.sim_format_failures += int(not resp.format_ok)
                ep.history.append(Message(role="tool", name=call.name if call else None, content=resp.text,
                                          rehearsed=resp.rehearsed))
                if call is not None:
                    ep.earlier.append((call, resp.text))
    trajectories = []
    for ep in episodes:
        traj = Trajectory(
            task_id=ep.task.id, source=source.name, trajectory_index=ep.index,
            messages=[Message(role="user", content=ep.task.instruction), *ep.history],
            samples=ep.samples, stop_reason=ep.stop_reason or "max_turns", tool_calls=ep.tool_calls,
            parse_failures=ep.parse_failures, sim_format_failures=ep.sim_format_failures,
            timings={"generation_s": round(ep.gen_seconds, 4),
                     "episode_s": round(time.perf_counter() - ep.started, 4)},
        )
        world = ep.state if source.name == "real" else None
        try:
            traj.reward, traj.verdicts = judge_trajectory(ep.task, traj, world=world, judge=judge)
        finally:
            finish = getattr(source, "finish", None)
            if callable(finish):
                finish(ep.state)  # a real episode's environment closes (an MCP session, its server)
        trajectories.append(traj)
    stats.episodes = len(episodes)
    stats.wall_seconds = time.perf_counter() - wall0
    return trajectories, stats


@dataclass
class Truncation:
    """One role's turns: how many stopped at the token cap, how many of those were stuck
    repeating themselves (a decoding loop), and how many there were."""

    cut: int = 0
    looped: int = 0
    turns: int = 0


def ends_in_loop(ids: list[int], span: int = LOOP_SPAN) -> bool:
    """Whether the last ``span`` tokens already occur earlier in ``ids``: a turn cut off while
    repeating itself (greedy decoding of a small model does this). A longer cap only repeats
    more, so telling it apart from a turn that is merely long says which remedy applies."""
    if len(ids) < 2 * span:
        return False
    tail = ids[-span:]
    return any(ids[i:i + span] == tail for i in range(len(ids) - span))


def truncation_counts(trajectories: list[Trajectory]) -> dict[str, Truncation]:
    """Per role, the turns that stopped at the token cap instead of ending: a cut-off tool call
    does not parse and a cut-off rehearsed response is not JSON, so a high share means the cap
    (or a decoding loop), not what the model meant, is failing the episodes."""
    counts: dict[str, Truncation] = {}
    for traj in trajectories:
        for s in traj.samples:
            c = counts.setdefault(s.role, Truncation())
            cut = s.finish == "length"
            c.cut += cut
            c.looped += cut and ends_in_loop(s.gen_ids)
            c.turns += 1
    return dict(sorted(counts.items()))


def truncated_fractions(trajectories: list[Trajectory]) -> dict[str, float]:
    """``truncated/<role>``: the share of the role's turns cut off at the cap."""
    return {f"truncated/{role}": c.cut / c.turns for role, c in truncation_counts(trajectories).items()}
