"""The rehearsal gap, measured beside every real-world evaluation.

The same policy on the same tasks, twice: once against the real tools (``eval/success``), once
with the policy rehearsing every tool response and judged as a rehearsal training step judges
it (``eval/rehearsal_success``: no world, so only what a trajectory shows counts). A policy that
learned to succeed in its own rehearsal and not against the tools shows as a gap between them.
Beside it, the rehearse role's fidelity on the user's own tools: each call the real episodes
made, rehearsed greedily from the same history and compared with what the real tool returned,
and each recorded example rehearsed and compared with its recorded result
(:mod:`envace.testtime.fidelity`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envace.core import safejson
from envace.core.prompts import PromptStyle
from envace.core.types import Task, Trajectory, trajectory_calls
from envace.experiments.failures import FAILURE_CLASSES, class_shares, failure_rows
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.rehearse import ModelSource
from envace.rollout.stats import log_turns
from envace.rollout.sources import example_for, output_shape_error, record_holds
from envace.testtime.fidelity import (
    FidelityPair,
    cases_from_trajectories,
    example_cases,
    measure_fidelity,
    summarize_fidelity,
)

@dataclass
class GapSources:
    """The rehearse role three ways: rehearsing the episodes (as the eval samples the caller),
    rehearsing the real calls greedily (fidelity), and the recorded examples greedily without
    answering them from the record (else they match by construction)."""

    episodes: ModelSource
    calls: ModelSource
    examples: ModelSource


def gap_sources(backend: Any, style: PromptStyle, max_new_tokens: int, temperature: float, seed: int | None,
                examples_as_recorded: bool = True, fidelity_max_new_tokens: int | None = None) -> GapSources:
    """``max_new_tokens`` per rehearsed response in the episodes, ``fidelity_max_new_tokens`` (default
    the same: what a rehearsal step would write) in the fidelity comparisons."""

    def source(tokens: int, temp: float, recorded: bool, seed_: int | None) -> ModelSource:
        return ModelSource(backend=backend, name="rehearsal", record_samples=False, style=style,
                           max_new_tokens=tokens, temperature=temp, seed=seed_, examples_as_recorded=recorded)

    fid_tokens = fidelity_max_new_tokens or max_new_tokens
    return GapSources(source(max_new_tokens, temperature, examples_as_recorded, None if seed is None else seed + 104729),
                      source(fid_tokens, 0.0, examples_as_recorded, None),
                      source(fid_tokens, 0.0, False, None))


@dataclass
class GapParts:
    """One rank's share of a gap measurement (gathered across ranks before :func:`gap_metrics`)."""

    rehearsal: list[Trajectory] = field(default_factory=list)
    pairs: list[FidelityPair] = field(default_factory=list)


def run_gap(tasks: list[Task], real: list[Trajectory], actor: Any, sources: GapSources, max_turns: int,
            group_size: int = 1, judge: Any = None, log: Any = None) -> GapParts:
    """The rehearsal-judged episodes of ``tasks`` (``group_size`` each, as the real eval ran them)
    and the fidelity pairs of the real episodes' calls and the tasks' recorded examples."""
    progress = log_turns(log, "  eval, rehearsal-judged: ", max_turns) if log is not None else None
    trajs, _ = run_episodes(tasks, actor, sources.episodes, RolloutConfig(group_size=group_size, max_turns=max_turns),
                            judge=judge, on_turn=progress)
    t0 = time.perf_counter()
    pairs = measure_fidelity(tasks, cases_from_trajectories(tasks, real, "policy"), sources.calls)
    pairs += measure_fidelity(tasks, example_cases(tasks), sources.examples)
    if log is not None:
        log(f"  rehearsal gap: {len(trajs)} rehearsal-judged episodes, {len(pairs)} rehearsed responses compared "
            f"with the real ones in {time.perf_counter() - t0:.0f} s")
    return GapParts(trajs, pairs)


def shape_failures(task: Task, traj: Trajectory) -> int:
    """Rehearsed tool responses that are JSON but do not fit their tool's declared output shape."""
    n = 0
    for call, answer in trajectory_calls(traj):
        if not answer.rehearsed:
            continue
        value, why = safejson.loads(answer.content)
        n += why is None and output_shape_error(task, call, value) is not None
    return n


def recorded_answers(task: Task, traj: Trajectory) -> int:
    """Rehearsed tool responses to calls that match a recorded example of the task while the
    record holds (before the episode's first write): those a source with examples_as_recorded
    answers from the record."""
    n, earlier = 0, []
    for call, answer in trajectory_calls(traj):
        n += answer.rehearsed and example_for(task, call) is not None and record_holds(task, earlier)
        earlier.append((call, answer.content))
    return n


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _rate(rows: list[dict[str, Any]], key: str) -> float:
    return rows[0][key] if rows and rows[0].get(key) is not None else float("nan")


def gap_metrics(tasks: list[Task], real: list[Trajectory], parts: GapParts) -> dict[str, float]:
    """``eval/rehearsal_*`` beside the real eval's figures, the gap, and the rehearse role's
    fidelity (``eval/fidelity_*`` on the real calls, ``eval/example_*`` on the recorded examples)."""
    by_id = {t.id: t for t in tasks}
    reh = parts.rehearsal
    success = _mean([float(t.solved) for t in real])
    out: dict[str, float] = {
        "eval/rehearsal_success": _mean([float(t.solved) for t in reh]),
        "eval/rehearsal_reward": _mean([t.reward for t in reh]),
        "eval/rehearsal_tool_calls": _mean([float(t.tool_calls) for t in reh]),
        "eval/rehearsal_shape_failures": _mean([float(shape_failures(by_id[t.task_id], t)) for t in reh]),
        "eval/rehearsal_as_recorded": _mean([float(recorded_answers(by_id[t.task_id], t)) for t in reh]),
    }
    out["eval/rehearsal_gap"] = out["eval/rehearsal_success"] - success
    calls = summarize_fidelity([p for p in parts.pairs if p.origin == "policy"], ("origin",))
    examples = summarize_fidelity([p for p in parts.pairs if p.origin == "example"], ("origin",))
    out.update({"eval/fidelity_n": float(calls[0]["n"]) if calls else 0.0,
                "eval/fidelity_exact": _rate(calls, "exact"),
                "eval/fidelity_structure": _rate(calls, "structure"),
                "eval/fidelity_value": _rate(calls, "value"),
                "eval/fidelity_as_recorded": _rate(calls, "as_recorded"),
                "eval/fidelity_recorded_exact": _rate(calls, "recorded_exact"),
                "eval/example_n": float(examples[0]["n"]) if examples else 0.0,
                "eval/example_exact": _rate(examples, "exact"),
                "eval/example_structure": _rate(examples, "structure")})
    shares = class_shares(failure_rows(tasks, reh))
    out.update({f"eval/rehearsal_fail/{c}": shares[c] for c in FAILURE_CLASSES if c != "solved"})
    return {k: v for k, v in out.items() if v == v}  # NaN (nothing to measure, e.g. no call made): left out


def failure_metrics(tasks: list[Task], real: list[Trajectory]) -> dict[str, float]:
    """``eval/fail/<class>``: the share of the real eval's episodes in each failure class."""
    shares = class_shares(failure_rows(tasks, real))
    return {f"eval/fail/{c}": shares[c] for c in FAILURE_CLASSES if c != "solved"}
