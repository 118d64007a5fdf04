"""Training samples with the lengths a real run has, without a model in the loop: the scripted
oracle plays each task against the real world, and every caller turn and every tool response of
its trajectory becomes a turn-sample (prompt rendered exactly as the rollout engine renders it).
Used by the training benchmarks (issue #6)."""

from __future__ import annotations

import random

from envace.core.prompts import PromptStyle, render_caller_prompt, render_simulator_prompt
from envace.core.toolcall import RESULT_CLOSE
from envace.core.types import Task, TurnSample
from envace.rollout.actors import OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource
from envace.train.advantages import ScoredSample


def oracle_samples(tokenizer, tasks: list[Task], style: PromptStyle, group_size: int, max_turns: int,
                   seed: int = 0) -> list[ScoredSample]:
    """``group_size`` copies of each task's oracle trajectory (cut at ``max_turns`` caller turns)
    as caller and simulator samples. Advantages are +-1 (seeded), so no sample is skipped as
    zero-advantage; logprobs are placeholders (fill them with the model before timing a PPO
    ratio that should start at 1)."""
    trajs, _ = run_episodes(tasks, OracleActor(), RealSource(), RolloutConfig(max_turns=max_turns))
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    rng = random.Random(seed)
    out: list[ScoredSample] = []
    for task, traj in zip(tasks, trajs):
        history = traj.messages[1:]
        base: list[TurnSample] = []
        earlier = []
        pending: list = []  # calls of the last caller turn not answered yet
        for i, msg in enumerate(history):
            if msg.role == "assistant":
                prompt = render_caller_prompt(tokenizer, task, history[:i], style)
                gen = tokenizer(msg.content, add_special_tokens=False)["input_ids"]
                gen = list(gen) + (eos if not msg.tool_calls else [])  # a final answer ends with EOS
                base.append(TurnSample(role="caller", group_id=task.id, trajectory_index=0, turn=i // 2,
                                       prompt_ids=prompt, gen_ids=gen, logprobs=[-1.0] * len(gen)))
                pending = list(msg.tool_calls)
            elif msg.role == "tool" and pending:
                call = pending.pop(0)
                prompt = render_simulator_prompt(tokenizer, task, call, earlier, style)
                gen = list(tokenizer(msg.content + RESULT_CLOSE, add_special_tokens=False)["input_ids"])
                base.append(TurnSample(role="simulator", group_id=task.id, trajectory_index=0, turn=i // 2,
                                       prompt_ids=prompt, gen_ids=gen, logprobs=[-1.0] * len(gen)))
                earlier.append((call, msg.content))
        for g in range(group_size):
            adv = rng.choice([-1.0, 1.0])
            for s in base:
                out.append(ScoredSample(sample=s.model_copy(update={"trajectory_index": g}), advantage=adv,
                                        reward=0.5 + adv / 2))
    return out


def sample_stats(scored: list[ScoredSample]) -> str:
    n = len(scored)
    prompt = sum(len(s.sample.prompt_ids) for s in scored)
    gen = sum(s.n_tokens for s in scored)
    roles = {r: sum(s.role == r for s in scored) for r in ("caller", "simulator")}
    return (f"{n} samples ({roles['caller']} caller, {roles['simulator']} simulator), {prompt + gen} tokens: "
            f"{prompt} prompt + {gen} generated; mean length {(prompt + gen) / max(n, 1):.0f}")
