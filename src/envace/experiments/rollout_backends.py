"""Who generates a training run's rollouts (``rollout.backend``), and keeping it in step with
the trainer: the caller and simulator roles' generation backends, the weight pushers of the
served ones, and whether the rollouts' log-probs are recomputed by the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from envace.experiments.config import TrainConfig
from envace.policy.http_backend import HTTPBackend
from envace.policy.llamacpp_backend import LlamaCppBackend  # imports without the llamacpp extra
from envace.policy.transformers_backend import TransformersBackend, generation_dtype
from envace.policy.vllm_backend import VLLMBackend  # imports without the vllm extra
from envace.policy.weight_sync import WeightPusher


@dataclass
class RolloutBackends:
    caller: Any
    simulator: Any
    pushers: list[WeightPusher] = field(default_factory=list)
    recompute: bool = False

    def sync(self) -> None:
        """Push every served trained model's weights (before the first rollout, after each update)."""
        for p in self.pushers:
            p.push()


def _http(url: str, tok: Any, batches: bool) -> Any:
    # One request per turn keeps the server's batching (and so its samples) the in-process one's.
    return HTTPBackend(url, tok, batch_prompts=batches, max_concurrency=1 if batches else 8, timeout=600.0)


def rollout_backends(cfg: TrainConfig, models: Any, sim_model: nn.Module, tok: Any, device: Any,
                     run_path: Path) -> RolloutBackends:
    """``sim_model``: the simulator role's model (the frozen start model under source simulator)."""
    r = cfg.rollout
    caller_model = models.for_role("caller")
    same = sim_model is caller_model  # share / frozen_caller: one model plays both roles
    sim_trained = any(m is sim_model for m in models.trained.values())
    sync_dir = run_path / "sync"
    low = generation_dtype(r.dtype)
    recompute = r.recomputes_logprobs

    def local(model: nn.Module) -> TransformersBackend:
        return TransformersBackend(model, tok, device=device, max_batch=r.max_batch, dtype=low,
                                   kv_reuse_tokens=r.kv_reuse_tokens)

    def frozen_sim() -> Any:  # an external simulator endpoint, as in the reference, or in process
        return _http(r.simulator_url, tok, r.server_batches) if r.simulator_url else local(sim_model)

    if r.backend == "transformers":
        caller = local(caller_model)
        # one model playing both roles: one backend (and one bf16 copy under rollout.dtype)
        sim = caller if same else frozen_sim() if not sim_trained else local(sim_model)
        return RolloutBackends(caller, sim, recompute=recompute)
    if r.backend == "http":
        if not r.server_url:
            raise ValueError("rollout.backend http needs rollout.server_url (e.g. start `envace serve --model "
                             f"{cfg.model} --allow-weight-updates --port 8000` and set http://127.0.0.1:8000/v1)")
        caller = _http(r.server_url, tok, r.server_batches)

        def trained_sim() -> Any:
            if not r.simulator_url:
                raise ValueError(f"rollout.backend http, mode {cfg.mode}: the trained simulator model needs a "
                                 "server of its own (rollout.simulator_url)")
            return _http(r.simulator_url, tok, r.server_batches)
    elif r.backend == "llamacpp":
        def llama(role: str) -> Any:  # the weights arrive by the pusher, before the first rollout
            return LlamaCppBackend(tok, quant=r.llamacpp_quant, max_batch=r.max_batch, n_ctx=r.llamacpp_ctx,
                                   work_dir=sync_dir / f"llamacpp-{role}")

        caller = llama("caller")

        def trained_sim() -> Any:
            return llama("simulator")
    else:
        caller = VLLMBackend.from_spec(cfg.model)

        def trained_sim() -> Any:
            return VLLMBackend.from_spec(cfg.sim_model or cfg.model)

    pushers = [WeightPusher(caller, caller_model, sync_dir / "caller.safetensors")]
    if same:
        return RolloutBackends(caller, caller, pushers, recompute)
    if not sim_trained:
        return RolloutBackends(caller, frozen_sim(), pushers, recompute)
    sim = trained_sim()  # noshare: the trained simulator is served and pushed too
    return RolloutBackends(caller, sim, [*pushers, WeightPusher(sim, sim_model, sync_dir / "simulator.safetensors")],
                           recompute)
