"""Role-wise GRPO training core: advantages, loss, modes, optimiser step, checkpoints."""

from envace.train.advantages import ScoredSample, advantage_stats, compute_advantages
from envace.train.batching import PackedBatch, pack_samples, padding_fraction, split_micro_batches
from envace.train.checkpoint import (
    LoadedCheckpoint,
    capture_rng_state,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from envace.train.forward import batch_loss, token_logprobs
from envace.train.grpo_loss import LossConfig, grpo_loss, role_normalizers
from envace.train.loss_support import merge_loss_stats
from envace.train.modes import MODE_NAMES, ModeSpec
from envace.train.step import GRPOUpdater, UpdaterConfig, update_for_mode, updaters_for_mode

__all__ = [
    "MODE_NAMES",
    "GRPOUpdater",
    "LossConfig",
    "LoadedCheckpoint",
    "ModeSpec",
    "PackedBatch",
    "ScoredSample",
    "UpdaterConfig",
    "advantage_stats",
    "batch_loss",
    "capture_rng_state",
    "compute_advantages",
    "find_latest",
    "grpo_loss",
    "list_checkpoints",
    "load_checkpoint",
    "merge_loss_stats",
    "pack_samples",
    "padding_fraction",
    "restore_rng_state",
    "role_normalizers",
    "save_checkpoint",
    "split_micro_batches",
    "token_logprobs",
    "update_for_mode",
    "updaters_for_mode",
]
