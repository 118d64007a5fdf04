"""Two-phase prefill of shared prompt prefixes (issue #6): same generations as one padded
prefill, on a real tiny model, for the prompt shapes a rollout produces (G copies of a prompt,
prompts that share a system prompt, a prompt that is a prefix of another)."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.sampling import SamplingParams
from envace.policy.prefixes import plan_shared_prefixes
from envace.policy.transformers_backend import TransformersBackend


def _check_plan(prompts: list[list[int]]) -> None:
    plan = plan_shared_prefixes(prompts)
    if plan is None:
        return
    assert len(plan.group_of) == len(prompts)
    assert len(plan.prefix_len) == len(plan.firsts) == max(plan.group_of) + 1
    for row, g in enumerate(plan.group_of):
        k = plan.prefix_len[g]
        assert 1 <= k <= len(prompts[row]) - 1  # a real prefix, and a token of its own left
        assert prompts[row][:k] == prompts[plan.firsts[g]][:k]
    for g, first in enumerate(plan.firsts):
        assert plan.group_of[first] == g


def test_plan_groups_identical_prompts_and_skips_unrelated_ones() -> None:
    a, b = list(range(1, 40)), list(range(100, 130))
    plan = plan_shared_prefixes([a, b, a, b, a])
    assert plan is not None
    assert plan.group_of[0] == plan.group_of[2] == plan.group_of[4] != plan.group_of[1] == plan.group_of[3]
    assert sorted(plan.prefix_len) == [len(b) - 1, len(a) - 1]
    assert plan_shared_prefixes([a, b]) is None  # nothing shared: one ordinary prefill
    assert plan_shared_prefixes([a]) is None
    assert plan_shared_prefixes([a, a[:1]]) is None  # a one-token prompt has nothing to share
    # A prompt that is a prefix of another: the shorter keeps its last token for phase 2.
    plan = plan_shared_prefixes([a, a[:30], a[:30]])
    assert plan is not None and plan.prefix_len == [29]
    _check_plan([a, a[:30], a[:30]])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=9))
def test_plan_invariants_hold_for_any_prompts(prompts: list[list[int]]) -> None:
    _check_plan(prompts)


@pytest.fixture(scope="module")
def rollout_like(chat_prompts: list[list[int]]) -> list[list[int]]:
    """G=3 copies of each prompt, interleaved, plus one prompt continued by a few tokens (a later
    turn of the same chat): every shape the prefix planner distinguishes."""
    prompts = [p for p in chat_prompts for _ in range(3)]
    prompts.append(chat_prompts[1] + chat_prompts[3][-5:])
    return prompts


def _both(tiny: TransformersBackend, prompts: list[list[int]], params: SamplingParams, max_batch: int):
    backend = TransformersBackend(tiny.model, tiny.tokenizer, max_batch=max_batch)
    assert plan_shared_prefixes(prompts[:max_batch]) is not None  # the shared path really runs
    backend.share_prefixes = False
    plain = backend.generate(prompts, params)
    backend.share_prefixes = True
    shared = backend.generate(prompts, params)
    return plain, shared


@pytest.mark.parametrize("max_batch", [16, 5])
def test_greedy_generation_is_unchanged_by_prefix_sharing(
    tiny: TransformersBackend, rollout_like: list[list[int]], max_batch: int
) -> None:
    plain, shared = _both(tiny, rollout_like, SamplingParams(max_new_tokens=20, temperature=0), max_batch)
    for want, got in zip(plain, shared):
        assert got.token_ids == want.token_ids
        assert got.text == want.text and got.finish == want.finish
        torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-4, rtol=0)


def test_seeded_sampling_is_unchanged_by_prefix_sharing(
    tiny: TransformersBackend, rollout_like: list[list[int]]
) -> None:
    # The random tiny model is near-uniform over 49k tokens (~9.3 nats per token), so the two paths'
    # float noise (~4e-6 in the logits) moves a seeded draw across a token boundary now and then:
    # its final norm scaled by 4 gives ~1.6 nats per token (every row still differs), where only a
    # real difference between the paths changes a draw.
    model = copy.deepcopy(tiny.model)
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)
    tiny = TransformersBackend(model, tiny.tokenizer)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=11)
    plain, shared = _both(tiny, rollout_like, params, 16)
    assert len({tuple(o.token_ids) for o in plain}) == len(plain)  # still sampling, not argmax
    for prompt, want, got in zip(rollout_like, plain, shared):
        assert got.token_ids == want.token_ids
        torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-4, rtol=0)
        # and they are what a fresh, unpadded forward says
        with torch.no_grad():
            logits = tiny.model(torch.tensor([prompt + got.token_ids])).logits[0, len(prompt) - 1 : -1].float()
        fresh = torch.log_softmax(logits, -1).gather(-1, torch.tensor(got.token_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(got.logprobs), fresh, atol=1e-4, rtol=0)


def test_stop_strings_cut_the_same_with_prefix_sharing(
    tiny: TransformersBackend, rollout_like: list[list[int]]
) -> None:
    greedy = SamplingParams(max_new_tokens=20, temperature=0)
    ref = tiny.generate(rollout_like[:1], greedy)[0]
    stop = tiny.tokenizer.decode(ref.token_ids[3:5])
    params = SamplingParams(max_new_tokens=20, temperature=0, stop=[stop])
    plain, shared = _both(tiny, rollout_like, params, 16)
    assert [g.token_ids for g in shared] == [g.token_ids for g in plain]
    assert [g.text for g in shared] == [g.text for g in plain]
    assert shared[0].finish == "stop"
