"""SFT warm start: teach a small model both formats from the scripted oracle's real trajectories.

Caller samples: the caller prompt before each oracle turn -> that turn's text (a final answer
ends with EOS so the model learns to stop). Simulator samples: the simulator prompt for each real
call -> the real result JSON and the closing tag, so the model starts out as a world model that
has seen real responses.

The oracle replays a task's reference in its real world, or, with no world, answers each call
with the result recorded in the reference (``reference.calls[i].result``). The tasks' ``examples``
(real call/result pairs) become simulator samples of their own, world or not. A replay that a
tool answered ``ENVIRONMENT_ERROR`` / ``TOOL_EXECUTION_ERROR`` (a crashed server, a wrong state)
is dropped and counted: it would teach the caller that its reference calls fail.
"""

from __future__ import annotations

from typing import Any

import json
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from envace.core.prompts import PromptStyle, render_caller_prompt, render_simulator_prompt
from envace.core.toolcall import RESULT_CLOSE, RESULT_OPEN
from envace.core.errors import error_code
from envace.core.types import Role, Task, ToolCall, Trajectory, TurnSample, trajectory_calls
from envace.envs.probes import error_probes as probe_calls
from envace.envs.provider import ENVIRONMENT_ERROR, TOOL_EXECUTION_ERROR, cap_result
from envace.rollout.actors import OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource, ToolRequest, ToolResponse, dump_result
from envace.train.advantages import ScoredSample
from envace.train.batching import merge_turns, split_micro_batches
from envace.train.forward import MixedPrecision, autocast, sft_loss
from envace.train.step import enable_gradient_checkpointing, trainable_parameters


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def sft_samples(task: Task, traj: Trajectory, tokenizer, style: PromptStyle,
                roles: Sequence[Role] = ("caller", "simulator"), merge_caller: bool = True,
                error_probes: int = 0) -> list[TurnSample]:
    """Supervised (prompt, target) pairs of one oracle trajectory, as TurnSamples; with
    ``merge_caller`` the caller turns become one multi-turn sample where the template allows.
    ``error_probes``: with simulator samples, up to that many more whose call has a plausible id
    the world does not have, the target its real error (``envace.envs.probes``): the oracle never
    errs, so without them the world model only ever sees a call succeed."""
    out: list[TurnSample] = []
    history = traj.messages[1:]  # the first message is the user instruction, rendered by the prompt
    eos = tokenizer.eos_token_id
    if "caller" in roles:
        turns = []
        for i, m in enumerate(history):
            if m.role != "assistant":
                continue
            target = _ids(tokenizer, m.content) + ([eos] if not m.tool_calls and eos is not None else [])
            turns.append(TurnSample(role="caller", group_id=task.id, trajectory_index=0, turn=i,
                                    prompt_ids=render_caller_prompt(tokenizer, task, history[:i], style),
                                    gen_ids=target, logprobs=[0.0] * len(target)))
        merged = merge_turns(turns) if merge_caller and len(turns) > 1 else None
        out += [merged] if merged is not None else turns
    if "simulator" in roles:
        pairs = [(c, a.content) for c, a in trajectory_calls(traj)]

        def sample(call: ToolCall, position: int, result_text: str, turn: int) -> TurnSample:
            """The simulator prompt for ``call`` after the real calls before ``position`` -> the result."""
            body = result_text + RESULT_CLOSE
            target = _ids(tokenizer, body if style.prefill_result_tag else RESULT_OPEN + body)
            return TurnSample(role="simulator", group_id=task.id, trajectory_index=0, turn=turn,
                              prompt_ids=render_simulator_prompt(tokenizer, task, call, pairs[:position], style),
                              gen_ids=target, logprobs=[0.0] * len(target))

        out += [sample(call, i, text, i) for i, (call, text) in enumerate(pairs)]
        probes = probe_calls(task, [c for c, _ in pairs], error_probes, rng=random.Random(f"probes:{task.id}"))
        out += [sample(p.call, p.position, dump_result(p.result), len(pairs) + p.position) for p in probes]
    return out


# A replayed reference call answered with one of these did not meet the world the reference was
# written for: a crashed or hung server, or a state other than the recorded one.
REPLAY_FAILURES = (ENVIRONMENT_ERROR, TOOL_EXECUTION_ERROR)
ORACLE_MAX_TURNS = 12


def in_world(task: Task, world: Any = None) -> bool:
    """The task has a real world to replay its reference in: its own ``env.world`` or the run's."""
    return (task.env is not None and task.env.world is not None) or world is not None


def replayable(task: Task, world: Any = None) -> bool:
    """The oracle can replay the task's reference: in a real world, or from its recorded results."""
    return why_not_replayable(task, world) is None


def why_not_replayable(task: Task, world: Any = None) -> str | None:
    """Why the oracle cannot replay ``task`` (None: it can), as the run log words it."""
    ref = task.reference
    if ref is None:
        return "no reference"
    if not in_world(task, world) and not all(c.result is not None for c in ref.calls):
        return "no world and no recorded results in the reference"
    return None


def oracle_replays(tasks: Sequence[Task], source: Any) -> list[Trajectory]:
    """Each task's reference replayed by the oracle, ``source`` answering (a RealSource is closed
    afterwards), scored: in task order."""
    turns = max(ORACLE_MAX_TURNS, max((len(t.reference.calls) for t in tasks if t.reference), default=0) + 1)
    try:
        trajs, _ = run_episodes(list(tasks), OracleActor(), source, RolloutConfig(max_turns=turns))
    finally:
        if isinstance(source, RealSource):
            source.close()
    return trajs


def record_reference_results(rows: list[dict], replays: Sequence[Trajectory], where: str) -> None:
    """Write each replayed reference call's result into its task row (``reference.calls[i].result``),
    as a task file records them; a tool error, or fewer results than calls, is an error naming the row."""
    for row, traj in zip(rows, replays):
        results = [json.loads(m.content) for m in traj.messages if m.role == "tool"]
        errors = [r for r in results if error_code(r)]
        assert not errors, f"{row['id']}: the reference's calls failed {where}: {errors}"
        calls = row["reference"]["calls"]
        assert len(results) == len(calls), f"{row['id']}: {len(results)} results for {len(calls)} calls"
        for c, result in zip(calls, results):
            c["result"] = result


def assert_full_marks(task: Task, traj: Trajectory, where: str) -> None:
    """The reference's replay ``traj`` meets every checklist item of ``task``."""
    unmet = [v for v in traj.verdicts if v.met is not True]
    assert traj.reward == 1.0 and not unmet, f"{task.id}: reference reward {traj.reward} {where}: {unmet}"


class RecordedSource:
    """Answers the i-th call of an oracle episode with the result recorded in the task's reference
    (``reference.calls[i].result``): the reference replayed with no world. The results are real
    ones (recorded from the tools), so the source counts as ``real``; no world state exists, so
    ``state`` items go unjudged."""

    name = "real"

    def start(self, task: Task) -> None:
        return None

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        out = []
        for r in requests:
            calls = r.task.reference.calls if r.task.reference is not None else []
            i = len(r.earlier)
            if i < len(calls) and calls[i].name == r.call.name and calls[i].arguments == r.call.arguments:
                value = calls[i].result
            else:  # only the oracle runs here, and it makes exactly the reference's calls
                value = {"error": {"code": ENVIRONMENT_ERROR, "message": "no recorded result for this call"}}
            out.append(ToolResponse(text=recorded_text(value), rehearsed=False))
        return out


def recorded_text(value: Any) -> str:
    """A result recorded in the task file as the caller would see it from a live world: JSON text,
    capped (with a marker) as a world's results are (``envs.provider.cap_result``)."""
    return dump_result(cap_result(value)[0])


def replay_failure(traj: Trajectory) -> str | None:
    """The first REPLAY_FAILURES code a tool answered in ``traj`` (None: no such answer)."""
    for _, answer in trajectory_calls(traj):
        try:
            code = error_code(json.loads(answer.content))
        except (ValueError, RecursionError):
            continue
        if code in REPLAY_FAILURES:
            return code
    return None


@dataclass
class WarmStartData:
    """What the warm start trains on, and how it came by it (for the run log)."""

    samples: list[TurnSample] = field(default_factory=list)
    in_world: int = 0  # reference replays answered by a real world
    from_records: int = 0  # reference replays answered with the reference's recorded results
    example_samples: int = 0  # simulator samples made from the tasks' recorded examples
    dropped: dict[str, list[str]] = field(default_factory=dict)  # error code -> ids of the dropped replays
    skipped: Counter = field(default_factory=Counter)  # why a task gave no replay -> how many

    def counts(self) -> dict[str, int]:
        return dict(Counter(s.role for s in self.samples))

    def describe(self) -> str:
        """One line: N caller samples from ..., M simulator samples from ..., K tasks skipped because ..."""
        roles = self.counts()
        replays = (f"{self.in_world + self.from_records} reference replays ({self.in_world} in a real world, "
                   f"{self.from_records} from recorded results)")
        n_sim = roles.get("simulator", 0)
        parts = [f"{roles.get('caller', 0)} caller samples from {replays}",
                 f"{n_sim} simulator samples ({n_sim - self.example_samples} from replayed calls, "
                 f"{self.example_samples} from recorded examples)"]
        for code, ids in self.dropped.items():
            parts.append(f"{len(ids)} replays dropped: a call was answered {code} (a crashed server or a state "
                         f"other than the reference's; e.g. {', '.join(ids[:3])})")
        if self.skipped:
            parts.append(f"{sum(self.skipped.values())} tasks skipped: "
                         + "; ".join(f"{why} ({n})" for why, n in self.skipped.most_common()))
        return ", ".join(parts)


def example_sft_samples(tasks: Sequence[Task], tokenizer, style: PromptStyle, limit: int | None = None,
                        seed: int = 0) -> list[TurnSample]:
    """Simulator samples of the tasks' recorded examples, each distinct example once (at most
    ``limit``, drawn by ``seed``): the simulator prompt for the example's call in its task, with the
    example itself left out of the prompt's grounding (else the target is a copy of the prompt) ->
    the recorded result and the closing tag. Examples that recorded a crashed server are skipped."""
    seen: dict[str, tuple[Task, int]] = {}
    for task in tasks:
        for i, ex in enumerate(task.examples):
            if error_code(ex.result) == ENVIRONMENT_ERROR:
                continue
            key = json.dumps([ex.tool, ex.arguments, ex.result], sort_keys=True, default=str)
            seen.setdefault(key, (task, i))
    picked = list(seen.values())
    if limit is not None and len(picked) > limit:
        picked = random.Random(f"examples:{seed}").sample(picked, limit)
    out = []
    for n, (task, i) in enumerate(picked):
        ex = task.examples[i]
        others = task.model_copy(update={"examples": task.examples[:i] + task.examples[i + 1:]})
        body = recorded_text(ex.result) + RESULT_CLOSE
        target = _ids(tokenizer, body if style.prefill_result_tag else RESULT_OPEN + body)
        prompt = render_simulator_prompt(tokenizer, others, ToolCall(name=ex.tool, arguments=ex.arguments), [], style)
        out.append(TurnSample(role="simulator", group_id=task.id, trajectory_index=0, turn=1000 + n,
                              prompt_ids=prompt, gen_ids=target, logprobs=[0.0] * len(target)))
    return out


def oracle_warm_start(tasks: Sequence[Task], tokenizer, style: PromptStyle,
                      roles: Sequence[Role] = ("caller", "simulator"), merge_caller: bool = True,
                      simulator_tasks: int | None = None, world: Any = None, error_probes: int = 0,
                      example_tasks: Sequence[Task] = (), example_limit: int | None = None,
                      seed: int = 0) -> WarmStartData:
    """The warm start's samples: the oracle's trajectories on ``tasks`` (each replayed in its real
    world, else from its recorded results; tasks with neither are skipped and counted), simulator
    samples only from the first ``simulator_tasks`` replays (None: all), and, with the simulator
    role, up to ``example_limit`` samples of ``example_tasks``' recorded examples. Simulator targets
    are long JSON results: on a CPU budget they cost most of the SFT tokens, while the caller needs
    the most epochs."""
    data = WarmStartData()
    world_tasks = [t for t in tasks if replayable(t, world) and in_world(t, world)]
    record_tasks = [t for t in tasks if replayable(t, world) and not in_world(t, world)]
    for t in tasks:
        if (why := why_not_replayable(t, world)) is not None:
            data.skipped[why] += 1
    replays: dict[str, Trajectory] = {}
    for part, source in ((world_tasks, RealSource(world) if world_tasks else None),
                         (record_tasks, RecordedSource())):
        if not part:
            continue
        replays.update((t.task_id, t) for t in oracle_replays(part, source))
    kept = []
    for task in tasks:
        traj = replays.get(task.id)
        if traj is None:
            continue
        code = replay_failure(traj)
        if code is not None:
            data.dropped.setdefault(code, []).append(task.id)
            continue
        kept.append((task, traj))
    bad = [t.task_id for _, t in kept if t.reward < 1.0]
    if bad:
        raise ValueError(f"oracle failed on tasks {bad[:5]}: their references are inconsistent")
    data.in_world = sum(in_world(task, world) for task, _ in kept)
    data.from_records = len(kept) - data.in_world
    n_sim = len(kept) if simulator_tasks is None else simulator_tasks
    data.samples = [s for i, (task, t) in enumerate(kept)
                    for s in sft_samples(task, t, tokenizer, style, [r for r in roles if r == "caller" or i < n_sim],
                                         merge_caller, error_probes)]
    if "simulator" in roles and example_tasks and (example_limit is None or example_limit > 0):
        examples = example_sft_samples(example_tasks, tokenizer, style, example_limit, seed)
        data.samples += examples
        data.example_samples = len(examples)
    return data


def oracle_sft_samples(tasks: Sequence[Task], tokenizer, style: PromptStyle,
                       roles: Sequence[Role] = ("caller", "simulator"), merge_caller: bool = True,
                       simulator_tasks: int | None = None, world: Any = None,
                       error_probes: int = 0) -> list[TurnSample]:
    """The samples of :func:`oracle_warm_start` on ``tasks``' reference replays alone."""
    return oracle_warm_start(tasks, tokenizer, style, roles, merge_caller, simulator_tasks, world,
                             error_probes).samples


def target_turn_lengths(samples: Sequence[TurnSample]) -> dict[str, list[int]]:
    """Per role, the token length of every turn the samples teach (a merged caller sample holds
    several: each run of loss-bearing tokens is one), i.e. what generation must fit."""
    out: dict[str, list[int]] = {}
    for s in samples:
        mask = s.loss_mask if s.loss_mask is not None else [True] * len(s.gen_ids)
        runs, n = out.setdefault(s.role, []), 0
        for bit in [*mask, False]:
            if bit:
                n += 1
            elif n:
                runs.append(n)
                n = 0
    return out


@dataclass
class SFTStats:
    steps: int
    samples: int
    tokens: int
    first_loss: float
    last_loss: float


def lr_factor(step: int, total: int, schedule: str, warmup: float = 0.05) -> float:
    """Multiplier of the base learning rate at optimiser step ``step`` (0-based) of ``total``:
    ``constant``, or ``cosine`` (linear warm-up over ``warmup`` of the steps, then cosine to 0).
    From-scratch models end much lower with the decay than at a constant rate."""
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"unknown learning-rate schedule {schedule!r} (constant | cosine)")
    ramp = max(1, int(total * warmup))
    if step < ramp:
        return (step + 1) / ramp
    return 0.5 * (1.0 + math.cos(math.pi * (step - ramp) / max(1, total - ramp)))


def run_sft(model: nn.Module, samples: Sequence[TurnSample], epochs: int = 2, lr: float = 2e-4,
            batch_samples: int = 16, micro_batch_tokens: int = 4096, seed: int = 0, pad_id: int = 0,
            on_step: Callable[[int, int, float], None] | None = None, schedule: str = "constant",
            mixed_precision: MixedPrecision = "no",
            on_row: Callable[[dict[str, float]], None] | None = None,
            gradient_checkpointing: bool = False) -> SFTStats:
    """Plain AdamW fine-tuning over shuffled batches of ``batch_samples``, accumulated over
    micro-batches that fit ``micro_batch_tokens``; learning rate per ``lr_factor``; the forward
    under ``mixed_precision`` (forward.autocast), with each layer's activations recomputed in the
    backward under ``gradient_checkpointing``. ``on_row``: each step's figures (``sft/loss``,
    ``sft/lr``, ``sft/tokens``), for a metrics log."""
    if not samples:
        raise ValueError("run_sft: no samples")
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params, lr=lr)
    rng = random.Random(seed)
    order = list(samples)
    n_batches = -(-len(order) // batch_samples)
    total_steps = epochs * n_batches
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, total_steps, schedule))
    first = last = float("nan")
    step = 0
    model.train()
    for _ in range(epochs):
        rng.shuffle(order)
        for b in range(n_batches):
            batch = order[b * batch_samples:(b + 1) * batch_samples]
            tokens = sum(s.target_count for s in batch)
            opt.zero_grad(set_to_none=True)
            total = 0.0
            scored = [ScoredSample(sample=s, advantage=1.0, reward=1.0) for s in batch]
            for mb in split_micro_batches(scored, micro_batch_tokens):
                with autocast(model, mixed_precision):
                    loss = sft_loss(model, [m.sample for m in mb], tokens, pad_id,
                                    share_prefixes=not gradient_checkpointing)
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            lr_now = opt.param_groups[0]["lr"]  # this step's, before the schedule moves it
            opt.step()
            sched.step()
            step += 1
            first = total if step == 1 else first
            last = total
            if on_step is not None:
                on_step(step, total_steps, total)
            if on_row is not None:
                on_row({"sft/loss": total, "sft/lr": lr_now, "sft/tokens": float(tokens)})
    return SFTStats(steps=step, samples=len(samples), tokens=sum(s.target_count for s in samples),
                    first_loss=first, last_loss=last)
