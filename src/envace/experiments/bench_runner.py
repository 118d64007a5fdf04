"""Benchmarks through the one episode engine (``rollout.engine.run_episodes``).

Benchmarks need more than one user request per episode: BFCL multi-turn scripts several user
turns (and adds tools mid-episode), tau2 and VitaBench simulate the user with a model, FinMCP
shows gold history before each turn. :class:`BenchUsers` is that user side as the engine's
``UserTurns`` hook: a caller *turn* ends with a reply that has no tool call (or, for
single-response benchmarks, with the first reply), then the user answers; the episode ends when
the user has nothing more to say, or the benchmark's step limit is hit. The engine's actors and
response sources (``real``: the benchmark's own executable environment via
:class:`BenchRealSource`; ``rehearsal``/``simulator``: a model under the simulator prompt) run
unchanged, so every response source runs on every benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from envace.benchmarks.base import BenchEpisode, BenchItem
from envace.core.errors import tool_error
from envace.core.types import Message, Source, Task, Trajectory
from envace.rollout.actors import Actor
from envace.rollout.engine import Episode, RolloutConfig, run_episodes
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


def _with_tools(task: Task, item: BenchItem, user_turn: int) -> Task:
    added = [t for i, ts in sorted(item.tools_added.items()) if i <= user_turn for t in ts]
    if not added:
        return task
    names = {t.name for t in item.task.tools}
    return task.model_copy(update={"tools": [*item.task.tools, *[t for t in added if t.name not in names]]})


class BenchUsers:
    """A benchmark's user side as the episode engine's :class:`~envace.rollout.engine.UserTurns`:
    the opening (the item's instruction, or a simulated user's first message, after the
    benchmark's agent policy), later scripted or simulated user turns, tools added per turn,
    gold context per turn, and the benchmark's step and user-turn limits."""

    def __init__(self, items: list[BenchItem], user: User, max_steps: int | None = None,
                 max_user_turns: int = 30) -> None:
        self.items = {i.id: i for i in items}
        self.user = user
        self.max_steps = max_steps
        self.max_user_turns = max_user_turns
        self.openings: dict[int, str] = {}
        self.simulated: set[int] = set()

    def item(self, ep: Episode) -> BenchItem:
        return self.items[ep.task.id]

    def begin(self, episodes: list[Episode]) -> None:
        if hasattr(self.user, "open"):  # a simulated user plays the items that give it a scenario
            self.simulated = {id(e) for e in episodes if self.item(e).user_scenario is not None}
        simulated = [e for e in episodes if id(e) in self.simulated]
        openings = iter(self.user.open([self.item(e) for e in simulated]) if simulated else [])  # type: ignore[attr-defined]
        for e in episodes:
            item = self.item(e)
            opening = next(openings) if id(e) in self.simulated else item.task.instruction
            self.openings[id(e)] = opening
            first = f"[agent policy]\n{item.system_prompt}\n\n[user]\n{opening}" if item.system_prompt else opening
            e.task = e.task.model_copy(update={"instruction": first})
            e.max_steps = self.max_steps or item.max_steps
            e.execute = item.execute

    def user_view(self, ep: Episode) -> list[Message]:
        """What the user saw and said: its own opening, then the conversation."""
        return [Message(role="user", content=self.openings[id(ep)]), *ep.log]

    def reply(self, episodes: list[Episode]) -> list[str | None]:
        # The simulated user answers the episodes with a scenario; the others (BFCL's scripted
        # turns, tau2's solo mode) get their scripted turns, if any.
        scripted_user = ScriptedUser() if hasattr(self.user, "open") else self.user
        got: dict[int, str | None] = {}
        for group, who in (([e for e in episodes if id(e) in self.simulated], self.user),
                           ([e for e in episodes if id(e) not in self.simulated], scripted_user)):
            if group:
                got.update(zip(map(id, group), who.respond([self.item(e) for e in group],
                                                           [self.user_view(e) for e in group])))
        out = []
        for e in episodes:
            text = got[id(e)]
            if text is not None and sum(1 for m in e.log if m.role == "user") + 1 > self.max_user_turns:
                e.stop("max_turns", forced=True)
            elif text is not None:
                item = self.item(e)
                ctx = item.turn_context.get(len(e.turns))
                if ctx is not None:  # the benchmark conditions this turn on its own (gold) history
                    e.history = [m.model_copy(deep=True) for m in ctx]
                e.task = _with_tools(e.task, item, len(e.turns))
            out.append(text)
        return out


def bench_episode(ep: Episode) -> BenchEpisode:
    """An engine episode segmented the way benchmark scorers want it."""
    return BenchEpisode(item_id=ep.task.id, turns=ep.turns,
                        messages=[Message(role="user", content=ep.task.instruction), *ep.log],
                        force_terminated=ep.forced, stop_reason=ep.stop_reason or "max_turns")


def bench_user(adapter: Any, backend: Any, seed: int | None) -> User:
    """The benchmark's simulated user played by ``backend`` where it has one (tau2, VitaBench),
    else its scripted user turns."""
    make = getattr(adapter, "make_user", None)
    return (make(backend, seed=seed) if make else None) or ScriptedUser()


@dataclass
class BenchRun:
    """One benchmark episode: the trajectory (``reward`` set), the benchmark's score, the episode
    as the scorer saw it, and the final world state (None unless the source was real)."""

    trajectory: Trajectory
    score: Any
    episode: BenchEpisode
    state: Any


def run_scored_episodes(adapter: Any, items: list[BenchItem], actor: Actor, source: ResponseSource | None,
                        user: User | None = None, group_size: int = 1, max_steps: int | None = None,
                        max_user_turns: int = 30) -> list[BenchRun]:
    """Every item ``group_size`` times through the episode engine, scored by the benchmark.

    ``source`` None: the benchmark's real environment, whose final state the scorer then sees;
    otherwise the scorer judges the episode without a world. ``user`` plays later user turns
    (default: the items' scripted turns). ``max_steps`` caps caller steps per user turn (default:
    the benchmark's own limit); reaching it force-terminates the episode, as BFCL does."""
    real = source is None
    by_id = {i.id: i for i in items}
    runs: list[BenchRun] = []

    def score(ep: Episode, traj: Trajectory) -> tuple[float, list]:
        episode, state = bench_episode(ep), ep.state if real else None
        result = adapter.score(by_id[ep.task.id], episode, state)
        runs.append(BenchRun(trajectory=traj, score=result, episode=episode, state=state))
        return result.reward, []

    users = BenchUsers(items, user or ScriptedUser(), max_steps, max_user_turns)
    run_episodes([i.task for i in items], actor, BenchRealSource(adapter, items) if real else source,
                 RolloutConfig(group_size=group_size, max_turns=None), user=users, score=score)
    return runs


def bench_play(adapter: Any, items: list[BenchItem], user: User | None = None, max_steps: int | None = None,
               max_user_turns: int = 30) -> Any:
    """``run_episodes`` for benchmark items with their user turns and the benchmark's scorer
    without a world (what private rehearsal plays: ``testtime.rehearsal.rehearse(play=...)``)."""
    by_id = {i.id: i for i in items}

    def score(ep: Episode, traj: Trajectory) -> tuple[float, list]:
        return adapter.score(by_id[ep.task.id], bench_episode(ep), None).reward, []

    def play(tasks: list[Task], actor: Actor, source: ResponseSource, cfg: RolloutConfig, on_turn=None) -> Any:
        users = BenchUsers([by_id[t.id] for t in tasks], user or ScriptedUser(), max_steps, max_user_turns)
        return run_episodes(tasks, actor, source, RolloutConfig(group_size=cfg.group_size, max_turns=None),
                            user=users, score=score, on_turn=on_turn)

    return play
