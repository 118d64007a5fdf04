"""Packing turn-samples into padded tensors, and splitting them into micro-batches.

Layout: each row is ``prompt_ids + gen_ids``, right-padded (causal attention never looks right,
so padding cannot touch real positions and no position ids are needed). Only the *score
window* gets vocabulary logits: positions ``window_start .. L-2``, which predict tokens
``window_start+1 .. L-1`` and cover every row's generated tokens. The vocabulary projection is
the largest tensor by far (49k columns for SmolLM2), and prompts are usually much longer than
generations, so skipping prompt logits is what lets a micro-batch fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from envace.core.types import Role, TurnSample
from envace.train.advantages import ScoredSample


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long, 0 on padding
    window_start: int  # first position whose logits are scored
    targets: torch.Tensor  # [B, W] long: token predicted at each window position (W = L-1-start)
    token_mask: torch.Tensor  # [B, W] bool: True exactly on generated tokens
    old_logprobs: torch.Tensor  # [B, W] float: the sampler's log-probs on generated tokens, 0 elsewhere
    advantages: torch.Tensor  # [B] float
    roles: list[Role]

    @property
    def logits_to_keep(self) -> int:
        """HF ``logits_to_keep``: the last L - start positions (the final one is dropped after)."""
        return self.input_ids.shape[1] - self.window_start

    def role_mask(self, role: Role) -> torch.Tensor:
        """[B] bool: rows of ``role``."""
        return torch.tensor([r == role for r in self.roles], dtype=torch.bool)


def merge_turns(turns: Sequence[TurnSample]) -> TurnSample | None:
    """One sample holding several turns of one conversation: the first turn's prompt, then every
    later token, with loss (and the sampler's log-probs) only on the turns' own tokens. Training
    on it costs one forward pass over the conversation instead of one per turn, whose prompts
    repeat all earlier turns.

    None unless each turn's prompt extends the previous prompt and generation token for token
    (true of templates that render history verbatim, when the sampled tokens are the ones the
    tokenizer gives for their text; otherwise the turns stay separate samples).
    """
    if not turns:
        return None
    seq = list(turns[0].prompt_ids)
    mask: list[bool] = []
    logprobs: list[float] = []
    for t in turns:
        if t.prompt_ids[: len(seq)] != seq:
            return None
        context = t.prompt_ids[len(seq):]
        seq += context + t.gen_ids
        mask += [False] * len(context) + [True] * len(t.gen_ids)
        logprobs += [0.0] * len(context) + list(t.logprobs)
    gen = seq[len(turns[0].prompt_ids):]
    return turns[0].model_copy(update={"gen_ids": gen, "logprobs": logprobs, "loss_mask": mask})


def merge_trajectory_turns(batch: Sequence[ScoredSample], roles: Sequence[Role] = ("caller",)) -> list[ScoredSample]:
    """Merge each trajectory's consecutive turns of ``roles`` that share an advantage (``merge_turns``).

    Only for token-mean losses: the loss is the same sum over the same tokens, so only the cost
    changes (fewer tokens; docs/results.md, Performance). Simulator
    prompts are fresh per call and never extend each other, so they are left alone.
    """
    runs: dict[tuple, list[ScoredSample]] = {}
    out: list[ScoredSample] = []
    for s in batch:
        if s.role in roles and s.sample.loss_mask is None:
            runs.setdefault((s.sample.group_id, s.sample.trajectory_index, s.role, s.advantage, s.reward), []).append(s)
        else:
            out.append(s)
    for (_, _, _, advantage, reward), run in runs.items():
        run = sorted(run, key=lambda s: s.sample.turn)
        merged = merge_turns([s.sample for s in run]) if len(run) > 1 else None
        out += [ScoredSample(sample=merged, advantage=advantage, reward=reward)] if merged is not None else run
    return out


def sequence_length(s: ScoredSample) -> int:
    return len(s.sample.prompt_ids) + len(s.sample.gen_ids)


def pack_samples(batch: Sequence[ScoredSample], pad_id: int = 0) -> PackedBatch:
    if not batch:
        raise ValueError("pack_samples: empty batch")
    for s in batch:
        if len(s.sample.logprobs) != len(s.sample.gen_ids):
            raise ValueError(
                f"sample {s.sample.group_id}/{s.sample.trajectory_index}/turn {s.sample.turn}: "
                f"{len(s.sample.logprobs)} logprobs for {len(s.sample.gen_ids)} generated tokens"
            )
        if s.sample.loss_mask is not None and len(s.sample.loss_mask) != len(s.sample.gen_ids):
            raise ValueError(f"sample {s.sample.group_id}/turn {s.sample.turn}: loss_mask and gen_ids differ in length")
        if not s.sample.prompt_ids:
            # The first generated token is predicted from the last prompt position.
            raise ValueError("pack_samples: a sample has an empty prompt; nothing predicts its first token")

    rows = len(batch)
    length = max(sequence_length(s) for s in batch)
    start = min(len(s.sample.prompt_ids) for s in batch) - 1
    width = length - 1 - start

    input_ids = torch.full((rows, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, length), dtype=torch.long)
    token_mask = torch.zeros((rows, width), dtype=torch.bool)
    old_logprobs = torch.zeros((rows, width), dtype=torch.float32)
    for i, s in enumerate(batch):
        p, g = len(s.sample.prompt_ids), len(s.sample.gen_ids)
        input_ids[i, : p + g] = torch.tensor(s.sample.prompt_ids + s.sample.gen_ids, dtype=torch.long)
        attention_mask[i, : p + g] = 1
        # Generated token k sits at absolute position p+k and is predicted at window index p+k-1-start.
        lo = p - 1 - start
        token_mask[i, lo : lo + g] = True if s.sample.loss_mask is None else torch.tensor(s.sample.loss_mask)
        if g:
            old_logprobs[i, lo : lo + g] = torch.tensor(s.sample.logprobs, dtype=torch.float32)
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        window_start=start,
        targets=input_ids[:, start + 1 :].clone(),
        token_mask=token_mask,
        old_logprobs=old_logprobs,
        advantages=torch.tensor([s.advantage for s in batch], dtype=torch.float32),
        roles=[s.role for s in batch],
    )


def split_micro_batches(batch: Sequence[ScoredSample], max_tokens: int) -> list[list[ScoredSample]]:
    """Greedy split so that rows x longest row <= ``max_tokens`` (a longer single row goes alone).

    Rows are sorted longest first (stable, so the split is deterministic): similar lengths
    share a micro-batch, which cuts padding, and the largest one runs first, so an
    out-of-memory shows up at once rather than late in a step.
    """
    if max_tokens <= 0:
        raise ValueError("max_tokens must be positive")
    ordered = sorted(batch, key=sequence_length, reverse=True)
    out: list[list[ScoredSample]] = []
    current: list[ScoredSample] = []
    for s in ordered:
        # Descending order: the first row of `current` is its longest.
        if current and (len(current) + 1) * sequence_length(current[0]) > max_tokens:
            out.append(current)
            current = []
        current.append(s)
    if current:
        out.append(current)
    return out


def padding_fraction(micro_batches: Sequence[Sequence[ScoredSample]]) -> float:
    """Share of the padded input tensor that is padding, over all micro-batches."""
    padded = sum(len(mb) * max(sequence_length(s) for s in mb) for mb in micro_batches if mb)
    real = sum(sequence_length(s) for mb in micro_batches for s in mb)
    return 0.0 if padded == 0 else 1.0 - real / padded
