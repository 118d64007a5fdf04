"""Shared by the scale tests and the 2-process worker: a deterministic step's worth of
trajectories scored by the tiny model, and the updaters both sides train with."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

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
            context: list[int] = []  # the caller's conversation so far: later turns extend it (merge_turns)
            for turn in range(rng.randint(1, 3)):
                for role in ("caller", "simulator"):
                    prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, 20))]
                    if role == "caller":
                        prompt = context + prompt
                    gen = [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]
                    if role == "simulator" and turn == 1 and g == 0:
                        gen = [0]  # a content-free turn: exercises the empty penalty with content_free_ids
                    if role == "caller":
                        context = prompt + gen
                    samples.append(TurnSample(role=role, group_id=task, trajectory_index=g, turn=turn,
                                              prompt_ids=prompt, gen_ids=gen, logprobs=_logprobs(model, prompt, gen),
                                              format_ok=(rng.random() < 0.5) if role == "simulator" else None))
            out.append(Trajectory(task_id=task, source="rehearsal", trajectory_index=g,
                                  messages=[Message(role="user", content=f"task {task}")], samples=samples,
                                  reward=REWARDS[task][g]))
    return out


CALLER_CFG = UpdaterConfig(lr=0.5, max_grad_norm=None, micro_batch_tokens=48, with_entropy=True, anchor_coef=0.5)
SIM_CFG = UpdaterConfig(lr=1e-4, adam_eps=1e-4, max_grad_norm=0.05, micro_batch_tokens=64, ppo_epochs=2,
                        with_entropy=False, anchor_coef=0.3)


def make_anchor(vocab: int, seed: int = 1) -> list[TurnSample]:
    """Anchor samples of both roles (grpo.anchor_coef): the same on every rank, as a run draws them."""
    rng = random.Random(seed)
    out = []
    for i, role in enumerate(["caller", "simulator"] * 3):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, 20))]
        gen = [rng.randrange(vocab) for _ in range(rng.randint(2, 9))]
        out.append(TurnSample(role=role, group_id=f"anchor{i}", trajectory_index=0, turn=0, prompt_ids=prompt,
                              gen_ids=gen, logprobs=[0.0] * len(gen)))  # an NLL target: no sampler
    return out


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


def launch_two(target: list[str], cwd: Path) -> subprocess.Popen:
    """``accelerate launch`` with 2 processes on a free loopback port, as a user launches it.
    Without GPUs, ``--multi_gpu`` is what makes accelerate start 2 processes (torchrun; they run
    on CPU with gloo): without it, a CPU-only ``--num_processes 2`` starts one plain process.
    ``target``: a script path and its arguments, or ``["-m", module, ...]``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *target]
    # CPU and gloo on any machine (2 ranks on one GPU would be refused by NCCL).
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    """The launcher's exit code and output; on a timeout the launcher (and so its ranks) is ended."""
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, output
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
