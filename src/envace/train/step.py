"""One GRPO optimisation step: micro-batches by token budget, exact gradient accumulation,
grad-norm clipping, AdamW over the trainable parameters only (so a peft LoRA model trains its
adapter and nothing else)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from envace.core.types import Role
from envace.policy.sampling import logprob_temperature
from envace.train.advantages import ScoredSample
from envace.train.batching import merge_trajectory_turns, padding_fraction, split_micro_batches
from envace.train.grpo_loss import LossAgg, grpo_loss, merge_loss_stats, role_normalizers
from envace.train.modes import ModeSpec


@dataclass(frozen=True)
class UpdaterConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    max_grad_norm: float | None = 1.0  # None: no clipping (the norm is still reported)
    micro_batch_tokens: int = 4096  # padded input tokens (rows x longest row) per forward
    ppo_epochs: int = 1  # optimiser steps on the same batch (one per epoch)
    clip: float = 0.2
    clip_high: float | None = None  # asymmetric upper clip (DAPO); None: same as clip
    agg: LossAgg = "token_mean"
    kl_coef: float = 0.0
    caller_weight: float = 1.0
    simulator_weight: float = 1.0
    temperature: float = 1.0  # the sampler's, so that new/old log-probs are comparable
    simulator_temperature: float | None = None  # the simulator role's, when it differs
    pad_id: int = 0
    with_entropy: bool = True
    # Zero-advantage samples add exactly nothing to the policy-gradient loss; without a KL term
    # they need no forward pass (they still count in the token_mean denominator).
    skip_zero_advantage: bool = True
    # token_mean only: a trajectory's caller turns run as one sequence where prompts allow.
    merge_turns: bool = True
    # Run a micro-batch's shared prompt prefixes once (same result; grpo_loss._decoder_hidden).
    share_prefixes: bool = True

    def role_weights(self) -> dict[Role, float]:
        return {"caller": self.caller_weight, "simulator": self.simulator_weight}

    def role_temperatures(self) -> float | dict[Role, float]:
        """What grpo_loss scales logits by: the sampler's log-prob temperature of each role
        (1 for a greedy role: greedy turns store log-probs at temperature 1)."""
        sim = self.temperature if self.simulator_temperature is None else self.simulator_temperature
        caller, sim = logprob_temperature(self.temperature), logprob_temperature(sim)
        return caller if caller == sim else {"caller": caller, "simulator": sim}


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class GRPOUpdater:
    """Owns one model's optimiser. ``step(scored)`` = ``ppo_epochs`` optimiser steps."""

    def __init__(
        self,
        model: nn.Module,
        config: UpdaterConfig = UpdaterConfig(),
        ref_model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        if config.ppo_epochs < 1:
            raise ValueError("ppo_epochs must be >= 1")
        if config.kl_coef and ref_model is None:
            raise ValueError("kl_coef > 0 needs a ref_model")
        self.model = model
        self.config = config
        self.ref_model = ref_model
        self.params = trainable_parameters(model)
        if not self.params:
            raise ValueError("model has no trainable parameters")
        self.optimizer = optimizer or torch.optim.AdamW(
            self.params,
            lr=config.lr,
            betas=config.betas,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.scheduler = scheduler

    def select(self, scored: Sequence[ScoredSample]) -> list[ScoredSample]:
        """Samples that can carry loss: a role with nonzero weight and at least one token."""
        weights = self.config.role_weights()
        return [s for s in scored if weights[s.role] != 0.0 and s.n_tokens > 0]

    def compute_gradients(self, scored: Sequence[ScoredSample]) -> dict[str, float]:
        """Zero the grads, then accumulate the full-batch loss gradient over micro-batches.

        Every micro-batch's role losses are normalised by the *full* batch's per-role counts,
        so the summed gradient equals the gradient of the full-batch loss exactly (up to float
        rounding), whatever the micro-batch split.
        """
        cfg = self.config
        self.optimizer.zero_grad(set_to_none=True)
        batch = self.select(scored)
        normalizers = role_normalizers(batch, cfg.agg)
        skipped = 0
        if cfg.skip_zero_advantage and self.ref_model is None:
            kept = [s for s in batch if s.advantage != 0.0]
            skipped = len(batch) - len(kept)
            batch = kept
        unmerged = len(batch)
        if cfg.merge_turns and cfg.agg == "token_mean":
            batch = merge_trajectory_turns(batch)
        micro = split_micro_batches(batch, cfg.micro_batch_tokens) if batch else []
        parts: list[dict[str, float]] = []
        for mb in micro:
            loss, stats = grpo_loss(
                self.model,
                mb,
                clip=cfg.clip,
                clip_high=cfg.clip_high,
                agg=cfg.agg,
                kl_coef=cfg.kl_coef,
                ref_model=self.ref_model,
                caller_weight=cfg.caller_weight,
                simulator_weight=cfg.simulator_weight,
                temperature=cfg.role_temperatures(),
                normalizers=normalizers,
                pad_id=cfg.pad_id,
                with_entropy=cfg.with_entropy,
                share_prefixes=cfg.share_prefixes,
            )
            loss.backward()
            parts.append(stats)
        out = merge_loss_stats(parts) if parts else {"loss": 0.0, "tokens": 0.0}
        out["micro_batches"] = float(len(micro))
        out["padding_frac"] = padding_fraction(micro)
        out["skipped_zero_adv"] = float(skipped)
        out["merged_away"] = float(unmerged - len(batch))  # turns that rode along in a merged sequence
        return out

    def step(self, scored: Sequence[ScoredSample]) -> dict[str, float]:
        """``ppo_epochs`` x (accumulate, clip grad norm, AdamW step). Returns the last epoch's
        stats plus ``grad_norm`` (before clipping), ``lr`` and ``optimizer_steps``. A batch with
        nothing to learn from (all advantages 0, or no trained role) takes no optimiser step,
        so weight decay and Adam momentum do not move the weights on no signal."""
        stats: dict[str, float] = {}
        steps = 0
        for _ in range(self.config.ppo_epochs):
            stats = self.compute_gradients(scored)
            if not stats["micro_batches"]:
                break
            max_norm = self.config.max_grad_norm
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.params, max_norm if max_norm is not None else math.inf
            )
            stats["grad_norm"] = float(grad_norm)
            self.optimizer.step()
            if self.scheduler is not None:
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            steps += 1
        stats["optimizer_steps"] = float(steps)
        stats["lr"] = float(self.optimizer.param_groups[0]["lr"])
        return stats


def updaters_for_mode(
    spec: ModeSpec,
    models: Mapping[str, nn.Module],
    config: UpdaterConfig = UpdaterConfig(),
    ref_models: Mapping[str, nn.Module] | None = None,
) -> dict[str, GRPOUpdater]:
    """One updater per trained model of ``spec``, each with the loss weights of the roles it
    trains (others 0). ``models`` maps the mode's model keys (``spec.model_keys``) to modules;
    frozen models get no updater (and should have ``requires_grad_(False)``)."""
    missing = [k for k in spec.model_keys if k not in models]
    if missing:
        raise ValueError(f"mode {spec.name!r} needs models {list(spec.model_keys)}; missing {missing}")
    out: dict[str, GRPOUpdater] = {}
    for key in spec.trained_models:
        w = spec.loss_weights(key, config.caller_weight, config.simulator_weight)
        cfg = dataclasses.replace(config, caller_weight=w["caller"], simulator_weight=w["simulator"])
        ref = ref_models.get(key) if ref_models else None
        out[key] = GRPOUpdater(models[key], cfg, ref_model=ref)
    return out


def update_for_mode(
    spec: ModeSpec, updaters: Mapping[str, GRPOUpdater], scored: Sequence[ScoredSample]
) -> dict[str, float]:
    """Step every trained model on its own samples; stats keys are prefixed ``<model>/``."""
    stats: dict[str, float] = {}
    for key, samples in spec.split_by_model(scored).items():
        for name, value in updaters[key].step(samples).items():
            stats[f"{key}/{name}"] = value
    return stats
