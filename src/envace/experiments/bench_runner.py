"""The benchmark episode loop: the rollout engine's Act -> validate -> source step, plus user turns.

The rollout engine runs one user request per episode. Benchmarks need more: BFCL multi-turn
scripts several user turns (and adds tools mid-episode), tau2 and VitaBench simulate the user with
a model. This loop is that smallest extension: a caller *turn* ends with a reply that has no tool
call (or, for single-response benchmarks, with the first reply), then the ``user`` answers; the
episode ends when the user has nothing more to say, or the benchmark's step limit is hit.

It uses the same actors (``rollout.actors``) and response sources (``real``: the benchmark's own
executable environment via :class:`BenchRealSource`; ``rehearsal``/``simulator``: a model under
the simulator prompt) as the engine, so every response source runs on every benchmark.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from envace.benchmarks.base import BenchEpisode, BenchItem
from envace.core.errors import tool_error
from envace.core.types import Message, Source, Task, ToolCall, Trajectory, TurnSample
from envace.rollout.actors import Actor, ActorView
from envace.rollout.engine import read_caller_turn
from envace.rollout.sources import ResponseSource, ToolRequest, ToolResponse, dump_result


class User(Protocol):
    def respond(self, items: list[BenchItem], conversations: list[list[Message]]) -> list[str | None]:
        """The next user message of each episode, or None when that user is done."""


class ScriptedUser:
    """Replays the benchmark's scripted user turns (BFCL multi-turn)."""

    def respond(self, items: list[BenchItem], conversations: list[list[Message]]) -> list[str | None]:
        out: list[str | None] = []
        for item, conv in zip(items, conversations):
            done = sum(1 for m in conv if m.role == "user") - 1  # the first is the opening
            out.append(item.user_turns[done] if done < len(item.user_turns) else None)
        return out


class BenchRealSource:
    """The benchmark's executable environment as the ``real`` response source."""

    name: Source = "real"

    def __init__(self, adapter: Any, items: list[BenchItem]) -> None:
        self.adapter = adapter
        self.items = {i.id: i for i in items}

    def start(self, task: Task) -> Any:
        return self.adapter.make_world(self.items[task.id])

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        out = []
        for r in requests:
            if r.state is None:
                result = tool_error("NOT_EXECUTED", "this benchmark scores calls without executing them")
            else:
                result = r.state.call(r.call.name, r.call.arguments)
            out.append(ToolResponse(text=dump_result(result), rehearsed=False))
        return out


@dataclass
class _Ep:
    item: BenchItem
    index: int
    task: Task
    state: Any
    history: list[Message] = field(default_factory=list)  # what the caller sees after the first user message
    log: list[Message] = field(default_factory=list)  # what happened (differs from history under turn_context)
    turns: list[list[list[ToolCall]]] = field(default_factory=lambda: [[]])
    samples: list[TurnSample] = field(default_factory=list)
    earlier: list[tuple[ToolCall, str]] = field(default_factory=list)
    steps: int = 0  # caller steps in the current user turn
    stop_reason: str | None = None
    forced: bool = False
    tool_calls: int = 0
    parse_failures: int = 0
    sim_format_failures: int = 0
    awaiting_user: bool = False
    opening: str = ""  # the user's first message (the task instruction, or a simulated user's opening)
    started: float = field(default_factory=time.perf_counter)

    def add(self, message: Message) -> None:
        self.history.append(message)
        self.log.append(message)

    def episode(self) -> BenchEpisode:
        return BenchEpisode(item_id=self.item.id, turns=self.turns, messages=self.conversation(),
                            force_terminated=self.forced, stop_reason=self.stop_reason or "max_turns")

    def conversation(self) -> list[Message]:
        """The first user message (policy preamble included), then every later user, caller and tool
        message of the episode (the caller's own turns even where a turn was shown gold history)."""
        return [Message(role="user", content=self.task.instruction), *self.log]

    def user_view(self) -> list[Message]:
        """What the user saw and said: its own opening, then the conversation."""
        return [Message(role="user", content=self.opening), *self.log]


def _with_tools(task: Task, item: BenchItem, user_turn: int) -> Task:
    added = [t for i, ts in sorted(item.tools_added.items()) if i <= user_turn for t in ts]
    if not added:
        return task
    names = {t.name for t in item.task.tools}
    return task.model_copy(update={"tools": [*item.task.tools, *[t for t in added if t.name not in names]]})


def _replies(waiting: list[Any], user: User, sim_ids: set[int]) -> list[str | None]:
    simulated = [e for e in waiting if id(e) in sim_ids]
    scripted = [e for e in waiting if id(e) not in sim_ids]
    got: dict[int, str | None] = {}
    scripted_user = ScriptedUser() if hasattr(user, "open") else user  # a simulated user needs a scenario
    for group, who in ((simulated, user), (scripted, scripted_user)):
        if group:
            got.update(zip(map(id, group), who.respond([e.item for e in group], [e.user_view() for e in group])))
    return [got[id(e)] for e in waiting]


def run_bench_episodes(items: list[BenchItem], actor: Actor, source: ResponseSource, user: User | None = None,
                       group_size: int = 1, max_steps: int | None = None, max_user_turns: int = 30,
                       ) -> list[tuple[Trajectory, BenchEpisode, Any]]:
    """Run every item ``group_size`` times; return (trajectory, episode, final state) per episode.

    ``max_steps`` caps caller steps per user turn (default: the benchmark's own limit); reaching
    it force-terminates the episode, as BFCL does.
    """
    user = user or ScriptedUser()
    eps = [_Ep(item=it, index=g, task=it.task, state=source.start(it.task)) for it in items for g in range(group_size)]
    simulated = [e for e in eps if e.item.user_scenario is not None and hasattr(user, "open")]
    sim_ids = {id(e) for e in simulated}
    openings = iter(user.open([e.item for e in simulated]) if simulated else [])  # type: ignore[attr-defined]
    for e in eps:
        e.opening = next(openings) if id(e) in sim_ids else e.item.task.instruction
        first = e.opening
        if e.item.system_prompt:
            first = f"[agent policy]\n{e.item.system_prompt}\n\n[user]\n{first}"
        e.task = e.task.model_copy(update={"instruction": first})
    k = 0
    while True:
        # user turns first: episodes whose caller finished a turn get the next user message
        waiting = [e for e in eps if e.stop_reason is None and e.awaiting_user]
        if waiting:
            # A simulated user plays the episodes with a scenario; the others (BFCL's scripted turns,
            # tau2's solo mode) get their scripted turns, if any.
            replies = _replies(waiting, user, sim_ids)
            for e, text in zip(waiting, replies):
                e.awaiting_user = False
                n_user = sum(1 for m in e.log if m.role == "user") + 1
                if text is None:
                    e.stop_reason = "final_answer"
                    continue
                if n_user > max_user_turns:
                    e.stop_reason, e.forced = "max_turns", True
                    continue
                ctx = e.item.turn_context.get(len(e.turns))
                if ctx is not None:  # the benchmark conditions this turn on its own (gold) history
                    e.history = [m.model_copy(deep=True) for m in ctx]
                e.add(Message(role="user", content=text))
                e.turns.append([])
                e.steps = 0
                e.task = _with_tools(e.task, e.item, len(e.turns) - 1)
        running = [e for e in eps if e.stop_reason is None]
        if not running:
            break
        acts = actor.act([ActorView(task=e.task, history=e.history, turn=k) for e in running], k)
        pending: list[tuple[_Ep, list[tuple[ToolCall | None, dict | None]]]] = []
        for e, at in zip(running, acts):
            if at is None:
                e.stop_reason = "context_limit"
                e.forced = True
                continue
            ct = read_caller_turn(at, e.task, e.item.id, e.index, k)
            if ct.sample is not None:
                e.samples.append(ct.sample)
            e.add(ct.message)
            if ct.final:
                e.awaiting_user = True
                if not e.item.execute:  # single-response benchmark: the reply is the answer
                    e.turns[-1].append([])
                    e.stop_reason = "final_answer"
                continue
            e.steps += 1
            e.parse_failures += int(ct.parse_failed)
            e.tool_calls += len(ct.message.tool_calls)
            e.turns[-1].append(list(ct.message.tool_calls))
            pending.append((e, ct.calls))
            if not e.item.execute:
                e.stop_reason = "final_answer"
        requests = [ToolRequest(task=e.task, call=c, earlier=list(e.earlier), state=e.state,
                                trajectory_index=e.index, turn=k)
                    for e, calls in pending for c, err in calls if err is None and e.item.execute]
        responses = iter(source.respond(requests))
        for e, calls in pending:
            for c, err in calls:
                if err is None and not e.item.execute:
                    continue
                resp = ToolResponse(text=dump_result(err), rehearsed=False) if err is not None else next(responses)
                if resp.sample is not None:
                    e.samples.append(resp.sample)
                e.sim_format_failures += int(not resp.format_ok)
                e.add(Message(role="tool", name=c.name if c else None, content=resp.text,
                              rehearsed=resp.rehearsed))
                if c is not None:
                    e.earlier.append((c, resp.text))
            limit = max_steps or e.item.max_steps
            if e.stop_reason is None and e.steps >= limit:
                e.stop_reason, e.forced = "max_turns", True
        k += 1
    out = []
    for e in eps:
        traj = Trajectory(task_id=e.item.id, source=source.name, trajectory_index=e.index, messages=e.conversation(),
                          samples=e.samples, stop_reason=e.stop_reason or "max_turns", tool_calls=e.tool_calls,
                          parse_failures=e.parse_failures, sim_format_failures=e.sim_format_failures,
                          timings={"episode_s": round(time.perf_counter() - e.started, 4)})
        out.append((traj, e.episode(), e.state))
    return out


def bench_user(adapter: Any, backend: Any, seed: int | None) -> User:
    """The benchmark's simulated user played by ``backend`` where it has one (tau2, VitaBench),
    else its scripted user turns."""
    make = getattr(adapter, "make_user", None)
    return (make(backend, seed=seed) if make else None) or ScriptedUser()


def run_scored_episodes(adapter: Any, items: list[BenchItem], actor: Actor, source: ResponseSource | None,
                        user: User, group_size: int = 1, max_steps: int | None = None, max_user_turns: int = 30,
                        ) -> list[tuple[Trajectory, Any]]:
    """:func:`run_bench_episodes` scored by the benchmark: (trajectory with ``reward`` set, the
    benchmark's score) per episode. ``source`` None: the benchmark's real environment, whose final
    state the scorer then sees; otherwise the scorer judges the episode without a world."""
    real = source is None
    results = run_bench_episodes(items, actor, BenchRealSource(adapter, items) if real else source, user,
                                 group_size=group_size, max_steps=max_steps, max_user_turns=max_user_turns)
    by_id = {i.id: i for i in items}
    out = []
    for traj, episode, state in results:
        score = adapter.score(by_id[traj.task_id], episode, state if real else None)
        traj.reward = score.reward
        out.append((traj, score))
    return out
