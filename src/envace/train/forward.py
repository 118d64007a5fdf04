"""The trainer's forward: a model's log-probs of the generated tokens of packed samples, and the
losses that need them (the GRPO loss of a batch, the SFT / anchor NLL).

The loss math itself is :func:`envace.train.grpo_loss.grpo_loss`, on tensors only; this file runs
the model: the vocabulary head only at scored positions, shared prompt prefixes once, autocast,
the log-probs recomputed for rollouts from another engine.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.utils.checkpoint
from torch import nn
from transformers import DynamicCache

from envace.core.types import Role, TurnSample
from envace.policy.prefixes import plan_shared_prefixes, prefix_inputs
from envace.train.advantages import ScoredSample
from envace.train.batching import PackedBatch, pack_samples, split_micro_batches
from envace.train.grpo_loss import LossAgg, LossConfig, OldLogprobs, grpo_loss
from envace.train.loss_support import truncated_is_weight

# The sampler's temperature: one for every sample, or one per role.
Temperature = float | Mapping[Role, float]
# the forward's compute dtype: "no" fp32 throughout; "bf16" autocast (weights, gradients and the
# optimiser state stay fp32, as accelerate's mixed_precision "bf16" means)
MixedPrecision = Literal["no", "bf16"]
# Scored positions per vocabulary-head chunk: SmolLM2's [1024 x 49,152] fp32 logits are 200 MB, and
# the softmax's backward holds about three such tensors.
HEAD_CHUNK = 1024


def _forward_kwargs(model: nn.Module) -> set[str]:
    """Optional HF forward arguments the model takes (a peft wrapper passes **kwargs through)."""
    params = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"logits_to_keep", "use_cache"}
    return {k for k in ("logits_to_keep", "use_cache") if k in params}


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def autocast(model: nn.Module, precision: MixedPrecision) -> contextlib.AbstractContextManager:
    """The context a forward of ``model`` runs in under ``precision``: torch's bf16 autocast on
    the model's device (CPUs with AVX512-BF16 or AMX, and GPUs, run its matmuls at bf16 speed), or
    nothing. Log-softmax runs in fp32 either way (``token_logprobs`` upcasts the head's output)."""
    if precision == "no":
        return contextlib.nullcontext()
    if precision != "bf16":
        raise ValueError(f"mixed_precision must be 'no' or 'bf16', not {precision!r}")
    return torch.autocast(device_type=model_device(model).type, dtype=torch.bfloat16)


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """The body (hidden states) and the vocabulary head of an HF causal LM, peft-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    get_dec = getattr(base, "get_decoder", None)
    get_head = getattr(base, "get_output_embeddings", None)
    if get_dec is None or get_head is None:
        return None
    decoder, head = get_dec(), get_head()
    return (decoder, head) if decoder is not None and head is not None else None


def sft_loss(model: nn.Module, batch: Sequence[TurnSample], total_tokens: int, pad_id: int = 0,
             share_prefixes: bool = True) -> torch.Tensor:
    """Summed target-token NLL of ``batch`` divided by ``total_tokens`` (of the whole update).
    ``share_prefixes`` off under activation checkpointing (it runs the prefix with a cache)."""
    packed = pack_samples([ScoredSample(sample=s, advantage=1.0, reward=1.0) for s in batch], pad_id=pad_id)
    logp, _ = token_logprobs(model, packed, share_prefixes=share_prefixes)
    mask = packed.token_mask.to(logp.device)
    return -(logp * mask).sum() / total_tokens


def token_logprobs(
    model: nn.Module,
    packed: PackedBatch,
    temperature: Temperature = 1.0,
    with_entropy: bool = False,
    share_prefixes: bool = True,
    head_chunk: int = HEAD_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``packed.targets`` under ``log_softmax(logits / temperature)``: [B, W] float32
    (0 where ``token_mask`` is False).

    The temperature matches the sampler's, so at unchanged parameters these equal the stored
    ``logprobs`` and the PPO ratio is 1; a ``{role: T}`` mapping scales each row by its role's
    (the simulator may sample cooler than the caller). Entropy ([B, W], no grad) is optional.

    For HF models the vocabulary head runs only at the generated positions: the head is the
    largest matmul by far (49k columns for SmolLM2) and prompts of different lengths make the
    score window mostly prompt, so this is what keeps a micro-batch fast and small (figures:
    docs/results.md, Performance). It runs over ``head_chunk`` positions at a time, each recomputed
    in the backward when there are several, so no [positions x vocabulary] tensor of the whole
    micro-batch is ever held.
    """
    device = model_device(model)
    mask = packed.token_mask.to(device)
    parts = decoder_and_head(model)
    if parts is None:
        return _window_logprobs(model, packed, temperature, with_entropy)
    decoder, head = parts
    hidden, offset = _decoder_hidden(decoder, packed, mask, device, share_prefixes)
    # Window index j predicts from absolute position window_start + j, which sits in column
    # window_start + j - offset[row] of ``hidden`` (offset: the row's shared prefix, if any).
    rows, cols = mask.nonzero(as_tuple=True)
    h = hidden[rows, packed.window_start + cols - offset[rows]]
    targets = packed.targets.to(device)[mask]
    picked, ents = [], []
    for i in range(0, len(rows), head_chunk):
        part = slice(i, i + head_chunk)
        if len(rows) > head_chunk and torch.is_grad_enabled() and h.requires_grad:
            # Recomputed in the backward: only the chunk's hidden states are kept, never a
            # [positions x vocabulary] tensor for the whole micro-batch.
            picked.append(torch.utils.checkpoint.checkpoint(_head_logprobs, head, h[part], targets[part], packed,
                                                            temperature, rows[part], use_reentrant=False))
            logits = None
        else:
            logits = _scaled(head(h[part]).float(), packed, temperature, rows[part])
            picked.append(logits.gather(-1, targets[part].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1))
        if with_entropy:
            with torch.no_grad():
                if logits is None:
                    logits = _scaled(head(h[part]).float(), packed, temperature, rows[part])
                ents.append(torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1))

    def scatter(values: list[torch.Tensor]) -> torch.Tensor:
        zeros = torch.zeros(mask.shape, dtype=torch.float32, device=device)
        return zeros.masked_scatter(mask, torch.cat(values)) if values else zeros

    return scatter(picked), (scatter(ents) if with_entropy else None)


def _head_logprobs(head: nn.Module, h: torch.Tensor, targets: torch.Tensor, packed: PackedBatch,
                   temperature: Temperature, rows: torch.Tensor) -> torch.Tensor:
    """log_softmax(head(h) / T) at ``targets``: one chunk of scored positions, in fp32."""
    logits = _scaled(head(h).float(), packed, temperature, rows)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _decoder_hidden(
    decoder: nn.Module, packed: PackedBatch, mask: torch.Tensor, device: torch.device, share_prefixes: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden states of the packed rows, and per row the offset of column 0 in absolute
    positions. Rows that share a prefix (a task's G samples share the system prompt, tools and
    instruction; a turn-0 prompt is the same in all G) run it once when that saves at least a
    fifth of the padded tokens (``share_prefixes``; off: one plain forward over the padded rows,
    the reference path kept for comparison): the prefix forward's key/value cache is
    copied out to its rows (a differentiable index, so its gradient sums over them) and each
    row's own tokens, from its first scored position on, run on top. The result is the same
    as one forward over the full rows, up to float rounding."""
    ids, att = packed.input_ids, packed.attention_mask
    n = ids.shape[0]
    plan = None
    if share_prefixes and n > 1:
        lengths = att.sum(1).tolist()
        seqs = [ids[i, : lengths[i]].tolist() for i in range(n)]
        cpu_mask = mask.cpu()
        first = cpu_mask.float().argmax(1).tolist()  # first scored window index (0 if none)
        limits = [packed.window_start + f if cpu_mask[i].any() else lengths[i] - 1 for i, f in enumerate(first)]
        plan = plan_shared_prefixes(seqs, limits=limits)
    if plan is None:
        hidden = decoder(input_ids=ids.to(device), attention_mask=att.to(device), use_cache=False).last_hidden_state
        return hidden, torch.zeros(n, dtype=torch.long, device=device)
    # transformers 5.x names the decoder's cache argument ``cache`` (``past_key_values`` before)
    cache_kw = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    x = prefix_inputs(seqs, plan, 0, "right")  # padding is masked: its id never matters
    cache = DynamicCache(config=decoder.config)
    decoder(input_ids=x.head_ids.to(device), attention_mask=x.head_mask.to(device),
            position_ids=x.head_pos.to(device), use_cache=True, **{cache_kw: cache})
    cache.batch_select_indices(x.group.to(device))
    hidden = decoder(input_ids=x.tail_ids.to(device), attention_mask=x.attention.to(device),
                     position_ids=x.tail_pos.to(device), use_cache=True, **{cache_kw: cache}).last_hidden_state
    return hidden, x.offset.to(device)


def _window_logprobs(
    model: nn.Module,
    packed: PackedBatch,
    temperature: Temperature = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Fallback for a plain module returning logits: score the whole window."""
    device = model_device(model)
    accepted = _forward_kwargs(model)
    kwargs: dict[str, object] = {}
    if "logits_to_keep" in accepted:
        kwargs["logits_to_keep"] = packed.logits_to_keep
    if "use_cache" in accepted:
        kwargs["use_cache"] = False
    out = model(
        input_ids=packed.input_ids.to(device),
        attention_mask=packed.attention_mask.to(device),
        **kwargs,
    )
    logits = out.logits if hasattr(out, "logits") else out
    if logits.shape[1] == packed.input_ids.shape[1]:  # the model ignored logits_to_keep
        logits = logits[:, packed.window_start :]
    logits = _scaled(logits[:, :-1].float(), packed, temperature)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, packed.targets.to(device).unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def _scaled(logits: torch.Tensor, packed: PackedBatch, temperature: Temperature,
            rows: torch.Tensor | None = None) -> torch.Tensor:
    """``logits`` divided by the sampling temperature: one float, or per row its role's.
    ``rows``: the packed row of each logits row (token_logprobs flattens to masked positions);
    None: ``logits`` is [B, W, V], one packed row each."""
    if not isinstance(temperature, Mapping):
        return logits / temperature if temperature != 1.0 else logits
    per_row = torch.tensor([float(temperature[r]) for r in packed.roles], device=logits.device)
    if bool((per_row == 1.0).all()):
        return logits
    t = per_row[rows.to(logits.device)].unsqueeze(-1) if rows is not None else per_row.view(-1, 1, 1)
    return logits / t

def batch_loss(
    model: nn.Module,
    batch: Sequence[ScoredSample] | PackedBatch,
    clip: float = 0.2,
    agg: LossAgg = "token_mean",
    kl_coef: float = 0.0,
    ref_model: nn.Module | None = None,
    caller_weight: float = 1.0,
    simulator_weight: float = 1.0,
    temperature: Temperature = 1.0,
    normalizers: Mapping[Role, float] | None = None,
    clip_high: float | None = None,
    pad_id: int = 0,
    with_entropy: bool = True,
    share_prefixes: bool = True,
    old_logprobs: OldLogprobs = "sampler",
    is_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One forward of ``model`` on ``batch``, then :func:`grpo_loss` on its log-probs; returns
    (scalar loss, stats). Stats as grpo_loss's, plus ``entropy`` (if asked) and, with
    ``old_logprobs="current"``, ``logprob_gap_max``.

    ``old_logprobs="current"``: the ratio's denominator is this forward's own log-probs (detached)
    instead of the sampler's. That is what recomputing them with the same weights first gives, in
    one forward instead of two, so it holds for the first optimiser step on a batch only (the
    updater uses it with ``ppo_epochs`` 1). The sampler's stay in the stats as
    ``logprob_gap_max``, the largest |trainer - sampler| log-prob on this batch, and
    ``rollout_kl``, the mean of sampler - trainer log-prob over the sampled tokens.
    ``is_cap`` (with ``"current"``): each token's loss is weighted by the truncated importance
    weight min(exp(trainer - sampler), is_cap) (:func:`truncated_is_weight`; stats ``is_weight_mean``,
    ``is_capped``: the share of tokens at the cap).
    """
    cfg = LossConfig(clip=clip, clip_high=clip_high, agg=agg, kl_coef=kl_coef, caller_weight=caller_weight,
                     simulator_weight=simulator_weight)
    if old_logprobs not in ("sampler", "current"):
        raise ValueError(f"unknown old_logprobs {old_logprobs!r}: expected 'sampler' or 'current'")
    if kl_coef and ref_model is None:
        raise ValueError("kl_coef > 0 needs a ref_model")
    packed = batch if isinstance(batch, PackedBatch) else pack_samples(batch, pad_id=pad_id)
    device = model_device(model)
    mask = packed.token_mask.to(device)
    if int(mask.sum()) == 0:
        # Nothing generated: a zero loss still tied to the parameters, so backward() works.
        anchor = next(p for p in model.parameters() if p.requires_grad)
        return anchor.sum() * 0.0, {"loss": 0.0, "tokens": 0.0}
    new_logp, entropy = token_logprobs(model, packed, temperature, with_entropy=with_entropy,
                                       share_prefixes=share_prefixes)
    sampler_logp = packed.old_logprobs.to(device)
    ref_logp = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logp, _ = token_logprobs(ref_model, packed, temperature, share_prefixes=share_prefixes)
    old_logp = new_logp.detach() if old_logprobs == "current" else sampler_logp
    weight = truncated_is_weight(old_logp, sampler_logp, mask, is_cap) if old_logprobs == "current" and is_cap else None
    loss, stats = grpo_loss(new_logp, old_logp, packed.advantages.to(device), mask, packed.roles, cfg,
                            normalizers=normalizers, ref_logp=None if ref_logp is None else ref_logp.to(device),
                            token_weight=weight)
    with torch.no_grad():
        if entropy is not None:
            stats["entropy"] = float(entropy[mask].mean())
        if old_logprobs == "current":
            stats["logprob_gap_max"] = float((new_logp - sampler_logp)[mask].abs().max())
            known = mask & torch.isfinite(sampler_logp)
            if bool(known.any()):
                stats["rollout_kl"] = float((sampler_logp - new_logp)[known].mean())
            if weight is not None:
                stats["is_weight_mean"] = float(weight[mask].mean())
                stats["is_capped"] = float((weight[mask] >= is_cap).float().mean())
    return loss, stats


@torch.no_grad()
def recompute_logprobs(model: nn.Module, samples: Sequence[TurnSample], temperature: Temperature = 1.0,
                       pad_id: int = 0, micro_batch_tokens: int = 4096, precision: MixedPrecision = "no") -> float:
    """Replace each sample's sampler log-probs by the trainer's own at the current weights, and
    return the largest absolute difference (0.0 for no tokens).

    For rollouts generated by a serving engine (``rollout.backend: http | vllm``): its kernels,
    batching and precision differ from the trainer's, so its log-probs are not the PPO ratio's
    denominator the loss assumes; recomputed, the ratio is exactly 1 at the first epoch again."""
    # seq-level wrappers only to reuse the packer and the splitter; advantages play no part here
    wrapped = [ScoredSample(sample=s, advantage=0.0, reward=0.0) for s in samples if s.gen_ids and s.prompt_ids]
    gap = 0.0
    for mb in split_micro_batches(wrapped, micro_batch_tokens):
        packed = pack_samples(mb, pad_id)
        with autocast(model, precision):  # the update's own precision, so the ratio starts at 1
            logp, _ = token_logprobs(model, packed, temperature)  # shared prompt prefixes run once, as in the loss
        for row, s in enumerate(mb):
            mask = packed.token_mask[row]
            lo = int(mask.nonzero()[0]) if mask.any() else 0
            new = logp[row, lo: lo + len(s.sample.gen_ids)].tolist()
            gap = max([gap, *(abs(a - b) for a, b in zip(new, s.sample.logprobs))])
            s.sample.logprobs = new
    return gap
