"""GRPO loss: alignment of log-probs, masking, the PPO objective, role weights, KL."""

from __future__ import annotations

import copy

import pytest
import torch
from train_helpers import make_sample, random_scored_batch, sampler_logprobs

from envace.train.advantages import ScoredSample
from envace.train.batching import pack_samples
from envace.train.forward import batch_loss, token_logprobs
from envace.train.grpo_loss import role_normalizers
from envace.train.loss_support import merge_loss_stats


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_unpadded_sampler(tiny_model, temperature):
    batch = random_scored_batch(tiny_model, 6, seed=1, temperature=temperature)
    packed = pack_samples(batch)
    with torch.no_grad():
        logp, entropy = token_logprobs(tiny_model, packed, temperature, with_entropy=True)
    for i, s in enumerate(batch):
        row = logp[i][packed.token_mask[i]]
        assert row.tolist() == pytest.approx(s.sample.logprobs, abs=1e-5)
        # The packed old log-probs are the stored ones, at the same positions.
        assert packed.old_logprobs[i][packed.token_mask[i]].tolist() == pytest.approx(s.sample.logprobs, abs=1e-7)
    assert entropy is not None and bool((entropy[packed.token_mask] > 0).all())


def test_mask_covers_exactly_generated_tokens(tiny_model):
    batch = random_scored_batch(tiny_model, 5, seed=2)
    packed = pack_samples(batch)
    assert int(packed.token_mask.sum()) == sum(len(s.sample.gen_ids) for s in batch)
    for i, s in enumerate(batch):
        assert packed.targets[i][packed.token_mask[i]].tolist() == s.sample.gen_ids
    # Whatever sits at prompt / padding positions of the old log-probs has no effect.
    loss_a, _ = batch_loss(tiny_model, packed)
    tampered = copy.copy(packed)
    tampered.old_logprobs = torch.where(packed.token_mask, packed.old_logprobs, torch.full_like(packed.old_logprobs, 50.0))
    loss_b, _ = batch_loss(tiny_model, tampered)
    assert loss_a.item() == loss_b.item()
    # ... while a generated token's stored log-prob does matter.
    first = batch[0]
    changed = first.sample.model_copy(update={"logprobs": [first.sample.logprobs[0] - 1.0] + first.sample.logprobs[1:]})
    loss_c, _ = batch_loss(tiny_model, [ScoredSample(changed, first.advantage, 0.0)] + batch[1:])
    assert loss_c.item() != pytest.approx(loss_a.item(), abs=1e-6)


def test_loss_is_over_generated_tokens_only(tiny_model):
    """The loss equals a hand computation over the generated tokens alone (ratio != 1), and a
    prompt-only sample adds nothing."""
    s = make_sample(tiny_model, "caller", [3, 4, 5, 6], [7, 8, 9])
    shifted_by = [0.1, -0.3, 0.05]
    old = [lp + d for lp, d in zip(s.logprobs, shifted_by)]
    scored = [ScoredSample(s.model_copy(update={"logprobs": old}), 0.7, 1.0)]
    ratios = [torch.exp(torch.tensor(-d)) for d in shifted_by]  # new - old = -shift
    per_token = [-min(float(r) * 0.7, float(r.clamp(0.8, 1.2)) * 0.7) for r in ratios]
    loss_one, _ = batch_loss(tiny_model, scored)
    assert loss_one.item() == pytest.approx(sum(per_token) / 3, abs=1e-5)

    empty = make_sample(tiny_model, "caller", [9, 10, 11, 12, 13, 14], [])
    loss_two, stats = batch_loss(tiny_model, scored + [ScoredSample(empty, 5.0, 1.0)])
    assert loss_one.item() == pytest.approx(loss_two.item(), abs=1e-7)
    assert stats["tokens/caller"] == 3 and stats["samples/caller"] == 1


def test_ratio_one_gives_minus_mean_advantage_per_role(tiny_model):
    batch = random_scored_batch(tiny_model, 8, seed=3)
    caller = [s for s in batch if s.role == "caller"]
    sim = [s for s in batch if s.role == "simulator"]

    def token_mean(items):
        return -sum(s.advantage * s.n_tokens for s in items) / sum(s.n_tokens for s in items)

    loss, stats = batch_loss(tiny_model, batch, caller_weight=0.5, simulator_weight=2.0)
    assert stats["loss/caller"] == pytest.approx(token_mean(caller), abs=1e-5)
    assert stats["loss/simulator"] == pytest.approx(token_mean(sim), abs=1e-5)
    assert loss.item() == pytest.approx(0.5 * token_mean(caller) + 2.0 * token_mean(sim), abs=1e-5)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["clip_frac"] == 0.0

    _, seq = batch_loss(tiny_model, batch, agg="seq_mean")
    assert seq["loss/caller"] == pytest.approx(-sum(s.advantage for s in caller) / len(caller), abs=1e-5)
    assert seq["loss/simulator"] == pytest.approx(-sum(s.advantage for s in sim) / len(sim), abs=1e-5)


def test_clipped_tokens_give_no_gradient(tiny_model):
    s = make_sample(tiny_model, "caller", [1, 2, 3], [4, 5, 6])
    # Stored log-probs far below the current ones: ratio >> 1 + clip; with A > 0 the clipped
    # branch is active on every token and the gradient vanishes.
    shifted = s.model_copy(update={"logprobs": [lp - 2.0 for lp in s.logprobs]})
    loss, stats = batch_loss(tiny_model, [ScoredSample(shifted, 1.0, 1.0)])
    loss.backward()
    assert stats["clip_frac"] == 1.0
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert all(float(g.abs().max()) == 0.0 for g in _grads(tiny_model).values())
    # With A < 0 the unclipped branch binds: gradient flows.
    tiny_model.zero_grad()
    loss, stats = batch_loss(tiny_model, [ScoredSample(shifted, -1.0, 0.0)])
    loss.backward()
    assert stats["clip_frac"] == 0.0
    assert max(float(g.abs().max()) for g in _grads(tiny_model).values()) > 0.0


def test_frozen_caller_weight_zero(tiny_model):
    """Shared parameters, caller weight 0: caller tokens give exactly zero gradient, the
    simulator's tokens still train (the reference implementation trains nothing here)."""
    batch = random_scored_batch(tiny_model, 8, seed=4)
    caller = [s for s in batch if s.role == "caller"]
    sim = [s for s in batch if s.role == "simulator"]

    loss, stats = batch_loss(tiny_model, caller, caller_weight=0.0)
    loss.backward()
    assert loss.item() == 0.0 and stats["loss/caller"] != 0.0
    assert all(float(g.abs().max()) == 0.0 for g in _grads(tiny_model).values())

    tiny_model.zero_grad()
    batch_loss(tiny_model, batch, caller_weight=0.0)[0].backward()
    mixed = _grads(tiny_model)
    tiny_model.zero_grad()
    batch_loss(tiny_model, sim)[0].backward()
    sim_only = _grads(tiny_model)
    assert max(float(g.abs().max()) for g in mixed.values()) > 0.0
    for name in mixed:
        torch.testing.assert_close(mixed[name], sim_only[name], atol=1e-7, rtol=1e-5)


def test_kl_to_reference(tiny_model):
    batch = random_scored_batch(tiny_model, 4, seed=5)
    ref = copy.deepcopy(tiny_model).requires_grad_(False)
    _, stats = batch_loss(tiny_model, batch, ref_model=ref)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss0, stats0 = batch_loss(tiny_model, batch, ref_model=ref)
    loss1, stats1 = batch_loss(tiny_model, batch, ref_model=ref, kl_coef=0.5)
    assert stats0["kl"] > 0.0 and stats1["kl"] == pytest.approx(stats0["kl"])
    # At ratio 1 every role's loss rises by kl_coef x that role's mean KL; total by about that.
    assert loss1.item() > loss0.item()
    with pytest.raises(ValueError, match="ref_model"):
        batch_loss(tiny_model, batch, kl_coef=0.1)


def test_normalizers_make_micro_batch_losses_sum(tiny_model):
    batch = random_scored_batch(tiny_model, 9, seed=6)
    for agg in ("token_mean", "seq_mean"):
        full_loss, full = batch_loss(tiny_model, batch, agg=agg)
        norms = role_normalizers(batch, agg)
        parts = [batch_loss(tiny_model, batch[i : i + 3], agg=agg, normalizers=norms) for i in range(0, 9, 3)]
        merged = merge_loss_stats([p[1] for p in parts])
        assert sum(p[0].item() for p in parts) == pytest.approx(full_loss.item(), abs=1e-6)
        for key in ("loss/caller", "loss/simulator", "tokens/caller", "samples/simulator", "tokens"):
            assert merged[key] == pytest.approx(full[key], abs=1e-6)
        assert merged["entropy"] == pytest.approx(full["entropy"], abs=1e-5)


def test_bad_inputs(tiny_model):
    s = make_sample(tiny_model, "caller", [1, 2], [3, 4])
    with pytest.raises(ValueError, match="agg"):
        batch_loss(tiny_model, [ScoredSample(s, 1.0, 1.0)], agg="mean")
    bad = s.model_copy(update={"logprobs": [-1.0]})
    with pytest.raises(ValueError, match="logprobs"):
        batch_loss(tiny_model, [ScoredSample(bad, 1.0, 1.0)])
    no_prompt = s.model_copy(update={"prompt_ids": []})
    with pytest.raises(ValueError, match="empty prompt"):
        batch_loss(tiny_model, [ScoredSample(no_prompt, 1.0, 1.0)])


def test_all_empty_batch_backward_is_safe(tiny_model):
    empty = make_sample(tiny_model, "simulator", [1, 2, 3], [])
    loss, stats = batch_loss(tiny_model, [ScoredSample(empty, 1.0, 1.0)])
    loss.backward()
    assert loss.item() == 0.0 and stats["tokens"] == 0.0


def test_sampler_helper_consistency(tiny_model):
    # Guard for the helper itself: an unpadded single-row forward.
    lp = sampler_logprobs(tiny_model, [1, 2, 3], [4])
    assert len(lp) == 1 and lp[0] < 0


@pytest.mark.parametrize("share_prefixes", [True, False])
def test_per_role_temperatures_match_each_roles_sampler(tiny_model, share_prefixes):
    """A simulator sampled cooler than the caller: each row is scored at its own role's
    temperature, so at unchanged parameters every log-prob equals the sampler's (ratio 1);
    one shared temperature would not."""
    temps = {"caller": 1.0, "simulator": 0.5}
    batch = [ScoredSample(make_sample(tiny_model, role, [3, 4, 5, 6 + i], [7 + i, 8, 9], trajectory_index=i,
                                      temperature=temps[role]), 0.5, 1.0)
             for i, role in enumerate(["caller", "simulator", "caller", "simulator"])]
    packed = pack_samples(batch)
    with torch.no_grad():
        logp, _ = token_logprobs(tiny_model, packed, temps, share_prefixes=share_prefixes)
        shared, _ = token_logprobs(tiny_model, packed, 1.0, share_prefixes=share_prefixes)
        _, stats = batch_loss(tiny_model, packed, temperature=temps, share_prefixes=share_prefixes)
    for i, s in enumerate(batch):
        assert logp[i][packed.token_mask[i]].tolist() == pytest.approx(s.sample.logprobs, abs=1e-5)
        same = shared[i][packed.token_mask[i]].tolist() == pytest.approx(s.sample.logprobs, abs=1e-5)
        assert same == (s.role == "caller")
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["clip_frac"] == 0.0


def test_updater_scores_greedy_roles_at_temperature_one():
    from envace.train.step import UpdaterConfig

    assert UpdaterConfig(temperature=0.6).role_temperatures() == 0.6
    assert UpdaterConfig(temperature=0.6, simulator_temperature=0.6).role_temperatures() == 0.6
    # greedy turns store log-probs at temperature 1
    assert UpdaterConfig(temperature=0.6, simulator_temperature=0.0).role_temperatures() == {"caller": 0.6,
                                                                                           "simulator": 1.0}
    assert UpdaterConfig(temperature=0.0).role_temperatures() == 1.0
