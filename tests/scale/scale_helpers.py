"""Shared by the scale tests and the 2-process worker: a deterministic step's worth of
trajectories scored by the tiny model, and the updaters both sides train with."""

from __future__ import annotations

import random

import torch

from envace.core.types import Message, Trajectory, TurnSample
from envace.policy.loading import load_model
from envace.train.step import GRPOUpdater, UpdaterConfig

# Three tasks x G=2: with two ranks, rank 0 rolls out tasks 0 and 2, rank 1 task 1, so the
# ranks hold different numbers of samples and micro-batches. Task t2's rewards are all equal
# (zero advantages: nothing to learn from that group).
TASKS = ("t0", "t1", "t2")
G = 2
REWARDS = {"t0": (1.0, 0.0), "t1": (0.25, 1.0), "t2": (0.5, 0.5)}


def tiny_models():
    """Two copies of the tiny Llama (caller, simulator) in train mode. The simulator's vocabulary
    head is untied from its embeddings (as in Qwen3-8B), so the head has parameters of its own."""
    caller, tok = load_model("tiny")
    simulator, _ = load_model("tiny")
    simulator.config.tie_word_embeddings = False
    simulator.lm_head.weight = torch.nn.Parameter(simulator.lm_head.weight.detach().clone())
    return caller.train(), simulator.train(), tok


@torch.no_grad()
def _logprobs(model, prompt: list[int], gen: list[int]) -> list[float]:
    ids = torch.tensor([prompt + gen])
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[len(prompt) + k - 1, t]) for k, t in enumerate(gen)]


def make_trajectories(model, vocab: int, seed: int = 0) -> list[Trajectory]:
    """G trajectories per task, each with caller and simulator turns of varied lengths; the
    sampler logprobs are the model's own (PPO ratio 1 at the start)."""
    rng = random.Random(seed)
    out = []
    for task in TASKS:
        for g in range(G):
            samples = []
            for turn in range(rng.randint(1, 3)):
                for role in ("caller", "simulator"):
                    prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, 20))]
                    gen = [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]
                    if role == "simulator" and turn == 1 and g == 0:
                        gen = [0]  # a content-free turn: exercises the empty penalty with content_free_ids
                    samples.append(TurnSample(role=role, group_id=task, trajectory_index=g, turn=turn,
                                              prompt_ids=prompt, gen_ids=gen, logprobs=_logprobs(model, prompt, gen),
                                              format_ok=(rng.random() < 0.5) if role == "simulator" else None))
            out.append(Trajectory(task_id=task, source="rehearsal", trajectory_index=g,
                                  messages=[Message(role="user", content=f"task {task}")], samples=samples,
                                  reward=REWARDS[task][g]))
    return out


CALLER_CFG = UpdaterConfig(lr=0.5, max_grad_norm=None, micro_batch_tokens=48, with_entropy=True)
SIM_CFG = UpdaterConfig(lr=1e-4, adam_eps=1e-4, max_grad_norm=0.05, micro_batch_tokens=64, ppo_epochs=2,
                        with_entropy=False)


def make_updaters(caller, simulator) -> dict[str, GRPOUpdater]:
    """noshare mode: the caller model trains with SGD (its update is proportional to the gradient,
    so a wrongly scaled gradient shows), the simulator model with AdamW, clipping and 2 epochs."""
    from envace.train.modes import ModeSpec

    spec = ModeSpec.for_mode("noshare")
    ups = {}
    for key, model, cfg in (("caller", caller, CALLER_CFG), ("simulator", simulator, SIM_CFG)):
        w = spec.loss_weights(key)
        import dataclasses

        cfg = dataclasses.replace(cfg, caller_weight=w["caller"], simulator_weight=w["simulator"])
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr) if key == "caller" else None
        ups[key] = GRPOUpdater(model, cfg, optimizer=opt)
    return ups
