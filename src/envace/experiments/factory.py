"""Builds backends, actors and response sources from names, so configs and the CLI stay thin."""

from __future__ import annotations

from typing import Any

from envace.experiments.config import GenerationSettings
from envace.policy.http_backend import HTTPBackend
from envace.policy.transformers_backend import TransformersBackend
from envace.reward.judge import ChatJudge, ModelJudge
from envace.rollout.actors import PolicyActor
from envace.rollout.rehearse import ModelSource
from envace.rollout.sources import RealSource, ResponseSource

SOURCES = ("real", "rehearsal", "simulator")


def load_backend(spec: str, max_batch: int = 16) -> TransformersBackend:
    return TransformersBackend.from_spec(spec, max_batch=max_batch)


def make_actor(backend: Any, gen: GenerationSettings, seed: int | None) -> PolicyActor:
    return PolicyActor(backend=backend, style=gen.style, max_new_tokens=gen.caller_max_new_tokens,
                       max_prompt_tokens=gen.max_prompt_tokens, temperature=gen.temperature, top_p=gen.top_p,
                       seed=seed)


def make_source(name: str, policy: Any, gen: GenerationSettings, seed: int | None,
                simulator: Any | None = None, world: Any = None) -> ResponseSource:
    """``rehearsal`` uses the policy itself; ``simulator`` a separate frozen backend; ``real``
    each task's own world, else ``world`` (the run's --world). Close a real source when done."""
    if name == "real":
        return RealSource(world)
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r}; choose one of {SOURCES}")
    backend = policy if name == "rehearsal" else simulator
    if backend is None:
        raise ValueError("source 'simulator' needs a simulator model (--sim-model)")
    return ModelSource(backend=backend, name=name, record_samples=name == "rehearsal", style=gen.style,
                       max_new_tokens=gen.simulator_max_new_tokens,
                       temperature=gen.temperature if gen.simulator_temperature is None else gen.simulator_temperature,
                       top_p=gen.top_p,
                       seed=None if seed is None else seed + 104729, examples_as_recorded=gen.examples_as_recorded,
                       example_reward=gen.example_reward)


def make_judge(cfg: Any, policy: Any | None = None) -> Any:
    """The judge of ``judge`` checklist items from a config's ``judge:`` section (None: no judge):
    an OpenAI-compatible endpoint (``url``), a local model (``model``), or else the policy."""
    if cfg is None:
        return None
    if cfg.url:
        client = HTTPBackend(cfg.url, model=cfg.served_model, api_key_env=cfg.api_key_env, timeout=cfg.timeout_s,
                             max_retries=cfg.retries, server_extras=False)
        return ChatJudge(client, max_new_tokens=cfg.max_new_tokens)
    backend = load_backend(cfg.model) if cfg.model else policy
    if backend is None:
        raise ValueError("judge: give a model or a url (no policy to judge with here)")
    return ModelJudge(backend, max_new_tokens=cfg.max_new_tokens)
