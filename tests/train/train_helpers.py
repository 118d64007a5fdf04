"""Helpers for the train tests: a tiny random Llama and samples scored by it."""

from __future__ import annotations

import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from envace.core.types import Role, TurnSample
from envace.train.advantages import ScoredSample

VOCAB = 256


def make_tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    return LlamaForCausalLM(config).float()


@torch.no_grad()
def sampler_logprobs(model: torch.nn.Module, prompt: list[int], gen: list[int], temperature: float = 1.0) -> list[float]:
    """What a sampler records: log_softmax(logits / T) of each generated token, one unpadded row."""
    if not gen:
        return []
    ids = torch.tensor([prompt + gen])
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    logits = getattr(out, "logits", out)[0].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    p = len(prompt)
    return [float(logp[p + k - 1, t]) for k, t in enumerate(gen)]


def make_sample(
    model: torch.nn.Module | None,
    role: Role,
    prompt: list[int],
    gen: list[int],
    group_id: str = "g0",
    trajectory_index: int = 0,
    turn: int = 0,
    temperature: float = 1.0,
) -> TurnSample:
    logprobs = sampler_logprobs(model, prompt, gen, temperature) if model is not None else [-1.0] * len(gen)
    return TurnSample(
        role=role,
        group_id=group_id,
        trajectory_index=trajectory_index,
        turn=turn,
        prompt_ids=prompt,
        gen_ids=gen,
        logprobs=logprobs,
    )


def random_scored_batch(
    model: torch.nn.Module,
    n: int,
    seed: int = 0,
    roles: tuple[Role, ...] = ("caller", "simulator"),
    temperature: float = 1.0,
) -> list[ScoredSample]:
    """n samples of varied prompt/gen lengths, alternating roles, advantages in [-1, 1]."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 12))]
        gen = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 8))]
        s = make_sample(model, roles[i % len(roles)], prompt, gen, trajectory_index=i, temperature=temperature)
        out.append(ScoredSample(sample=s, advantage=rng.uniform(-1, 1), reward=0.0))
    return out
