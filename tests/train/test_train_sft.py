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
