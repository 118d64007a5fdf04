"""Shared-prefix forward in training (issue #6): a micro-batch whose rows share prompt prefixes
(a task's G samples) runs each prefix once; log-probs, entropies, gradients and a whole GRPO
step must be what the plain padded forward gives."""

from __future__ import annotations

import importlib
import random

import pytest
import torch
from train_helpers import VOCAB, make_sample, make_tiny_model

from envace.policy.transformers_backend import plan_shared_prefixes
from envace.train.advantages import ScoredSample
from envace.train.batching import pack_samples
from envace.train.step import GRPOUpdater, UpdaterConfig

grpo_loss_module = importlib.import_module("envace.train.forward")  # the module, not a re-exported name


def grouped_batch(model, seed: int = 0, group: int = 3) -> list[ScoredSample]:
    """Two tasks x ``group`` samples per role: caller samples share the whole prompt (turn 0),
    simulator samples share a long head and differ in the last prompt tokens (the call); one
    unrelated sample; generations of different lengths."""
    rng = random.Random(seed)
    out = []
    for task in range(2):
        system = [rng.randrange(VOCAB) for _ in range(rng.randint(20, 30))]
        for g in range(group):
            gen = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
            s = make_sample(model, "caller", system, gen, group_id=f"t{task}", trajectory_index=g)
            out.append(ScoredSample(sample=s, advantage=rng.uniform(-1, 1), reward=0.0))
            call = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 5))]
            gen = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
            s = make_sample(model, "simulator", system[:18] + call, gen, group_id=f"t{task}", trajectory_index=g)
            out.append(ScoredSample(sample=s, advantage=rng.uniform(-1, 1), reward=0.0))
    lone = make_sample(model, "caller", [rng.randrange(VOCAB) for _ in range(9)], [1, 2, 3], group_id="t9")
    out.append(ScoredSample(sample=lone, advantage=0.5, reward=0.0))
    return out


def _run(model, packed, share: bool):
    model.zero_grad(set_to_none=True)
    logp, ent = grpo_loss_module.token_logprobs(model, packed, temperature=0.8, with_entropy=True,
                                                share_prefixes=share)
    (logp * packed.advantages[:, None]).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return logp.detach(), ent, grads


def test_shared_prefix_forward_gives_the_same_logprobs_and_gradients():
    model = make_tiny_model(0)
    batch = grouped_batch(model)
    packed = pack_samples(batch)
    seqs = [s.sample.prompt_ids + s.sample.gen_ids for s in batch]
    limits = [len(s.sample.prompt_ids) - 1 for s in batch]
    assert plan_shared_prefixes(seqs, limits=limits) is not None  # the shared path really runs
    want = _run(model, packed, False)
    got = _run(model, packed, True)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)
    assert (got[0] != 0).sum() == packed.token_mask.sum()  # every generated token was scored


@pytest.mark.parametrize("merge_turns", [True, False])
def test_grpo_step_is_unchanged_by_prefix_sharing(monkeypatch, merge_turns):
    after = []
    plans = []

    def counting_plan(*args, **kwargs):
        plan = plan_shared_prefixes(*args, **kwargs)
        plans.append(plan is not None)
        return plan

    monkeypatch.setattr(grpo_loss_module, "plan_shared_prefixes", counting_plan)
    for share in (False, True):
        model = make_tiny_model(1)
        batch = grouped_batch(make_tiny_model(1), seed=4)
        cfg = UpdaterConfig(lr=1e-2, micro_batch_tokens=200, merge_turns=merge_turns, share_prefixes=share)
        stats = GRPOUpdater(model, cfg).step(batch)
        after.append((stats, [p.detach().clone() for p in model.parameters()]))
    (s0, w0), (s1, w1) = after
    assert any(plans)  # some micro-batch took the shared path
    assert s1["micro_batches"] == s0["micro_batches"] > 1
    for key in ("loss", "ratio_mean", "entropy", "grad_norm"):
        assert s1[key] == pytest.approx(s0[key], rel=1e-4, abs=1e-6)
    for a, b in zip(w1, w0):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_the_vocabulary_head_in_chunks_gives_the_same_logprobs_and_gradients():
    """The head runs over a few scored positions at a time, each chunk recomputed in the backward
    (never a [positions x vocabulary] tensor of the whole micro-batch): the log-probs, entropies
    and gradients are what one pass over all positions gives, role temperatures included."""
    model = make_tiny_model(1)
    packed = pack_samples(grouped_batch(model, seed=3))
    n = int(packed.token_mask.sum())
    results = []
    for chunk in (10**9, 4, 1):
        model.zero_grad(set_to_none=True)
        logp, ent = grpo_loss_module.token_logprobs(model, packed, temperature={"caller": 0.8, "simulator": 1.0},
                                                    with_entropy=True, head_chunk=chunk)
        (logp * packed.advantages[:, None]).sum().backward()
        results.append((logp.detach(), ent, [p.grad.clone() for p in model.parameters()]))
    assert n > 4  # several chunks really ran
    want = results[0]
    for got in results[1:]:
        torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(got[1], want[1], atol=1e-6, rtol=0)
        for g, w in zip(got[2], want[2]):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
