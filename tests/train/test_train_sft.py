"""SFT samples of oracle trajectories: merged multi-turn caller samples train exactly what the
per-turn samples train, at a fraction of the tokens."""

from __future__ import annotations

import pytest
import torch

from envace.core.prompts import PromptStyle
from envace.envs import load_tasks
from envace.policy.loading import load_model
from envace.train.batching import merge_turns
from envace.train.sft import oracle_sft_samples, sft_loss, target_turn_lengths


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def test_merged_caller_sample_has_the_same_loss_as_its_turns(tiny):
    model, tok = tiny
    tasks = load_tasks("calendar", "train", limit=3)
    per_turn = oracle_sft_samples(tasks, tok, PromptStyle(), roles=["caller"], merge_caller=False)
    merged = oracle_sft_samples(tasks, tok, PromptStyle(), roles=["caller"])
    assert len(merged) == len(tasks) < len(per_turn)
    assert sum(s.target_count for s in merged) == sum(s.target_count for s in per_turn)
    # fewer tokens to run through the model: the prompts are not repeated per turn
    assert sum(len(s.prompt_ids) + len(s.gen_ids) for s in merged) < 0.6 * sum(
        len(s.prompt_ids) + len(s.gen_ids) for s in per_turn)
    total = sum(s.target_count for s in merged)
    with torch.no_grad():
        a = sft_loss(model, merged, total, tok.pad_token_id)
        b = sum(sft_loss(model, [s], total, tok.pad_token_id) for s in per_turn)
    assert float(a) == pytest.approx(float(b), rel=1e-4)


def test_merge_refuses_turns_that_do_not_extend_each_other(tiny):
    _, tok = tiny
    tasks = load_tasks("shop", "train", limit=1)
    turns = oracle_sft_samples(tasks, tok, PromptStyle(), roles=["caller"], merge_caller=False)
    assert len(turns) >= 2 and merge_turns(turns) is not None
    broken = [turns[0], turns[1].model_copy(update={"prompt_ids": [7] + turns[1].prompt_ids[1:]})]
    assert merge_turns(broken) is None
    assert merge_turns([]) is None


def test_turn_lengths_of_merged_samples_are_the_lengths_of_their_turns(tiny):
    _, tok = tiny
    tasks = load_tasks("bank", "train", limit=4)
    per_turn = oracle_sft_samples(tasks, tok, PromptStyle(), merge_caller=False)
    merged = oracle_sft_samples(tasks, tok, PromptStyle())
    assert any(s.loss_mask is not None for s in merged)  # the merged samples hold several turns
    want = {role: sorted(len(s.gen_ids) for s in per_turn if s.role == role) for role in ("caller", "simulator")}
    got = {role: sorted(lengths) for role, lengths in target_turn_lengths(merged).items()}
    assert got == want and all(want.values())


@pytest.mark.parametrize("world", ["shop", "calendar", "bank"])
def test_error_probe_samples_teach_the_real_error_of_a_plausible_missing_id(tiny, world):
    """sft.error_probes: each probe sample's target is what a fresh world, replayed to that point,
    answers to the call with a missing id; the ids look like real ones (not the eval's 99999)."""
    import json
    import random

    from envace.core.errors import is_error
    from envace.core.toolcall import RESULT_CLOSE
    from envace.core.types import trajectory_calls
    from envace.envs.probes import error_probes
    from envace.envs.registry import make_world
    from envace.rollout.actors import OracleActor
    from envace.rollout.engine import RolloutConfig, run_episodes
    from envace.rollout.sources import RealSource

    _, tok = tiny
    tasks = load_tasks(world, "train", limit=6)
    plain = oracle_sft_samples(tasks, tok, PromptStyle(), roles=["simulator"])
    probed = oracle_sft_samples(tasks, tok, PromptStyle(), roles=["simulator"], error_probes=1)
    key = lambda s: (s.group_id, s.turn)  # noqa: E731
    assert [key(s) for s in probed if s in plain] == [key(s) for s in plain]  # the plain ones unchanged
    extra = [s for s in probed if s not in plain]
    assert 0 < len(extra) <= len(tasks)
    again = oracle_sft_samples(tasks, tok, PromptStyle(), roles=["simulator"], error_probes=1)
    assert [s.gen_ids for s in again] == [s.gen_ids for s in probed]  # seeded: the same ids every run

    trajs, _ = run_episodes(tasks, OracleActor(), RealSource(), RolloutConfig(max_turns=12))
    by_id = {t.id: (t, tr) for t, tr in zip(tasks, trajs)}
    for s in extra:
        task, traj = by_id[s.group_id]
        calls = [c for c, _ in trajectory_calls(traj)]
        (probe,) = error_probes(task, calls, 1, rng=random.Random(f"probes:{task.id}"))
        (key_arg, missing), = [(k, v) for k, v in probe.call.arguments.items()
                               if v != calls[probe.position].arguments[k]]
        assert "99999" not in missing and missing in tok.decode(s.prompt_ids)
        fresh = make_world(task.env.world, task.env.seed)  # replay and ask the real world ourselves
        for c in calls[: probe.position]:
            fresh.call(c.name, c.arguments)
        real = fresh.call(probe.call.name, probe.call.arguments)
        assert is_error(real)
        text = tok.decode(s.gen_ids)
        assert text.endswith(RESULT_CLOSE) and json.loads(text[: -len(RESULT_CLOSE)]) == real
        original = calls[probe.position].arguments[key_arg]
        assert missing.split("-")[0] == original.split("-")[0] and len(missing) == len(original)


def test_sft_in_bf16_mixed_precision_learns_as_fp32_does():
    """run_sft(mixed_precision='bf16') fits the oracle samples about as fp32 does, with fp32
    weights (it is the forward's dtype that changes, not the model's)."""
    from envace.train.sft import run_sft

    losses = {}
    for precision in ("no", "bf16"):
        model, tok = load_model("tiny")
        samples = oracle_sft_samples(load_tasks("bank", "train", limit=4), tok, PromptStyle())
        stats = run_sft(model, samples, epochs=4, lr=3e-3, batch_samples=4, pad_id=tok.pad_token_id or 0,
                        mixed_precision=precision)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert stats.last_loss < 0.8 * stats.first_loss
        losses[precision] = (stats.first_loss, stats.last_loss)
    assert losses["bf16"][0] == pytest.approx(losses["no"][0], rel=0.02)  # same start, bf16 rounding apart
    assert losses["bf16"][0] != losses["no"][0]
    assert losses["bf16"][1] == pytest.approx(losses["no"][1], rel=0.15)


def test_sft_with_activation_checkpointing_trains_the_same_weights():
    """``grpo.gradient_checkpointing`` reaches the warm start: each layer is recomputed in the
    backward (transformers' checkpointing really on), the prefix-sharing cache path is off, and the
    trained weights are those of the plain SFT, up to float rounding."""
    from envace.train.sft import run_sft

    trained = {}
    for ckpt in (False, True):
        model, tok = load_model("tiny")
        samples = oracle_sft_samples(load_tasks("bank", "train", limit=2), tok, PromptStyle())
        stats = run_sft(model, samples, epochs=1, lr=3e-3, batch_samples=4, pad_id=tok.pad_token_id or 0,
                        gradient_checkpointing=ckpt)
        assert model.is_gradient_checkpointing == ckpt
        trained[ckpt] = (stats.last_loss, {k: v.detach().clone() for k, v in model.state_dict().items()})
    assert trained[True][0] == pytest.approx(trained[False][0], rel=1e-4)
    for k, v in trained[False][1].items():
        torch.testing.assert_close(trained[True][1][k], v, atol=2e-5, rtol=1e-4)
