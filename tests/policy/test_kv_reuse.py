"""Key/value caches kept between generate() calls (policy/kv_reuse.py): a later turn that
extends an earlier prompt and generation prefills only its new tokens, and generates what a
backend without the store generates; the store empties when the weights change and stays
within its token budget."""

from __future__ import annotations

import copy

import torch

from envace.policy.kv_reuse import KVStore
from envace.core.sampling import SamplingParams
from envace.policy.transformers_backend import TransformersBackend

GREEDY = SamplingParams(max_new_tokens=10, temperature=0)


def _next_turn(tiny: TransformersBackend, prompts: list[list[int]], gens) -> list[list[int]]:
    tail = tiny.tokenizer.encode(" and the tool answered: ok, 42 items", add_special_tokens=False)
    return [p + g.token_ids + tail for p, g in zip(prompts, gens)]


def _same(got, want) -> None:
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish == b.finish
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)


def test_a_later_turn_reuses_the_earlier_cache_and_generates_the_same(tiny, chat_prompts) -> None:
    prompts = [p for p in chat_prompts for _ in range(2)]
    plain = TransformersBackend(tiny.model, tiny.tokenizer, max_batch=4)
    reuse = TransformersBackend(tiny.model, tiny.tokenizer, max_batch=4, kv_reuse_tokens=100_000)
    first = plain.generate(prompts, GREEDY)
    _same(reuse.generate(prompts, GREEDY), first)
    assert reuse.kv_store.reused_tokens == 0 and len(reuse.kv_store) == len(prompts)
    second = _next_turn(tiny, prompts, first)
    # A third turn too, and one prompt whose earlier generation was re-tokenised differently:
    # only the tokens up to the first difference are reused.
    odd = second[0][: len(prompts[0]) + 2] + [7, 8, 9] + second[0][len(prompts[0]) + 2 :]
    want = plain.generate(second + [odd], GREEDY)
    before = reuse.kv_store.prompt_tokens
    _same(reuse.generate(second + [odd], GREEDY), want)
    reused = reuse.kv_store.reused_tokens
    # every row of the second turn skipped at least its first turn's prompt
    assert reused >= sum(len(p) for p in prompts) + len(prompts[0])
    assert reused < reuse.kv_store.prompt_tokens - before
    third = _next_turn(tiny, second, want)
    _same(reuse.generate(third, GREEDY), plain.generate(third, GREEDY))


def test_seeded_sampling_is_unchanged_by_reuse(tiny, chat_prompts) -> None:
    # A sharper tiny model (final norm x4) so float noise cannot move a draw (see test_prefix_sharing).
    model = copy.deepcopy(tiny.model)
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, seed=5)
    plain = TransformersBackend(model, tiny.tokenizer)
    reuse = TransformersBackend(model, tiny.tokenizer, kv_reuse_tokens=100_000)
    prompts = [p for p in chat_prompts for _ in range(3)]
    first = plain.generate(prompts, params)
    _same(reuse.generate(prompts, params), first)
    second = _next_turn(tiny, prompts, first)
    _same(reuse.generate(second, params), plain.generate(second, params))
    assert reuse.kv_store.reused_tokens > 0


def test_changed_weights_empty_the_store(tiny, chat_prompts) -> None:
    """A trainer stepping the model between turns: the old caches were computed by other weights,
    so none is reused, and the generations are the new weights' own (also from a bf16 copy)."""
    for dtype in (None, torch.bfloat16):
        model = copy.deepcopy(tiny.model)
        reuse = TransformersBackend(model, tiny.tokenizer, kv_reuse_tokens=100_000, dtype=dtype)
        first = reuse.generate(chat_prompts, GREEDY)
        assert len(reuse.kv_store) == len(chat_prompts)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        loss = model(torch.tensor([chat_prompts[0]])).logits.float().pow(2).mean()
        loss.backward()
        opt.step()
        second = _next_turn(tiny, chat_prompts, first)
        got = reuse.generate(second, GREEDY)
        assert reuse.kv_store.reused_tokens == 0
        fresh = TransformersBackend(model, tiny.tokenizer, dtype=dtype).generate(second, GREEDY)
        assert [g.token_ids for g in got] == [g.token_ids for g in fresh]


def test_the_store_keeps_within_its_budget_oldest_out_first() -> None:
    store = KVStore(max_tokens=100, min_reuse=4)
    layer = lambda n: [(torch.zeros(2, n, 3), torch.zeros(2, n, 3))]  # noqa: E731
    store.put(list(range(40)), layer(40))
    store.put(list(range(100, 140)), layer(40))
    store.put(list(range(200, 240)), layer(40))  # 120 > 100: the first goes
    assert store.tokens == 80 and len(store) == 2
    assert store.match(list(range(10)) + [999]) is None
    key, n = store.match(list(range(100, 130)) + [5])
    assert n == 30 and [t.shape for t in store.take(key, n)[0]] == [torch.Size([2, 30, 3])] * 2
    # the prompt keeps its last token for the forward that starts generation
    assert store.match(list(range(200, 240)))[1] == 39
    assert store.match(list(range(200, 203)) + [1]) is None  # below min_reuse
    store.put(list(range(500)), layer(500))  # larger than the whole budget: not kept
    assert len(store) == 2
    store.drop([key])
    assert store.tokens == 40


def test_a_call_reuses_only_when_every_prompt_can(tiny, chat_prompts) -> None:
    """A call mixing continued and new prompts runs as one fresh batch (two batches would decode
    twice); the stored caches stay for a later call."""
    reuse = TransformersBackend(tiny.model, tiny.tokenizer, kv_reuse_tokens=100_000)
    first = reuse.generate(chat_prompts[:2], GREEDY)
    new = list(range(1000, 1030))  # shares no prefix with anything stored
    mixed = _next_turn(tiny, chat_prompts[:2], first)[:1] + [new]
    plain = TransformersBackend(tiny.model, tiny.tokenizer)
    _same(reuse.generate(mixed, GREEDY), plain.generate(mixed, GREEDY))
    assert reuse.kv_store.reused_tokens == 0 and len(reuse.kv_store) == 4
    later = _next_turn(tiny, chat_prompts[:2], first)
    _same(reuse.generate(later, GREEDY), plain.generate(later, GREEDY))
    assert reuse.kv_store.reused_tokens >= len(chat_prompts[0]) + len(chat_prompts[1])


def test_identical_prompts_share_one_fresh_prefill_rather_than_short_reuse(tiny, chat_prompts) -> None:
    """Four copies of a prompt that matches a stored cache only in its first tokens: one fresh
    two-phase prefill runs the copies' shared prefix once, cheaper than four private rests."""
    reuse = TransformersBackend(tiny.model, tiny.tokenizer, kv_reuse_tokens=100_000)
    first = reuse.generate([chat_prompts[4]], GREEDY)
    copies = [chat_prompts[4][:20] + list(range(2000, 2060))] * 4  # shares 20 tokens with the stored row
    got = reuse.generate(copies, GREEDY)
    assert reuse.kv_store.reused_tokens == 0 and first
    _same(got, TransformersBackend(tiny.model, tiny.tokenizer).generate(copies, GREEDY))
