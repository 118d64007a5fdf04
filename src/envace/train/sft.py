"""SFT warm start: teach a small model both formats from the scripted oracle's real trajectories.

Caller samples: the caller prompt before each oracle turn -> that turn's text (a final answer
ends with EOS so the model learns to stop). Simulator samples: the simulator prompt for each real
call -> the real result JSON and the closing tag, so the model starts out as a world model that
has seen real responses.
"""

from __future__ import annotations

from typing import Any

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from envace.core.prompts import PromptStyle, render_caller_prompt, render_simulator_prompt
from envace.core.toolcall import RESULT_CLOSE, RESULT_OPEN
from envace.core.types import Role, Task, ToolCall, Trajectory, TurnSample, trajectory_calls
from envace.envs.probes import error_probes as probe_calls
from envace.rollout.actors import OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource, dump_result
from envace.train.advantages import ScoredSample
from envace.train.batching import merge_turns, split_micro_batches
from envace.train.forward import MixedPrecision, autocast, sft_loss
from envace.train.step import trainable_parameters


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


def oracle_sft_samples(tasks: Sequence[Task], tokenizer, style: PromptStyle,
                       roles: Sequence[Role] = ("caller", "simulator"), merge_caller: bool = True,
                       simulator_tasks: int | None = None, world: Any = None,
                       error_probes: int = 0) -> list[TurnSample]:
    """SFT samples of the oracle's real trajectories on ``tasks``; simulator samples only from
    the first ``simulator_tasks`` of them (None: all). Simulator targets are long JSON results:
    on a CPU budget they cost most of the SFT tokens, while the caller needs the most epochs."""
    source = RealSource(world)  # each task's own world, else the run's
    try:
        trajs, _ = run_episodes(list(tasks), OracleActor(), source, RolloutConfig(max_turns=12))
    finally:
        source.close()
    bad = [t.task_id for t in trajs if t.reward < 1.0]
    if bad:
        raise ValueError(f"oracle failed on tasks {bad[:5]}: their references are inconsistent")
    n_sim = len(tasks) if simulator_tasks is None else simulator_tasks
    return [s for i, (task, t) in enumerate(zip(tasks, trajs))
            for s in sft_samples(task, t, tokenizer, style, [r for r in roles if r == "caller" or i < n_sim],
                                 merge_caller, error_probes)]


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
            mixed_precision: MixedPrecision = "no") -> SFTStats:
    """Plain AdamW fine-tuning over shuffled batches of ``batch_samples``, accumulated over
    micro-batches that fit ``micro_batch_tokens``; learning rate per ``lr_factor``; the forward
    under ``mixed_precision`` (forward.autocast)."""
    if not samples:
        raise ValueError("run_sft: no samples")
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
                    loss = sft_loss(model, [m.sample for m in mb], tokens, pad_id)
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            first = total if step == 1 else first
            last = total
            if on_step is not None:
                on_step(step, total_steps, total)
    return SFTStats(steps=step, samples=len(samples), tokens=sum(s.target_count for s in samples),
                    first_loss=first, last_loss=last)
