"""The transformers backend against first principles: batching must not change greedy output,
reported logprobs must be what a fresh forward pass says, and stops must cut where they say."""

from __future__ import annotations

import pytest
import torch

from envace.policy.backend import GenerationBackend
from envace.policy.loading import load_model
from envace.core.sampling import Generation, SamplingParams
from envace.policy.transformers_backend import TransformersBackend, first_stop_end, sample_rows

GREEDY = SamplingParams(max_new_tokens=24, temperature=0)


def recomputed_logprobs(backend: TransformersBackend, prompt: list[int], gen: Generation, temperature: float) -> torch.Tensor:
    """Log-probs of the generated tokens from one unpadded forward over prompt + generation."""
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = backend.model(ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def one_at_a_time(tiny: TransformersBackend, chat_prompts: list[list[int]]) -> list[Generation]:
    return [tiny.generate([p], GREEDY)[0] for p in chat_prompts]


def test_is_a_generation_backend(tiny: TransformersBackend) -> None:
    assert isinstance(tiny, GenerationBackend)


def test_greedy_batched_equals_one_at_a_time(
    tiny: TransformersBackend, chat_prompts: list[list[int]], one_at_a_time: list[Generation]
) -> None:
    for max_batch in (16, 2):  # one padded batch; several chunks
        backend = TransformersBackend(tiny.model, tiny.tokenizer, max_batch=max_batch)
        batched = backend.generate(chat_prompts, GREEDY)
        for got, want in zip(batched, one_at_a_time):
            assert got.token_ids == want.token_ids
            assert got.text == want.text
            torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-4, rtol=0)


def test_max_new_tokens_gives_length(one_at_a_time: list[Generation], tiny: TransformersBackend) -> None:
    for gen in one_at_a_time:
        assert gen.finish == "length"
        assert len(gen.token_ids) == len(gen.logprobs) == GREEDY.max_new_tokens
        assert gen.text == tiny.tokenizer.decode(gen.token_ids)


def test_greedy_logprobs_match_a_fresh_forward(
    tiny: TransformersBackend, chat_prompts: list[list[int]]
) -> None:
    for prompt, gen in zip(chat_prompts, tiny.generate(chat_prompts, GREEDY)):
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), recomputed_logprobs(tiny, prompt, gen, 1.0), atol=1e-4, rtol=0
        )


def test_sampled_logprobs_use_the_temperature(tiny: TransformersBackend, chat_prompts: list[list[int]]) -> None:
    params = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=5)
    for prompt, gen in zip(chat_prompts, tiny.generate(chat_prompts, params)):
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), recomputed_logprobs(tiny, prompt, gen, 0.7), atol=1e-4, rtol=0
        )


def _tokens_to_reach(backend: TransformersBackend, token_ids: list[int], stop: str) -> int:
    return next(k for k in range(1, len(token_ids) + 1) if stop in backend.tokenizer.decode(token_ids[:k]))


def test_stop_string_cuts_right_after_it_and_keeps_it(
    tiny: TransformersBackend, chat_prompts: list[list[int]], one_at_a_time: list[Generation]
) -> None:
    ref = one_at_a_time[0]
    text = ref.text
    # A stop string over several tokens that ends inside a token: the text is cut mid-token,
    # the token ids keep the token that completed the stop string.
    start = len(tiny.tokenizer.decode(ref.token_ids[:3]))
    end = len(tiny.tokenizer.decode(ref.token_ids[:7])) - 1
    stop = text[start:end]
    assert len(stop) > 3
    (gen,) = tiny.generate([chat_prompts[0]], SamplingParams(max_new_tokens=24, temperature=0, stop=[stop]))
    k = _tokens_to_reach(tiny, ref.token_ids, stop)
    assert gen.finish == "stop"
    assert gen.token_ids == ref.token_ids[:k]
    assert gen.logprobs == pytest.approx(ref.logprobs[:k], abs=1e-4)
    assert gen.text == text[: text.find(stop) + len(stop)]
    assert gen.text.endswith(stop)


def test_earliest_stop_string_wins(
    tiny: TransformersBackend, chat_prompts: list[list[int]], one_at_a_time: list[Generation]
) -> None:
    ref = one_at_a_time[1]
    late = ref.text[-6:]
    early = tiny.tokenizer.decode(ref.token_ids[2:4])
    params = SamplingParams(max_new_tokens=24, temperature=0, stop=[late, early])
    (gen,) = tiny.generate([chat_prompts[1]], params)
    assert gen.text == ref.text[: ref.text.find(early) + len(early)]
    assert first_stop_end("a</tool_call>b", ["b", "</tool_call>"]) == len("a</tool_call>")


def test_rows_that_stop_early_leave_the_others_unchanged(
    tiny: TransformersBackend, chat_prompts: list[list[int]], one_at_a_time: list[Generation]
) -> None:
    # Prompt 2 stops after a few tokens; the running rows must decode on exactly as alone.
    stop = tiny.tokenizer.decode(one_at_a_time[2].token_ids[3:5])
    params = SamplingParams(max_new_tokens=24, temperature=0, stop=[stop])
    alone = [tiny.generate([p], params)[0] for p in chat_prompts]
    batched = tiny.generate(chat_prompts, params)
    assert batched[2].finish == "stop" and len(batched[2].token_ids) <= 5
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    assert [g.finish for g in batched] == [g.finish for g in alone]


def test_eos_ends_a_row_and_stays_in_the_token_ids(chat_prompts: list[list[int]], one_at_a_time: list[Generation]) -> None:
    model, tok = load_model("tiny")  # a private model: its generation_config is changed below
    ref = one_at_a_time[3].token_ids
    k = next(i for i in range(2, len(ref)) if ref[i] not in ref[:i])
    model.generation_config.eos_token_id = [tok.eos_token_id, ref[k]]  # like Qwen's two EOS ids
    backend = TransformersBackend(model, tok)
    (gen,) = backend.generate([chat_prompts[3]], GREEDY)
    assert gen.finish == "stop"
    assert gen.token_ids == ref[: k + 1]
    assert gen.text == tok.decode(ref[:k])


def test_seeds_reproduce_and_rows_draw_independently(tiny: TransformersBackend, chat_prompts: list[list[int]]) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
    first = tiny.generate(chat_prompts, params)
    again = tiny.generate(chat_prompts, params)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    other = tiny.generate(chat_prompts, SamplingParams(max_new_tokens=12, temperature=1.0, seed=12))
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    # GRPO samples G copies of one prompt: each copy must be its own draw.
    copies = tiny.generate([chat_prompts[0]] * 4, params)
    assert len({tuple(g.token_ids) for g in copies}) == 4
    # Chunking the batch differently does not change any row's draw.
    chunked = TransformersBackend(tiny.model, tiny.tokenizer, max_batch=2).generate(chat_prompts, params)
    assert [g.token_ids for g in chunked] == [g.token_ids for g in first]


def test_tiny_top_p_is_greedy(
    tiny: TransformersBackend, chat_prompts: list[list[int]], one_at_a_time: list[Generation]
) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=1e-6, seed=0)
    got = tiny.generate(chat_prompts[:2], params)
    assert [g.token_ids for g in got] == [g.token_ids for g in one_at_a_time[:2]]


def test_top_p_samples_only_from_the_nucleus_in_proportion() -> None:
    probs = torch.tensor([[0.1, 0.5, 0.3, 0.1]]).repeat(4000, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(len(probs))]
    counts = torch.bincount(sample_rows(probs, 0.7, gens), minlength=4)
    assert counts[0] == counts[3] == 0  # 0.5 + 0.3 reaches 0.7: the 0.1s are cut
    assert abs(counts[1] / counts.sum() - 0.5 / 0.8) < 0.03
    full = torch.bincount(sample_rows(probs, 1.0, gens), minlength=4) / len(probs)
    torch.testing.assert_close(full, probs[0], atol=0.03, rtol=0)


def test_generation_leaves_train_mode_and_rejects_empty_prompts(
    tiny: TransformersBackend, chat_prompts: list[list[int]]
) -> None:
    tiny.model.train()
    try:
        tiny.generate([chat_prompts[0]], SamplingParams(max_new_tokens=2, temperature=0))
        assert tiny.model.training
    finally:
        tiny.model.eval()
    with pytest.raises(ValueError, match="empty"):
        tiny.generate([chat_prompts[0], []], GREEDY)
    assert tiny.generate([], GREEDY) == []


def test_generates_with_a_peft_model(chat_prompts: list[list[int]]) -> None:
    from peft import LoraConfig, get_peft_model

    model, tok = load_model("tiny:4")
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    backend = TransformersBackend(peft_model, tok)
    prompts = chat_prompts[:2]
    for prompt, gen in zip(prompts, backend.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0))):
        torch.testing.assert_close(
            torch.tensor(gen.logprobs), recomputed_logprobs(backend, prompt, gen, 1.0), atol=1e-4, rtol=0
        )


def test_a_bf16_backend_samples_from_a_cast_copy_that_follows_the_trained_weights(
    tiny: TransformersBackend, chat_prompts: list[list[int]]
) -> None:
    import copy

    model = copy.deepcopy(tiny.model)  # stepped below; the session fixture stays as it was
    full = TransformersBackend(model, tiny.tokenizer)
    low = TransformersBackend(model, tiny.tokenizer, dtype=torch.bfloat16)
    sampled = SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    got = low.generate(chat_prompts, sampled)
    # The trainer's model is untouched; generation ran on a bf16 copy whose buffers (rotary
    # frequencies) kept their precision.
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert low._low is not None and all(p.dtype == torch.bfloat16 for p in low._low.parameters())
    assert all(b.dtype == b0.dtype for b, b0 in zip(low._low.buffers(), model.buffers()))
    # Its log-probs are the bf16 model's: close to the fp32 model's scores of the same tokens, not equal.
    gaps = torch.cat([(torch.tensor(g.logprobs) - recomputed_logprobs(full, p, g, 1.0)).abs()
                      for p, g in zip(chat_prompts, got)])
    assert 0 < gaps.mean() < 0.05, gaps.mean()

    # A trainer steps the fp32 model in place: the next generate() samples from the new weights.
    target = 42
    with torch.no_grad():
        model.get_output_embeddings().weight[target] += 50.0
    after = low.generate(chat_prompts, GREEDY)
    assert all(set(g.token_ids) == {target} for g in after)
