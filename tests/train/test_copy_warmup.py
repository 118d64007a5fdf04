"""Copy warm-up: a from-scratch model learns to repeat spans it has never seen."""

from __future__ import annotations

import math

import pytest
import torch

from envace.policy.loading import load_model
from envace.train.copy_warmup import copy_warmup, data_vocabulary


@torch.no_grad()
def _copy_accuracy(model, vocab: list[int], span: int = 10, rows: int = 16, seed: int = 123) -> float:
    """Greedy next-token accuracy on the repeat of fresh ``[x x]`` rows (its first token excepted:
    nothing in the row predicts it)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor(vocab)[torch.randint(0, len(vocab), (rows, span), generator=g)]
    logits = model(input_ids=torch.cat([ids, ids], 1)).logits[:, span: 2 * span - 1]
    return float((logits.argmax(-1) == ids[:, 1:]).float().mean())


def test_copy_warmup_trains_the_model_on_the_repeat():
    model, _ = load_model("llama:64x2")
    before = [p.detach().clone() for p in model.parameters()]
    losses: list[float] = []
    stats = copy_warmup(model, list(range(1000, 1064)), steps=30, span=8, batch=8, lr=3e-3, seed=0,
                        on_step=lambda s, n, loss: losses.append(loss))
    assert len(losses) == 30 and stats.steps == 30 and stats.vocabulary == 64
    # from ~ln(49k) towards ln(64): the head learns which ids occur (copying takes longer)
    assert stats.last_loss < 0.6 * stats.first_loss
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.slow
def test_copy_warmup_teaches_copying_spans_of_unseen_lengths():
    """The point of the warm-up: after it the model copies spans of lengths it never saw, far
    above the no-copy floor (chance is 1/64). Deterministic for a seed; the phase change (an
    induction head forming) comes at ~300 of these 400 steps."""
    model, _ = load_model("llama:64x2")
    vocab = list(range(1000, 1064))
    before = _copy_accuracy(model, vocab)
    stats = copy_warmup(model, vocab, steps=400, span=8, batch=32, lr=3e-3, seed=0)
    after = _copy_accuracy(model, vocab, span=10)
    assert before < 0.05
    assert after > 0.15 and stats.last_loss < 0.6 * math.log(len(vocab)), (after, stats)


def test_data_vocabulary_is_by_frequency_then_id():
    assert data_vocabulary([[5, 3, 3, 9], [9, 3, 7]], limit=3) == [3, 9, 5]


def test_copy_warmup_rejects_bad_settings():
    model, _ = load_model("tiny")
    with pytest.raises(ValueError, match="steps"):
        copy_warmup(model, [1, 2, 3], steps=0)
    with pytest.raises(ValueError, match="two tokens"):
        copy_warmup(model, [1], steps=3)


@torch.no_grad()
def _repeat_loss(model, rows: torch.Tensor) -> float:
    n = rows.shape[1]
    logits = model(input_ids=torch.cat([rows, rows], 1)).logits[:, n: 2 * n - 1]
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)))


@pytest.mark.parametrize("data_frac", [0.0, 1.0])
def test_copy_warmup_copies_windows_of_the_data_sequences(data_frac):
    """With ``data_frac=1`` every step copies windows of the data (here ids 5000-5063, none in the
    random-span vocabulary), so the repeat loss on data rows falls below that on random rows;
    with ``data_frac=0`` the reverse. The data rows are long JSON-like lists in real use."""
    model, _ = load_model("llama:64x2")
    vocab = list(range(1000, 1064))
    data = [[5000 + (i * 7 + j) % 64 for j in range(40)] for i in range(20)]
    copy_warmup(model, vocab, steps=30, span=8, batch=8, lr=3e-3, seed=0,
                data=data, data_frac=data_frac, data_span=16)
    g = torch.Generator().manual_seed(1)
    on_data = _repeat_loss(model, torch.tensor([d[:12] for d in data[:8]]))
    on_random = _repeat_loss(model, torch.tensor(vocab)[torch.randint(0, 64, (8, 12), generator=g)])
    assert (on_data < on_random) == (data_frac == 1.0), (on_data, on_random)


def test_copy_warmup_rejects_bad_data_settings():
    model, _ = load_model("tiny")
    with pytest.raises(ValueError, match="data_frac must be in"):
        copy_warmup(model, [1, 2, 3], steps=3, data=[[1, 2]], data_frac=1.5)
    with pytest.raises(ValueError, match="needs non-empty data"):
        copy_warmup(model, [1, 2, 3], steps=3, data=[[]], data_frac=0.5)
