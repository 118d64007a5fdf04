"""Speed work on the decode loop must not change what it samples: the tiny model's greedy and
seeded outputs equal those recorded from the loop before it (data/tiny_generation_reference.json),
greedy equals Hugging Face ``generate``, the bf16 one-row matrix-vector path equals the plain one,
and ``on_tokens`` sees every sampled token as it is sampled.

Re-record the reference only for a deliberate change of sampling:
``python tests/policy/test_generation_reference.py --record``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from envace.core.sampling import SamplingParams
from envace.policy.loading import load_model
from envace.policy.transformers_backend import TransformersBackend

REFERENCE = Path(__file__).parent / "data" / "tiny_generation_reference.json"
QUESTIONS = [
    "Hi",
    "What is the capital of France? Tell me more about its history, please.",
    "List three tools you could call to cancel an order.",
    "Why?",
    "Summarise the weather forecast for Paris and Berlin over the next three days in one line.",
]


def _prompts(tokenizer) -> list[list[int]]:
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               return_dict=False)) for q in QUESTIONS]


def reference_cases(backend: TransformersBackend) -> dict[str, tuple[list[list[int]], SamplingParams]]:
    """The recorded cases: greedy and seeded sampling, batched and alone, G copies, stop strings."""
    p = _prompts(backend.tokenizer)
    greedy = SamplingParams(max_new_tokens=40, temperature=0)
    # a stop string over two tokens of the greedy output: rows stop at different steps
    stop = backend.tokenizer.decode(backend.generate(p, greedy)[2].token_ids[5:7])
    return {
        "greedy": (p, greedy),
        "greedy_one": ([p[1]], greedy),
        "sample_t1": (p, SamplingParams(max_new_tokens=40, temperature=1.0, seed=7)),
        "sample_topp": (p, SamplingParams(max_new_tokens=40, temperature=0.7, top_p=0.9, seed=3)),
        "sample_group": ([p[2]] * 4 + [p[0]] * 3, SamplingParams(max_new_tokens=30, temperature=1.0, seed=11)),
        "sample_one": ([p[4]], SamplingParams(max_new_tokens=40, temperature=1.0, seed=1)),
        "greedy_stop": (p, SamplingParams(max_new_tokens=40, temperature=0, stop=[stop])),
        "sample_stop": (p, SamplingParams(max_new_tokens=40, temperature=1.0, seed=7, stop=[" the", "."])),
    }


def _run(backend: TransformersBackend) -> dict[str, list[dict]]:
    return {name: [{"token_ids": g.token_ids, "finish": g.finish, "text": g.text} for g in backend.generate(*case)]
            for name, case in reference_cases(backend).items()}


@pytest.fixture(scope="module")
def fresh() -> TransformersBackend:
    model, tok = load_model("tiny")
    return TransformersBackend(model, tok)


@pytest.fixture(scope="module")
def cases(fresh: TransformersBackend) -> dict[str, tuple[list[list[int]], SamplingParams]]:
    return reference_cases(fresh)


RECORDED = json.loads(REFERENCE.read_text())["cases"]


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_outputs_equal_the_recorded_reference(fresh: TransformersBackend, cases, name: str) -> None:
    assert sorted(cases) == sorted(RECORDED)
    got = [{"token_ids": g.token_ids, "finish": g.finish, "text": g.text} for g in fresh.generate(*cases[name])]
    assert got == RECORDED[name]


def test_greedy_equals_hugging_face_generate(fresh: TransformersBackend) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=0)
    for prompt in _prompts(fresh.tokenizer)[:3]:
        (mine,) = fresh.generate([prompt], params)
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            hf = fresh.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                                      pad_token_id=fresh.pad_id, eos_token_id=sorted(fresh.eos_ids))
        assert mine.token_ids == hf[0, len(prompt):].tolist()


def test_bf16_one_row_matvec_samples_what_the_plain_path_samples(fresh: TransformersBackend) -> None:
    low = TransformersBackend(fresh.model, fresh.tokenizer, dtype=torch.bfloat16)
    p = _prompts(fresh.tokenizer)
    cases = [([p[1]], SamplingParams(max_new_tokens=32, temperature=0)),  # one row: every step is a matvec
             (p, SamplingParams(max_new_tokens=32, temperature=1.0, seed=4, stop=["."]))]  # the last row runs alone
    for prompts, params in cases:
        low.one_row_matvec = True
        fast = low.generate(prompts, params)
        assert all("forward" not in m.__dict__ for m in low._generating_model().modules())  # swap undone
        low.one_row_matvec = False
        plain = low.generate(prompts, params)
        assert [g.token_ids for g in fast] == [g.token_ids for g in plain]
        for a, b in zip(fast, plain):
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-3, rtol=0)


def test_on_tokens_sees_every_token_of_every_row_in_order(fresh: TransformersBackend) -> None:
    p = _prompts(fresh.tokenizer)
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=2, stop=["."])
    seen: dict[int, tuple[list[int], list[float]]] = {}
    calls: list[int] = []

    def on_tokens(row: int, token_ids: list[int], logprobs: list[float]) -> None:
        ids, lps = seen.setdefault(row, ([], []))
        ids.extend(token_ids)
        lps.extend(logprobs)
        calls.append(row)

    gens = TransformersBackend(fresh.model, fresh.tokenizer, max_batch=2).generate(p, params, on_tokens=on_tokens)
    assert [g.token_ids for g in gens] == [g.token_ids for g in fresh.generate(p, params)]  # the hook changes nothing
    assert sorted(seen) == list(range(len(p)))
    for row, gen in enumerate(gens):
        assert seen[row] == (gen.token_ids, gen.logprobs)
    assert len(calls) == sum(len(g.token_ids) for g in gens)  # one call per row and step


def test_an_exception_in_on_tokens_ends_the_call(fresh: TransformersBackend) -> None:
    class Stop(Exception):
        pass

    def on_tokens(row: int, token_ids: list[int], logprobs: list[float]) -> None:
        raise Stop

    prompt = _prompts(fresh.tokenizer)[0]
    low = TransformersBackend(fresh.model, fresh.tokenizer, dtype=torch.bfloat16)
    low.one_row_matvec = True
    fresh.model.train()
    try:
        with pytest.raises(Stop):
            low.generate([prompt], SamplingParams(max_new_tokens=8, temperature=0), on_tokens=on_tokens)
        assert fresh.model.training and all("forward" not in m.__dict__ for m in low._generating_model().modules())
    finally:
        fresh.model.eval()
    assert low.generate([prompt], SamplingParams(max_new_tokens=4, temperature=0))[0].finish == "length"


def _record() -> None:
    model, tok = load_model("tiny")
    cases = _run(TransformersBackend(model, tok))
    REFERENCE.write_text(json.dumps({"recorded_from": "tests/policy/test_generation_reference.py --record",
                                     "cases": cases}, separators=(",", ":")))
    print(f"wrote {REFERENCE}")


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    torch.set_num_threads(1)
    _record()
