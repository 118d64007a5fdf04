"""Around the GRPO loss, not its math (:mod:`envace.train.grpo_loss`): the truncated importance
weight that reweights a token sampled by another engine, and how the loss's per-micro-batch
stats combine into one batch's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

# Keys of the stats dict, by how micro-batch values combine into a full-batch value.
_SUMMED_PREFIXES = ("loss", "tokens", "samples")
_TOKEN_WEIGHTED = ("clip_frac", "ratio_mean", "entropy", "kl", "rollout_kl", "is_weight_mean", "is_capped")
_MAXED = ("ratio_max", "logprob_gap_max")


def truncated_is_weight(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                        cap: float) -> torch.Tensor:
    """Per token ``min(exp(trainer - rollout), cap)``: the truncated importance weight of a token
    sampled by another engine (quantised llama.cpp, vLLM) under the trainer's own policy, as verl
    and TRL apply it to vLLM rollouts. 1 off the mask and where the engine gave no log-prob."""
    ok = mask & torch.isfinite(rollout_logp)
    delta = torch.where(ok, trainer_logp.detach() - rollout_logp, torch.zeros_like(trainer_logp))
    return torch.exp(delta).clamp(max=cap)


def merge_loss_stats(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine per-micro-batch stats: losses and counts add up (the losses were normalised by
    full-batch counts), ratios/entropy/kl/clip_frac average weighted by tokens, maxima max."""
    out: dict[str, float] = {}
    total_tokens = sum(p.get("tokens", 0.0) for p in parts)
    for key in sorted({k for p in parts for k in p}):
        values = [(p[key], p.get("tokens", 0.0)) for p in parts if key in p]
        if key.split("/")[0] in _SUMMED_PREFIXES:
            out[key] = sum(v for v, _ in values)
        elif key in _MAXED:
            out[key] = max(v for v, _ in values)
        elif key in _TOKEN_WEIGHTED:
            weight = sum(w for _, w in values)
            out[key] = sum(v * w for v, w in values) / weight if weight else 0.0
        else:
            out[key] = values[-1][0]
    out["tokens"] = total_tokens
    return out
