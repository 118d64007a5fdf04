"""Role-wise GRPO loss: PPO clipped objective on generated tokens, per role, weighted sum.

``loss = caller_weight * L_caller + simulator_weight * L_simulator``. A role whose weight is 0
is not part of the graph at all, so its tokens get exactly zero gradient; in shared-parameter
mode this is what ``frozen_caller`` means (the simulator still learns through its own tokens).

Pure tensor math on log-probs, advantages and a mask: the forward that gives the log-probs is
:mod:`envace.train.forward` (``batch_loss`` runs both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from envace.core.types import Role
from envace.train.advantages import ScoredSample

LossAgg = Literal["token_mean", "seq_mean"]
# the PPO ratio's denominator: the sampler's stored log-probs, or the trainer's at this forward
OldLogprobs = Literal["sampler", "current"]
ROLES: tuple[Role, ...] = ("caller", "simulator")


@dataclass(frozen=True)
class LossConfig:
    """The loss's own settings: PPO clip (``clip_high``: DAPO's asymmetric upper clip, None: the
    same as ``clip``), token- or sequence-mean, the k3 KL weight, the roles' weights."""

    clip: float = 0.2
    clip_high: float | None = None
    agg: LossAgg = "token_mean"
    kl_coef: float = 0.0
    caller_weight: float = 1.0
    simulator_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.agg not in ("token_mean", "seq_mean"):
            raise ValueError(f"unknown agg {self.agg!r}: expected 'token_mean' or 'seq_mean'")


def role_normalizers(
    batch: Sequence[ScoredSample], agg: LossAgg = "token_mean"
) -> dict[Role, float]:
    """Per-role denominators of the full batch: generated tokens (token_mean) or samples with
    at least one generated token (seq_mean). Passing these to every micro-batch's
    ``grpo_loss`` makes the micro-batch losses sum to the full-batch loss."""
    out: dict[Role, float] = {r: 0.0 for r in ROLES}
    for s in batch:
        if s.n_tokens:
            out[s.role] += s.n_tokens if agg == "token_mean" else 1.0
    return out


def grpo_loss(
    new_logp: torch.Tensor,  # [B, W] float: the trainer's log-probs (with grad)
    old_logp: torch.Tensor,  # [B, W] float: the PPO ratio's denominator
    adv: torch.Tensor,  # [B] float: each row's advantage
    mask: torch.Tensor,  # [B, W] bool: the generated tokens that count
    roles: Sequence[Role],  # [B]: each row's role
    cfg: LossConfig = LossConfig(),
    normalizers: Mapping[Role, float] | None = None,
    ref_logp: torch.Tensor | None = None,  # [B, W] float: a reference model's, for the KL term
    token_weight: torch.Tensor | None = None,  # [B, W] float, no grad: e.g. truncated importance weights
) -> tuple[torch.Tensor, dict[str, float]]:
    """Returns (scalar loss, stats).

    Per token: ``-min(ratio*A, clip(ratio, 1-clip, 1+clip_high)*A)`` (+ ``kl_coef`` x k3 KL to
    ``ref_logp``), ``ratio = exp(new_logp - old_logp)``. Per role: token_mean = sum over the
    role's generated tokens / ``normalizers[role]`` (default: this batch's token count);
    seq_mean = sum over the role's samples of their token means / ``normalizers[role]``
    (default: this batch's sample count). Stats (floats): ``loss``, ``loss/<role>`` (unweighted),
    ``tokens/<role>``, ``samples/<role>``, ``tokens``, ``clip_frac``, ``ratio_mean``,
    ``ratio_max``, ``kl`` (whenever ``ref_logp`` is given).
    """
    if cfg.kl_coef and ref_logp is None:
        raise ValueError("kl_coef > 0 needs a ref_model")
    weights: dict[Role, float] = {"caller": cfg.caller_weight, "simulator": cfg.simulator_weight}
    n_tokens = int(mask.sum())
    adv = adv.unsqueeze(1)

    # Masked positions get log-ratio 0, so whatever sits there can never overflow or leak in.
    log_ratio = torch.where(mask, new_logp - old_logp, torch.zeros_like(new_logp))
    ratio = torch.exp(log_ratio)
    upper = 1.0 + (cfg.clip if cfg.clip_high is None else cfg.clip_high)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - cfg.clip, upper)
    per_token = torch.maximum(unclipped, clipped)

    kl_tok = None
    if ref_logp is not None:
        delta = torch.where(mask, ref_logp - new_logp, torch.zeros_like(new_logp))
        kl_tok = torch.exp(delta) - delta - 1.0  # k3: unbiased, always >= 0
        if cfg.kl_coef:
            per_token = per_token + cfg.kl_coef * kl_tok
    if token_weight is not None:  # as TRL's vLLM importance sampling: the whole token loss, KL included
        per_token = per_token * token_weight.detach()

    loss = new_logp.sum() * 0.0  # anchor: backward() works even if every role is skipped
    stats: dict[str, float] = {"tokens": float(n_tokens)}
    for role in ROLES:
        row_is_role = torch.tensor([r == role for r in roles], dtype=torch.bool, device=mask.device)
        role_tokens = mask & row_is_role.unsqueeze(1)
        per_row = role_tokens.sum(1)
        n_role_tokens = int(per_row.sum())
        n_role_samples = int((per_row > 0).sum())
        stats[f"tokens/{role}"] = float(n_role_tokens)
        stats[f"samples/{role}"] = float(n_role_samples)
        role_loss = None
        if n_role_tokens:
            summed = torch.where(role_tokens, per_token, torch.zeros_like(per_token))
            if cfg.agg == "token_mean":
                numer = summed.sum()
                denom = n_role_tokens
            else:
                numer = (summed.sum(1) / per_row.clamp(min=1)).sum()
                denom = n_role_samples
            if normalizers is not None:
                denom = normalizers.get(role, 0.0)
            if denom:
                role_loss = numer / denom
        stats[f"loss/{role}"] = 0.0 if role_loss is None else float(role_loss.detach())
        if role_loss is not None and weights[role] != 0.0:
            loss = loss + weights[role] * role_loss
    stats["loss"] = float(loss.detach())

    with torch.no_grad():
        stats["clip_frac"] = float(((clipped > unclipped) & mask).sum()) / n_tokens
        stats["ratio_mean"] = float(ratio[mask].mean())
        stats["ratio_max"] = float(ratio[mask].max())
        if kl_tok is not None:
            stats["kl"] = float(kl_tok[mask].mean())
    return loss, stats
