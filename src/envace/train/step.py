"""One GRPO optimisation step: micro-batches by token budget, exact gradient accumulation,
grad-norm clipping, AdamW over the trainable parameters only (so a peft LoRA model trains its
adapter and nothing else)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from envace.core.types import Role, TurnSample
from envace.core.sampling import logprob_temperature
from envace.train.advantages import ScoredSample
from envace.train.batching import merge_trajectory_turns, padding_fraction, split_micro_batches
from envace.train.collectives import (gather_objects, launched_distributed, merge_rank_stats, num_processes,
                                      reduce_max, reduce_sum, set_sync)
from envace.train.forward import MixedPrecision, autocast, batch_loss, sft_loss
from envace.train.grpo_loss import ROLES, LossAgg, OldLogprobs, role_normalizers
from envace.train.loss_support import merge_loss_stats
from envace.train.modes import ModeSpec


class UpdateSettings(BaseModel):
    """The updater's settings that a training config's ``grpo:`` section sets (declared once, here;
    experiments.config.GRPOConfig adds the section's advantage and schedule settings)."""

    # strict and closed as every config section: a typo or a string number is an error
    model_config = ConfigDict(extra="forbid", strict=True)

    lr: float = Field(1e-4, gt=0, description="AdamW learning rate of the GRPO update (peak, after the ramp)")
    clip: float = Field(0.2, gt=0, description="PPO clip range of the probability ratio (1 +/- clip)")
    agg: LossAgg = Field("token_mean", description="how token losses are averaged: token_mean (every generated "
                         "token weighs the same) or seq_mean (each sample's mean, then the mean of samples)")
    kl_coef: float = Field(0.0, ge=0, description="weight of a KL penalty to the start policy (0: none, as the "
                           "reference run)")
    anchor_coef: float = Field(0.0, ge=0, description="weight of the warm-start anchor in every update: the mean "
                               "token NLL of `anchor_samples` SFT samples of the warm start's oracle trajectories "
                               "(drawn per step), added to the GRPO loss; holds what groups that all succeed give "
                               "no gradient for. 0: off")
    caller_weight: float = Field(1.0, ge=0, description="weight of the caller role's loss in the summed objective")
    simulator_weight: float = Field(1.0, ge=0, description="weight of the rehearse (simulator) role's loss in the "
                                    "summed objective")
    micro_batch_tokens: int = Field(4096, ge=64, description="padded input tokens (rows x longest row) per forward")
    ppo_epochs: int = Field(1, ge=1, description="optimiser steps on the same batch (one per epoch)")
    max_grad_norm: float | None = Field(1.0, description="None: no clipping (the norm is still reported)")
    gradient_checkpointing: bool = Field(False, description="recompute each layer's activations in the backward "
                                         "instead of keeping them (the SFT warm start's too): less memory per "
                                         "micro-batch for more "
                                         "compute (each layer runs twice), and shared prompt prefixes are no "
                                         "longer run once per group")
    is_cap: float | None = Field(None, gt=0, description="when the trainer scores rollouts from another engine "
                                 "(rollout.recompute_logprobs, ppo_epochs 1), weight each token's loss by the "
                                 "truncated importance weight min(exp(trainer - rollout log-prob), is_cap), as TRL "
                                 "and verl do for vLLM; None: off (2.0 with rollout.backend llamacpp)")


@dataclass(frozen=True)
class _UpdaterOwn:
    """UpdaterConfig's own fields (see below): what the run derives (the sampler's temperatures,
    the pad id, the precision) and the optimiser's and the loss's internals."""

    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    clip_high: float | None = None  # asymmetric upper clip (DAPO); None: same as clip
    temperature: float = 1.0  # the sampler's, so that new/old log-probs are comparable
    simulator_temperature: float | None = None  # the simulator role's, when it differs
    pad_id: int = 0
    with_entropy: bool = True
    # Zero-advantage samples add exactly nothing to the policy-gradient loss; without a KL term
    # they need no forward pass (they still count in the token_mean denominator).
    skip_zero_advantage: bool = True
    # token_mean only: a trajectory's caller turns run as one sequence where prompts allow.
    merge_turns: bool = True
    # Run a micro-batch's shared prompt prefixes once (same result; forward._decoder_hidden).
    share_prefixes: bool = True
    # "current": the PPO ratio's denominator is the update's own forward (detached), i.e. the
    # trainer's log-probs at the step's weights: what a separate recompute pass would give, for
    # rollouts from another engine or dtype, without that pass. One optimiser step per batch only.
    old_logprobs: OldLogprobs = "sampler"
    # The forward's compute dtype (forward.autocast); the backward follows it.
    mixed_precision: MixedPrecision = "no"

    @classmethod
    def from_sections(cls, section: Any, **extra: Any) -> Any:
        """The update settings of ``section`` (the ``grpo`` section: an UpdateSettings), plus
        ``extra``: no field is copied by hand."""
        return cls(**{k: getattr(section, k) for k in UpdateSettings.model_fields}, **extra)

    def loss_settings(self) -> dict[str, Any]:
        """The loss's own settings (``forward.batch_loss`` keyword arguments), read from this one object."""
        return dict(clip=self.clip, clip_high=self.clip_high, agg=self.agg, kl_coef=self.kl_coef,
                    caller_weight=self.caller_weight, simulator_weight=self.simulator_weight,
                    temperature=self.role_temperatures(), pad_id=self.pad_id, with_entropy=self.with_entropy,
                    share_prefixes=self.share_prefixes and not self.gradient_checkpointing,
                    old_logprobs=self.old_logprobs, is_cap=self.is_cap)

    def role_weights(self) -> dict[Role, float]:
        return {"caller": self.caller_weight, "simulator": self.simulator_weight}

    def role_temperatures(self) -> float | dict[Role, float]:
        """What the forward scales logits by: the sampler's log-prob temperature of each role
        (1 for a greedy role: greedy turns store log-probs at temperature 1)."""
        sim = self.temperature if self.simulator_temperature is None else self.simulator_temperature
        caller, sim = logprob_temperature(self.temperature), logprob_temperature(sim)
        return caller if caller == sim else {"caller": caller, "simulator": sim}


# Everything a GRPOUpdater reads: the update settings (fields of UpdateSettings, declared and
# defaulted there once) plus _UpdaterOwn's. A plain frozen dataclass: a config section validates
# what a user writes; the updater takes what code gives it (tests use budgets below a run's).
UpdaterConfig = dataclasses.make_dataclass(
    "UpdaterConfig",
    [(name, f.annotation, dataclasses.field(default=f.default)) for name, f in UpdateSettings.model_fields.items()],
    bases=(_UpdaterOwn,), frozen=True)
UpdaterConfig.__module__ = __name__
UpdaterConfig.__doc__ = "The grpo section's update settings (UpdateSettings) plus the updater's own (_UpdaterOwn)."


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """transformers' own activation checkpointing, non-reentrant (works with a frozen embedding,
    as under LoRA). Not yet exercised under DDP or FSDP here."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(base, "gradient_checkpointing_enable"):
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(f"gradient_checkpointing needs a transformers model; {type(base).__name__} has no "
                         "activation_checkpointing_enable()")


def _padding_sample(pad_id: int, role: Role) -> ScoredSample:
    """A one-token sample whose loss is multiplied by 0: it only makes a rank take part in a
    forward/backward (and so in the gradient collectives) when it has no micro-batch left."""
    s = TurnSample(role=role, group_id="__envace_pad__", trajectory_index=0, turn=0, prompt_ids=[pad_id],
                   gen_ids=[pad_id], logprobs=[0.0])
    return ScoredSample(sample=s, advantage=0.0, reward=0.0)


class GRPOUpdater:
    """Owns one model's optimiser. ``step(scored)`` = ``ppo_epochs`` optimiser steps, on one
    process or, once :func:`envace.train.distributed.prepare_updaters` has attached an
    accelerator, on N (the same code: each rank holds its share of the batch, role losses are
    normalised by the global counts, gradients are synchronised once per step).

    ``model`` is what rollouts generate with and checkpoints save; ``trained`` is the module the
    gradients live on (the model itself, its DDP wrapper, or its FSDP shards), ``scorer`` the
    module the loss runs, ``stepper`` what takes the optimiser step (accelerate's wrapper under
    DDP), ``replica`` (FSDP only) the whole-weight model refreshed from the shards after a step.
    """

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
        if config.old_logprobs == "current" and config.ppo_epochs != 1:
            raise ValueError("old_logprobs 'current' holds for one optimiser step per batch: ppo_epochs must be 1 "
                             "(recompute the log-probs before the update instead)")
        self.model = model
        self.config = config
        self.ref_model = ref_model
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(model)
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
        self.accelerator: Any | None = None
        self.trained: nn.Module = model
        self.scorer: nn.Module = model
        self.stepper: Any = self.optimizer
        self.replica: nn.Module | None = None

    def attach(self, accelerator: Any, trained: nn.Module, scorer: nn.Module, stepper: Any,
               replica: nn.Module | None = None) -> "GRPOUpdater":
        """Run on N processes (see :func:`envace.train.distributed.prepare_updaters`)."""
        self.accelerator, self.trained, self.scorer, self.stepper, self.replica = (
            accelerator, trained, scorer, stepper, replica)
        return self

    @property
    def processes(self) -> int:
        return num_processes(self.accelerator)

    def select(self, scored: Sequence[ScoredSample]) -> list[ScoredSample]:
        """Samples that can carry loss: a role with nonzero weight and at least one token."""
        weights = self.config.role_weights()
        return [s for s in scored if weights[s.role] != 0.0 and s.n_tokens > 0]

    def forwarded(self, scored: Sequence[ScoredSample]) -> list[ScoredSample]:
        """The selected samples the update runs: without a KL term a zero-advantage sample adds
        nothing to the loss, so it gets no forward (it still counts in the normalisers)."""
        skip = self.config.skip_zero_advantage and self.ref_model is None
        return [s for s in self.select(scored) if not skip or s.advantage != 0.0]

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @contextlib.contextmanager
    def _sync(self, last: bool) -> Iterator[None]:
        """Gradients are synchronised across ranks on the step's last backward only."""
        acc = self.accelerator
        if acc is None:
            yield
            return
        fsdp = hasattr(self.trained, "set_requires_gradient_sync")  # FSDP2's fully_shard
        set_sync(acc, last)
        if fsdp:
            self.trained.set_requires_gradient_sync(last)
        ddp = isinstance(self.trained, nn.parallel.DistributedDataParallel)
        try:
            with acc.no_sync(self.trained) if (ddp and not last) else contextlib.nullcontext():
                yield
        finally:
            set_sync(acc, True)
            if fsdp:
                self.trained.set_requires_gradient_sync(True)

    def compute_gradients(self, scored: Sequence[ScoredSample],
                          anchor: Sequence[TurnSample] = ()) -> dict[str, float]:
        """Zero the grads, then accumulate the full-batch loss gradient over micro-batches.

        Every micro-batch's role losses are normalised by the *full* batch's per-role counts
        (over every rank's share), so the summed gradient equals the gradient of the full-batch
        loss exactly (up to float rounding), whatever the micro-batch split and the number of
        processes. Ranks hold different numbers of micro-batches; every rank runs the same number
        of forward/backward passes (the short ones add zero-weighted passes), as DDP and FSDP need.
        ``global_micro_batches`` is the most any rank ran: 0 means nothing to learn from anywhere.

        ``anchor`` (with ``anchor_coef`` > 0): samples whose mean target-token NLL, times
        ``anchor_coef``, joins the loss. Every rank must get the same anchor samples: each rank's
        anchor gradient is then the whole term, and the ranks' average is too.
        """
        cfg, acc, world = self.config, self.accelerator, self.processes
        self.stepper.zero_grad(set_to_none=True)
        batch = self.select(scored)
        local = role_normalizers(batch, cfg.agg)
        totals = reduce_sum(acc, [local[r] for r in ROLES])
        # DDP / FSDP average gradients over ranks: scale the denominators by 1/N so the average is
        # the gradient of (sum of every rank's token losses) / (global count).
        normalizers = {r: totals[i] / world for i, r in enumerate(ROLES)}
        kept = self.forwarded(batch)
        skipped, batch = len(batch) - len(kept), kept
        unmerged = len(batch)
        if cfg.merge_turns and cfg.agg == "token_mean":
            batch = merge_trajectory_turns(batch)
        micro = split_micro_batches(batch, cfg.micro_batch_tokens) if batch else []
        passes = reduce_max(acc, len(micro))
        weights = cfg.role_weights()
        anchored = [s for s in anchor if weights[s.role] != 0.0 and s.target_count > 0] if cfg.anchor_coef > 0 else []
        anchor_tokens = sum(s.target_count for s in anchored)
        anchor_micro = split_micro_batches([ScoredSample(sample=s, advantage=1.0, reward=1.0) for s in anchored],
                                           cfg.micro_batch_tokens)
        last_pass = passes + len(anchor_micro) - 1
        pad_role: Role = next((r for r in ROLES if weights[r] != 0.0), "caller")
        parts: list[dict[str, float]] = []
        for i in range(passes):
            real = i < len(micro)
            mb = micro[i] if real else [_padding_sample(cfg.pad_id, pad_role)]
            with self._sync(last=i == last_pass):
                with autocast(self.model, cfg.mixed_precision):
                    loss, stats = batch_loss(self.scorer, mb, ref_model=self.ref_model, normalizers=normalizers,
                                            **cfg.loss_settings())
                loss = loss if real else loss * 0.0
                if acc is not None:
                    acc.backward(loss)
                else:
                    loss.backward()
            if real:
                parts.append(stats)
        nll = 0.0
        for j, amb in enumerate(anchor_micro):
            with self._sync(last=passes + j == last_pass):
                with autocast(self.model, cfg.mixed_precision):
                    loss = sft_loss(self.scorer, [m.sample for m in amb], anchor_tokens, cfg.pad_id)
                nll += float(loss.detach())
                loss = loss * cfg.anchor_coef
                if acc is not None:
                    acc.backward(loss)
                else:
                    loss.backward()
        out = merge_loss_stats(parts) if parts else {"loss": 0.0, "tokens": 0.0}
        if anchor_micro:
            out["anchor_nll"] = nll  # mean NLL per anchor target token, before the update
            out["anchor_tokens"] = float(anchor_tokens)
        out["micro_batches"] = float(len(micro))
        out["global_micro_batches"] = float(passes + len(anchor_micro))
        out["padding_frac"] = padding_fraction(micro)
        out["skipped_zero_adv"] = float(skipped)
        out["merged_away"] = float(unmerged - len(batch))  # turns that rode along in a merged sequence
        return out

    def _clip(self) -> float:
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else math.inf
        if self.accelerator is None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        else:
            norm = self.accelerator.clip_grad_norm_(list(self.trained.parameters()), max_norm)
            if hasattr(norm, "full_tensor"):  # FSDP: the norm of sharded gradients is a (replicated) DTensor
                norm = norm.full_tensor()
        return float(norm)

    def step(self, scored: Sequence[ScoredSample], anchor: Sequence[TurnSample] = ()) -> dict[str, float]:
        """``ppo_epochs`` x (accumulate, clip grad norm, AdamW step); ``anchor``: see
        ``compute_gradients`` (a step with anchor samples steps even without GRPO signal). Returns the last epoch's
        stats (merged over ranks) plus ``grad_norm`` (before clipping), ``lr`` and
        ``optimizer_steps``. A batch with nothing to learn from (all advantages 0, or no trained
        role, on every rank) takes no optimiser step, so weight decay and Adam momentum do not
        move the weights on no signal."""
        if self.accelerator is None and launched_distributed():
            raise ValueError("this process is one of several: the updaters need "
                             "envace.train.distributed.prepare_updaters(accelerator, updaters) first")
        stats: dict[str, float] = {}
        steps = 0
        grad_norm: float | None = None
        for _ in range(self.config.ppo_epochs):
            stats = self.compute_gradients(scored, anchor)
            if not stats["global_micro_batches"]:
                break
            grad_norm = self._clip()
            self.stepper.step()
            if self.scheduler is not None:
                self.scheduler.step()
            self.stepper.zero_grad(set_to_none=True)
            steps += 1
        if steps and self.replica is not None:
            refresh_replica(self.trained, self.replica)  # the next rollouts generate with the new weights
        stats.pop("global_micro_batches", None)
        if self.processes > 1:
            stats = merge_rank_stats(gather_objects(self.accelerator, [stats]))
            stats["processes"] = float(self.processes)
        if grad_norm is not None:
            stats["grad_norm"] = grad_norm  # identical on every rank (gradients are synchronised)
        stats["optimizer_steps"] = float(steps)
        stats["lr"] = float(self.optimizer.param_groups[0]["lr"])
        return stats


@torch.no_grad()
def refresh_replica(sharded: nn.Module, replica: nn.Module) -> None:
    """Copy the sharded model's trained weights into the rollout replica (FSDP). One all-gather
    per trainable parameter (a collective: every rank calls it, in the same order), so the peak
    extra memory is one whole parameter; frozen weights (a LoRA model's base) never change and
    are not gathered."""
    mine = dict(replica.named_parameters())
    for name, p in sharded.named_parameters():
        if p.requires_grad:
            mine[name].copy_(p.full_tensor() if hasattr(p, "full_tensor") else p)


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


def warmup_lr(lr: float, step: int, warmup_steps: int) -> float:
    """The learning rate of GRPO step ``step`` (1-based): ``lr * step / (warmup_steps + 1)`` during
    the warm-up, ``lr`` after. A function of the step alone, so a resumed run needs no scheduler
    state to continue the ramp."""
    if warmup_steps <= 0 or step > warmup_steps:
        return lr
    return lr * max(step, 1) / (warmup_steps + 1)


def update_for_mode(
    spec: ModeSpec, updaters: Mapping[str, GRPOUpdater], scored: Sequence[ScoredSample], lr: float | None = None,
    anchor: Sequence[TurnSample] = (),
) -> dict[str, float]:
    """Step every trained model on its own samples; stats keys are prefixed ``<model>/``.
    ``lr``: this step's learning rate for every optimiser (None: leave it as it is). ``anchor``:
    the step's anchor samples (``UpdaterConfig.anchor_coef``), each to the model of its role."""
    stats: dict[str, float] = {}
    anchors = spec.split_by_model([ScoredSample(sample=s, advantage=1.0, reward=1.0) for s in anchor])
    for key, samples in spec.split_by_model(scored).items():
        if lr is not None:
            updaters[key].set_lr(lr)
        mine = [a.sample for a in anchors.get(key, [])]
        for name, value in updaters[key].step(samples, mine).items():
            stats[f"{key}/{name}"] = value
    return stats
