"""Copy warm-up: a few hundred cheap steps on repeated random token spans before SFT.

Tool use is mostly copying: an id from a tool result into the next call, a value into the
answer, a name from the request into a search. A model trained from scratch has to discover the
circuit that does this (an induction head) from the SFT data, and within a CPU budget it does
not: it keeps writing hallucinated ids. On ``[x1..xn x1..xn]`` sequences, where every token of
the second half can be copied and nothing else helps, the same model learns to copy in a few
hundred cheap steps; SFT then only has to learn *what* to copy (figures:
docs/notes/2026-12-results-history.md).

Spans are drawn from the token ids the task data uses, so the embeddings SFT needs are the
ones trained; the softmax is over the whole vocabulary (over the data ids only, training
accuracy reaches 100% while greedy decoding over the full vocabulary still picks untrained
ids). Pretrained models know how to copy: leave it off for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from envace.train.forward import decoder_and_head, model_device


@dataclass
class CopyWarmupStats:
    steps: int
    vocabulary: int
    first_loss: float
    last_loss: float
    accuracy: float  # greedy copy accuracy on the last step's batch


def data_vocabulary(sequences: Iterable[Iterable[int]], limit: int = 4096) -> list[int]:
    """The ``limit`` most frequent token ids of ``sequences`` (ties broken by id: deterministic)."""
    counts = Counter(t for seq in sequences for t in seq)
    return [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


def _data_rows(data: Sequence[Sequence[int]], n: int, batch: int, gen: torch.Generator) -> torch.Tensor:
    """``batch`` windows of ``n`` tokens from random ``data`` sequences (shorter ones padded by repeating)."""
    rows = []
    for _ in range(batch):
        seq = data[int(torch.randint(0, len(data), (1,), generator=gen))]
        start = int(torch.randint(0, max(1, len(seq) - n + 1), (1,), generator=gen))
        window = list(seq[start:start + n])
        rows.append((window * (n // len(window) + 1))[:n])
    return torch.tensor(rows, dtype=torch.long)


def copy_warmup(model: nn.Module, vocabulary: list[int], steps: int, lr: float = 3e-3, span: int = 24,
                batch: int = 32, seed: int = 0,
                on_step: Callable[[int, int, float], None] | None = None,
                data: Sequence[Sequence[int]] | None = None, data_frac: float = 0.0,
                data_span: int = 128,
                on_row: Callable[[dict[str, float]], None] | None = None) -> CopyWarmupStats:
    """Train ``model`` to repeat random spans of ``vocabulary`` tokens: rows ``[x filler x]`` with
    ``len(x)`` in ``[span/3, span]`` and up to ``span`` filler tokens, loss on the repeat. Needs
    an HF causal LM (body + vocabulary head).

    With ``data`` (token sequences, e.g. real tool results), a ``data_frac`` share of the steps
    copies windows of up to ``data_span`` tokens of them instead. Random spans never repeat a
    token, so matching one token back finds the place to copy from; a JSON list repeats its keys
    in every item, and a model that matches one token back jumps between items (measured: the
    warm start wrote shuffled, looping lists even with the same call's real result in its prompt).
    """
    if steps <= 0:
        raise ValueError("copy_warmup: steps must be positive")
    if len(vocabulary) < 2:
        raise ValueError("copy_warmup: the vocabulary needs at least two tokens")
    if not 0.0 <= data_frac <= 1.0:
        raise ValueError(f"copy_warmup: data_frac must be in [0, 1], not {data_frac}")
    data = [d for d in (data or []) if len(d) > 0]
    if data_frac > 0 and not data:
        raise ValueError("copy_warmup: data_frac > 0 needs non-empty data sequences")
    parts = decoder_and_head(model)
    if parts is None:
        raise ValueError("copy_warmup needs a Hugging Face causal LM (a decoder and an output embedding)")
    decoder, head = parts
    device = model_device(model)
    vocab = torch.tensor(vocabulary, dtype=torch.long, device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    first = last = float("nan")
    acc = 0.0
    model.train()
    for step in range(1, steps + 1):
        # A span length and a gap drawn per step: with one fixed layout a model learns "look back
        # n positions", which copies nothing in real data; varying both forces matching on content.
        from_data = data_frac > 0 and float(torch.rand(1, generator=gen)) < data_frac
        length = data_span if from_data else span
        n = int(torch.randint(max(2, length // 3), length + 1, (1,), generator=gen))
        gap = int(torch.randint(0, span + 1, (1,), generator=gen))
        idx = torch.randint(0, len(vocabulary), (batch, n + gap), generator=gen).to(device)
        ids, filler = vocab[idx[:, :n]], vocab[idx[:, n:]]
        if from_data:
            ids = _data_rows(data, n, batch, gen).to(device)
        hidden = decoder(input_ids=torch.cat([ids, filler, ids], 1), use_cache=False).last_hidden_state
        h = hidden[:, n + gap - 1: 2 * n + gap - 1]  # position k predicts token k+1: the repeat
        logits = head(h).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        last = float(loss.detach())
        first = last if step == 1 else first
        acc = float((logits.detach().argmax(-1) == ids).float().mean())
        if on_step is not None:
            on_step(step, steps, last)
        if on_row is not None:  # each step's figures, for a metrics log
            on_row({"copy/loss": last, "copy/accuracy": acc, "copy/lr": lr, "copy/from_data": float(from_data)})
    model.eval()
    return CopyWarmupStats(steps=steps, vocabulary=len(vocabulary), first_loss=first, last_loss=last, accuracy=acc)
