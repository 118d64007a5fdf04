"""Optimiser step: learning on a fixed batch, exact gradient accumulation, modes, LoRA."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from peft import LoraConfig, get_peft_model
from train_helpers import VOCAB, make_sample, make_tiny_model, random_scored_batch

from envace.train.advantages import ScoredSample
from envace.train.batching import padding_fraction, sequence_length, split_micro_batches
from envace.train.forward import batch_loss
from envace.train.modes import MODE_NAMES, ModeSpec
from envace.train.step import GRPOUpdater, UpdaterConfig, update_for_mode, updaters_for_mode


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _changed(before: dict[str, torch.Tensor], model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}


def test_one_update_lowers_loss_on_its_batch(tiny_model):
    batch = random_scored_batch(tiny_model, 8, seed=10)
    with torch.no_grad():
        before, _ = batch_loss(tiny_model, batch)
    stats = GRPOUpdater(tiny_model, UpdaterConfig(lr=1e-3)).step(batch)
    with torch.no_grad():
        after, _ = batch_loss(tiny_model, batch)
    assert after.item() < before.item() - 1e-4
    assert stats["optimizer_steps"] == 1 and stats["grad_norm"] > 0


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean"])
def test_micro_batch_accumulation_matches_full_batch(agg):
    model = make_tiny_model(1)
    batch = random_scored_batch(model, 9, seed=11)
    cfg = dict(agg=agg, caller_weight=0.5, simulator_weight=2.0)
    full = GRPOUpdater(model, UpdaterConfig(micro_batch_tokens=10_000, **cfg))
    full_stats = full.compute_gradients(batch)
    full_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    longest = max(sequence_length(s) for s in batch)
    split = GRPOUpdater(model, UpdaterConfig(micro_batch_tokens=3 * longest + 1, **cfg))
    split_stats = split.compute_gradients(batch)
    assert full_stats["micro_batches"] == 1 and split_stats["micro_batches"] == 3
    assert split_stats["loss"] == pytest.approx(full_stats["loss"], abs=1e-6)
    assert split_stats["padding_frac"] <= full_stats["padding_frac"]
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, full_grads[n], atol=1e-7, rtol=1e-5)


def test_split_micro_batches_respects_budget():
    model = make_tiny_model(2)
    batch = random_scored_batch(model, 20, seed=12)
    micro = split_micro_batches(batch, 40)
    assert sorted(id(s) for mb in micro for s in mb) == sorted(id(s) for s in batch)
    for mb in micro:
        assert len(mb) == 1 or len(mb) * max(sequence_length(s) for s in mb) <= 40
    assert 0.0 <= padding_fraction(micro) < padding_fraction([batch])
    with pytest.raises(ValueError):
        split_micro_batches(batch, 0)


def test_skipping_zero_advantage_samples_changes_nothing():
    model = make_tiny_model(3)
    batch = random_scored_batch(model, 8, seed=13)
    batch = [s if i % 3 else type(s)(s.sample, 0.0, s.reward) for i, s in enumerate(batch)]
    grads = []
    for skip in (True, False):
        stats = GRPOUpdater(model, UpdaterConfig(skip_zero_advantage=skip)).compute_gradients(batch)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        assert stats["skipped_zero_adv"] == (3 if skip else 0)
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], atol=1e-7, rtol=1e-5)


def test_no_signal_takes_no_step(tiny_model):
    batch = [type(s)(s.sample, 0.0, 1.0) for s in random_scored_batch(tiny_model, 4, seed=14)]
    before = _params(tiny_model)
    stats = GRPOUpdater(tiny_model, UpdaterConfig(lr=1e-2, weight_decay=0.1)).step(batch)
    assert stats["optimizer_steps"] == 0 and not _changed(before, tiny_model)


def test_ppo_epochs(tiny_model):
    batch = random_scored_batch(tiny_model, 4, seed=15)
    stats = GRPOUpdater(tiny_model, UpdaterConfig(lr=1e-3, ppo_epochs=3)).step(batch)
    assert stats["optimizer_steps"] == 3
    assert stats["ratio_mean"] != pytest.approx(1.0, abs=1e-7)  # later epochs are off-policy


def test_mode_table():
    assert set(MODE_NAMES) == {"share", "noshare", "caller_only", "frozen_caller"}
    share, noshare = ModeSpec.for_mode("share"), ModeSpec.for_mode("noshare")
    caller_only, frozen_caller = ModeSpec.for_mode("caller_only"), ModeSpec.for_mode("frozen_caller")
    assert share.shared_parameters and share.trained_models == ("policy",)
    assert noshare.model_keys == ("caller", "simulator") and noshare.trained_models == ("caller", "simulator")
    assert caller_only.model_keys == ("caller", "simulator") and caller_only.trained_models == ("caller",)
    assert frozen_caller.shared_parameters and frozen_caller.trained_roles == {"simulator"}
    assert frozen_caller.loss_weights("policy", 1.0, 1.0) == {"caller": 0.0, "simulator": 1.0}
    assert noshare.loss_weights("caller", 1.0, 3.0) == {"caller": 1.0, "simulator": 0.0}
    with pytest.raises(ValueError, match="unknown training mode 'shared'"):
        ModeSpec.for_mode("shared")


def test_frozen_caller_share_mode_trains_through_simulator_only(tiny_model):
    spec = ModeSpec.for_mode("frozen_caller")
    updaters = updaters_for_mode(spec, {"policy": tiny_model}, UpdaterConfig(lr=1e-3))
    batch = random_scored_batch(tiny_model, 8, seed=16)
    caller_only_batch = [s for s in batch if s.role == "caller"]

    before = _params(tiny_model)
    stats = update_for_mode(spec, updaters, caller_only_batch)
    assert stats["policy/optimizer_steps"] == 0 and not _changed(before, tiny_model)

    stats = update_for_mode(spec, updaters, batch)
    assert stats["policy/optimizer_steps"] == 1
    assert stats["policy/tokens/caller"] == 0 and stats["policy/tokens/simulator"] > 0
    assert _changed(before, tiny_model)  # the shared parameters did learn


def test_noshare_and_caller_only_route_samples_to_their_model():
    caller_model, sim_model = make_tiny_model(4), make_tiny_model(5)
    batch = random_scored_batch(caller_model, 8, seed=17)
    # noshare: each model learns from its own role; the caller model's step equals a step on
    # caller samples alone.
    reference = copy.deepcopy(caller_model)
    GRPOUpdater(reference, UpdaterConfig(lr=1e-3)).step([s for s in batch if s.role == "caller"])
    spec = ModeSpec.for_mode("noshare")
    sim_before = _params(sim_model)
    updaters = updaters_for_mode(spec, {"caller": caller_model, "simulator": sim_model}, UpdaterConfig(lr=1e-3))
    stats = update_for_mode(spec, updaters, batch)
    assert stats["caller/tokens/simulator"] == 0 and stats["simulator/tokens/caller"] == 0
    for (n, p), q in zip(caller_model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, atol=1e-7, rtol=1e-6, msg=n)
    assert _changed(sim_before, sim_model)

    # caller_only: the simulator model gets no updater and never moves.
    spec = ModeSpec.for_mode("caller_only")
    sim_before = _params(sim_model)
    updaters = updaters_for_mode(spec, {"caller": caller_model, "simulator": sim_model}, UpdaterConfig(lr=1e-3))
    assert set(updaters) == {"caller"}
    update_for_mode(spec, updaters, batch)
    assert not _changed(sim_before, sim_model)
    with pytest.raises(ValueError, match="missing"):
        updaters_for_mode(spec, {"caller": caller_model}, UpdaterConfig())


def test_lora_model_trains_only_its_adapter(tiny_model):
    batch = random_scored_batch(tiny_model, 6, seed=18)
    lora = get_peft_model(tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    updater = GRPOUpdater(lora, UpdaterConfig(lr=1e-2))
    opt_params = {id(p) for g in updater.optimizer.param_groups for p in g["params"]}
    trainable = {id(p) for n, p in lora.named_parameters() if "lora_" in n}
    assert opt_params == trainable
    before = _params(lora)
    # LoRA B starts at zero, so the adapted model equals the base: ratio 1 at the stored log-probs.
    stats = updater.step(batch)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    changed = _changed(before, lora)
    assert changed and all("lora_" in n for n in changed)
    with torch.no_grad():
        after, _ = batch_loss(lora, batch)
    assert after.item() < stats["loss"]


class _PlainLM(torch.nn.Module):
    """Not a Hugging Face model: no logits_to_keep, returns bare logits."""

    def __init__(self, vocab: int = 256, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        h = torch.cumsum(h, dim=1) / torch.arange(1, h.shape[1] + 1).view(1, -1, 1)  # causal mean
        return self.head(torch.tanh(self.mix(h)))


def test_plain_module_trains():
    model = _PlainLM()
    batch = random_scored_batch(model, 6, seed=19)
    with torch.no_grad():
        before, stats = batch_loss(model, batch)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    GRPOUpdater(model, UpdaterConfig(lr=1e-2)).step(batch)
    with torch.no_grad():
        after, _ = batch_loss(model, batch)
    assert after.item() < before.item()


def test_plain_module_scores_each_role_at_its_temperature():
    """The fallback path (no HF head split) scales each row by its role's temperature too."""
    model = _PlainLM()
    temps = {"caller": 1.0, "simulator": 0.4}
    batch = [ScoredSample(make_sample(model, role, [3, 4, 5 + i], [9, 10 + i], trajectory_index=i,
                                      temperature=temps[role]), 0.5, 1.0)
             for i, role in enumerate(["caller", "simulator", "simulator"])]
    with torch.no_grad():
        _, right = batch_loss(model, batch, temperature=temps)
        _, shared = batch_loss(model, batch, temperature=1.0)
    assert right["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert shared["ratio_max"] > 1.0 + 1e-3


def _turn_scored(model, tok):
    """Per-turn caller samples of real 3-call oracle episodes (shop), with the model's own
    log-probs as the sampler's and made-up advantages, so that every sample carries loss."""
    from envace.core.prompts import PromptStyle
    from envace.envs import load_tasks
    from envace.train.sft import oracle_sft_samples
    from train_helpers import sampler_logprobs

    turns = oracle_sft_samples(load_tasks("shop", "train", limit=3), tok, PromptStyle(), roles=["caller"],
                               merge_caller=False)
    return [ScoredSample(sample=t.model_copy(update={"logprobs": sampler_logprobs(model, t.prompt_ids, t.gen_ids)}),
                         advantage=0.5 if t.group_id.endswith("0") else -0.25, reward=0.0) for t in turns]


def test_merging_a_trajectorys_turns_gives_the_same_gradient():
    from envace.policy.loading import load_model
    from envace.train.batching import merge_trajectory_turns

    model, tok = load_model("tiny")
    scored = _turn_scored(model, tok)
    merged = merge_trajectory_turns(scored)
    assert len(merged) == 3 < len(scored)
    assert sum(s.n_tokens for s in merged) == sum(s.n_tokens for s in scored)
    grads = []
    for merge in (True, False):
        up = GRPOUpdater(copy.deepcopy(model), UpdaterConfig(lr=1e-3, merge_turns=merge, pad_id=tok.pad_token_id))
        stats = up.compute_gradients(scored)
        grads.append((stats["loss"], [p.grad.clone() for p in up.params if p.grad is not None]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_grpo_warmup_ramps_the_learning_rate_then_holds_it():
    from envace.train.step import warmup_lr

    assert [warmup_lr(3e-5, k, 2) for k in (1, 2, 3, 9)] == pytest.approx([1e-5, 2e-5, 3e-5, 3e-5])
    assert warmup_lr(3e-5, 1, 0) == 3e-5


def _shifted(batch: list[ScoredSample], by: float) -> list[ScoredSample]:
    """The batch as another engine (a bf16 copy, a server) would have scored it: log-probs off."""
    out = []
    for i, s in enumerate(batch):
        smp = copy.deepcopy(s.sample)
        smp.logprobs = [lp + (by if (i + k) % 2 else -by) for k, lp in enumerate(smp.logprobs)]
        out.append(ScoredSample(sample=smp, advantage=s.advantage, reward=s.reward))
    return out


def test_old_logprobs_from_the_updates_own_forward_equal_a_recompute_first():
    """old_logprobs='current' (one forward) gives the gradient of recomputing the sampler's
    log-probs with the trainer first (two forwards), and reports the sampler's gap."""
    from envace.train.forward import recompute_logprobs

    model = make_tiny_model(5)
    off = _shifted(random_scored_batch(model, 8, seed=21), 0.3)
    grads = {}
    for name in ("recomputed", "current", "stale"):
        batch = copy.deepcopy(off)
        if name == "recomputed":
            recompute_logprobs(model, [s.sample for s in batch])
        cfg = UpdaterConfig(clip=0.1, old_logprobs="current" if name == "current" else "sampler")
        stats = GRPOUpdater(model, cfg).compute_gradients(batch)
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()}
        if name == "current":
            assert stats["logprob_gap_max"] == pytest.approx(0.3, abs=1e-4)
            assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0
        else:
            assert "logprob_gap_max" not in stats
    for n in grads["current"]:
        torch.testing.assert_close(grads["current"][n], grads["recomputed"][n], atol=1e-7, rtol=1e-5)
    # the sampler's shifted log-probs, left as they are, clip some tokens: another gradient
    assert any(not torch.allclose(grads["stale"][n], grads["current"][n], atol=1e-6) for n in grads["current"])
    with pytest.raises(ValueError, match="ppo_epochs must be 1"):
        GRPOUpdater(model, UpdaterConfig(old_logprobs="current", ppo_epochs=2))


def test_gradient_checkpointing_gives_the_same_gradient_without_prefix_sharing():
    """Checkpointed layers recompute activations in the backward: same gradient. Their cache is
    dropped, so the updater must not run shared prefixes once (a silent wrong result if it did)."""
    from train_helpers import make_sample

    grads = {}
    for ckpt in (False, True):
        model = make_tiny_model(6)
        model.train()
        # a group sharing a long prompt, so the prefix-sharing path would run without checkpointing
        shared = list(range(1, 30))
        batch = [ScoredSample(make_sample(model, "caller", shared + [40 + i], [50 + i, 60 + i], trajectory_index=i),
                              advantage=(-1.0) ** i, reward=0.0) for i in range(4)]
        up = GRPOUpdater(model, UpdaterConfig(gradient_checkpointing=ckpt))
        assert up.config.loss_settings()["share_prefixes"] is (not ckpt)
        assert all(layer.gradient_checkpointing is ckpt for layer in model.model.layers)
        up.compute_gradients(batch)
        grads[ckpt] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads[True].keys() == grads[False].keys()
    for n in grads[True]:
        torch.testing.assert_close(grads[True][n], grads[False][n], atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="needs a transformers model"):
        GRPOUpdater(torch.nn.Linear(2, 2), UpdaterConfig(gradient_checkpointing=True))


def test_bf16_mixed_precision_runs_the_forward_in_bf16_and_keeps_fp32_weights():
    """mixed_precision='bf16': the loss's forward runs in bf16 (its log-probs move off fp32's, a
    little), the gradient points where fp32's does, and weights, gradients and Adam state stay fp32."""
    from envace.train.forward import autocast, token_logprobs
    from envace.train.batching import pack_samples

    batch = random_scored_batch(make_tiny_model(7), 8, seed=3)
    grads, stats = {}, {}
    for precision in ("no", "bf16"):
        model = make_tiny_model(7)
        up = GRPOUpdater(model, UpdaterConfig(lr=1e-3, mixed_precision=precision, old_logprobs="current"))
        stats[precision] = up.compute_gradients(copy.deepcopy(batch))
        grads[precision] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
        up.step(copy.deepcopy(batch))
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(v.dtype == torch.float32 for st in up.optimizer.state.values() for v in st.values()
                   if torch.is_tensor(v) and v.dim())
    cos = torch.nn.functional.cosine_similarity(grads["no"], grads["bf16"], dim=0)
    assert 0.95 < float(cos) < 1.0 - 1e-7, float(cos)  # close, and not the fp32 computation itself
    assert stats["bf16"]["ratio_mean"] == 1.0  # its own forward is the ratio's denominator
    model = make_tiny_model(7)
    packed = pack_samples(batch)
    with torch.no_grad():
        full, _ = token_logprobs(model, packed)
        with autocast(model, "bf16"):
            low, _ = token_logprobs(model, packed)
    assert low.dtype == torch.float32
    gap = (low - full)[packed.token_mask].abs().max()
    assert 0.0 < float(gap) < 0.1
    with pytest.raises(ValueError, match="'no' or 'bf16'"):
        autocast(model, "fp16")


def _anchor(model, n: int = 5, seed: int = 40) -> list:
    rng = random.Random(seed)
    return [make_sample(None, role, [rng.randrange(1, VOCAB) for _ in range(rng.randint(3, 9))],
                        [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 6))], group_id=f"a{i}")
            for i, role in enumerate(["caller", "simulator"] * n)][:n]


def test_the_anchor_adds_its_weighted_mean_nll_to_the_policy_gradient():
    """grad(GRPO + c * anchor NLL) = grad(GRPO) + c * grad(NLL), however the anchor is split."""
    from envace.train.forward import sft_loss

    model = make_tiny_model(7)
    batch = random_scored_batch(model, 6, seed=41)
    anchor = _anchor(model)
    GRPOUpdater(model, UpdaterConfig()).compute_gradients(batch)
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    sft_loss(model, anchor, sum(s.target_count for s in anchor)).backward()
    nll = {n: p.grad.clone() for n, p in model.named_parameters()}
    for budget in (10_000, 12):  # one micro-batch, or one per sample
        stats = GRPOUpdater(model, UpdaterConfig(anchor_coef=0.5, micro_batch_tokens=budget)).compute_gradients(
            batch, anchor)
        assert stats["anchor_tokens"] == sum(s.target_count for s in anchor) and stats["anchor_nll"] > 0
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, plain[n] + 0.5 * nll[n], atol=1e-6, rtol=1e-4)
    # off: the anchor samples are ignored
    stats = GRPOUpdater(model, UpdaterConfig()).compute_gradients(batch, anchor)
    assert "anchor_nll" not in stats
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[n])


def test_the_anchor_alone_steps_towards_its_samples_and_only_for_trained_roles():
    """A batch without GRPO signal still steps on the anchor (its NLL falls); a role with weight 0
    takes none of it."""
    from envace.train.forward import sft_loss

    model = make_tiny_model(8)
    flat = [type(s)(s.sample, 0.0, 1.0) for s in random_scored_batch(model, 4, seed=42)]
    anchor = _anchor(model, 6)
    total = sum(s.target_count for s in anchor)
    with torch.no_grad():
        before = float(sft_loss(model, anchor, total))
    stats = GRPOUpdater(model, UpdaterConfig(lr=1e-2, anchor_coef=1.0)).step(flat, anchor)
    with torch.no_grad():
        after = float(sft_loss(model, anchor, total))
    assert stats["optimizer_steps"] == 1 and after < before - 1e-3
    callers = [s for s in anchor if s.role == "caller"]
    stats = GRPOUpdater(model, UpdaterConfig(lr=1e-2, anchor_coef=1.0, simulator_weight=0.0)).compute_gradients(
        flat, anchor)
    assert stats["anchor_tokens"] == sum(s.target_count for s in callers)
    before = _params(model)
    stats = GRPOUpdater(model, UpdaterConfig(lr=1e-2, anchor_coef=1.0, caller_weight=0.0)).step(flat, callers)
    assert stats["optimizer_steps"] == 0 and not _changed(before, model)
