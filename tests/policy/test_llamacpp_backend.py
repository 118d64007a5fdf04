"""The llama.cpp rollout backend against the reference transformers backend, on real tiny models
written to real GGUF files and run by the real engine (ik-llama-cpp-python)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from envace.core.sampling import SamplingParams
from envace.policy.loading import load_model
from envace.policy.transformers_backend import TransformersBackend

pytest.importorskip("ik_llama_cpp", reason="the llamacpp extra is not installed")
pytest.importorskip("gguf")

from envace.policy.llamacpp_backend import LlamaCppBackend, quantize_blocks  # noqa: E402

GREEDY = SamplingParams(max_new_tokens=10, temperature=0)
TEXTS = ["Hello there, how are you", "The capital of France is", "1 2 3 4", "The capital of France is"]


def _prompts(tok):
    return [tok.encode(t) for t in TEXTS]


def _llama(tok, model, quant="F32", **kw):
    return LlamaCppBackend(tok, model, quant=quant, **{"n_ctx": 512, "max_batch": 4, "n_threads": 1, **kw})


def test_f32_gguf_greedy_tokens_and_logprobs_match_transformers():
    model, tok = load_model("tiny")
    prompts = _prompts(tok)
    ref = TransformersBackend(model, tok).generate(prompts, GREEDY)
    out = _llama(tok, model).generate(prompts, GREEDY)
    for r, o in zip(ref, out):
        assert o.token_ids == r.token_ids
        assert o.text == r.text and o.finish == r.finish
        assert np.allclose(o.logprobs, r.logprobs, atol=2e-2)


def test_bf16_gguf_greedy_tokens_match_transformers_bf16():
    model, tok = load_model("llama:64x2")
    prompts = _prompts(tok)
    ref = TransformersBackend(model, tok, dtype=torch.bfloat16).generate(prompts, GREEDY)
    ref32 = TransformersBackend(model, tok).generate(prompts, GREEDY)
    out = _llama(tok, model, "BF16").generate(prompts, GREEDY)
    for r, r32, o in zip(ref, ref32, out):
        assert o.token_ids == r.token_ids
        assert np.allclose(o.logprobs, r32.logprobs, atol=2e-2)


def test_rows_decoded_together_equal_rows_alone_and_seeds_reproduce():
    model, tok = load_model("tiny")
    prompts = _prompts(tok)
    backend = _llama(tok, model)
    together = backend.generate(prompts, GREEDY)
    alone = [backend.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    sampled = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    a, b = backend.generate(prompts, sampled), backend.generate(prompts, sampled)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert a[1].token_ids != a[3].token_ids  # the same prompt at another index: its own stream
    # the sampled token's log-prob is log_softmax(logits / T) at that token: never above 0
    assert all(lp <= 0 for g in a for lp in g.logprobs)


def test_stop_string_and_length_follow_the_transformers_rules():
    model, tok = load_model("tiny")
    prompts = _prompts(tok)
    free = _llama(tok, model).generate(prompts[:1], GREEDY)[0]
    stop = free.text[3:6]  # some text the row is known to produce
    params = SamplingParams(max_new_tokens=10, temperature=0, stop=[stop])
    ref = TransformersBackend(model, tok).generate(prompts[:1], params)[0]
    out = _llama(tok, model).generate(prompts[:1], params)[0]
    assert (out.token_ids, out.text, out.finish) == (ref.token_ids, ref.text, ref.finish) and out.finish == "stop"
    assert free.finish == "length" and len(free.token_ids) == GREEDY.max_new_tokens


def test_weight_sync_carries_changed_and_lora_weights():
    from peft import LoraConfig, get_peft_model

    model, tok = load_model("tiny")
    prompts = _prompts(tok)
    backend = _llama(tok, model)
    before = backend.generate(prompts, GREEDY)
    with torch.no_grad():  # an update in place, as an optimiser step: the first layer's MLP
        model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
    assert backend.sync_weights(model) > 0
    after = backend.generate(prompts, GREEDY)
    ref = TransformersBackend(model, tok).generate(prompts, GREEDY)
    assert [g.token_ids for g in after] == [g.token_ids for g in ref]
    assert [g.token_ids for g in after] != [g.token_ids for g in before]

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    backend.sync_weights(peft_model)
    lora = backend.generate(prompts, GREEDY)
    ref = TransformersBackend(peft_model, tok).generate(prompts, GREEDY)
    assert [g.token_ids for g in lora] == [g.token_ids for g in ref]
    assert [g.token_ids for g in lora] != [g.token_ids for g in after]
    # again: new merged tensors (they may reuse the old ones' memory), and a write through .data
    # (the autograd version counter does not see it) to a frozen weight, which must not be reused
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)
    peft_model.base_model.model.model.embed_tokens.weight.data.mul_(-1.0)
    backend.sync_weights(peft_model)
    again = backend.generate(prompts, GREEDY)
    ref = TransformersBackend(peft_model, tok).generate(prompts, GREEDY)
    assert [g.token_ids for g in again] == [g.token_ids for g in ref]
    assert [g.token_ids for g in again] != [g.token_ids for g in lora]
    assert backend.syncs == 4


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1"])
def test_block_quantisation_is_ggufs_bit_for_bit(kind):
    from gguf import GGMLQuantizationType, quants

    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    x[0, :32] = 0.0  # an all-zero block
    x[1, :32] = 0.5  # a constant block
    assert np.array_equal(quantize_blocks(x, kind), quants.quantize(x.numpy(), GGMLQuantizationType[kind]))


def test_quantised_engine_samples_close_to_the_trainer():
    model, tok = load_model("tiny")
    prompts = _prompts(tok)
    out = _llama(tok, model, "Q8_0").generate(prompts, GREEDY)
    ref = TransformersBackend(model, tok).generate(prompts, GREEDY)
    # the first token comes from the same prompt: its log-prob differs by quantisation only
    assert all(abs(o.logprobs[0] - r.logprobs[0]) < 0.5 for o, r in zip(out, ref))
    assert all(o.token_ids[0] == r.token_ids[0] for o, r in zip(out, ref))


def test_without_the_binding_the_error_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ik_llama_cpp'] = None\n"
            "from envace.policy.llamacpp_backend import LlamaCppBackend\n"
            "try:\n    LlamaCppBackend(None)\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'envace[llamacpp]'" in done.stdout, done.stderr[-2000:]


def test_truncated_importance_weight_scales_each_tokens_loss():
    """With the trainer scoring the rollouts itself (old_logprobs "current"), each token's loss is
    weighted by min(exp(trainer - rollout), cap): an engine that gave the tokens far lower
    probability than the trainer's policy is capped at ``cap``; the same log-probs weigh 1."""
    from envace.core.types import TurnSample
    from envace.train.advantages import ScoredSample
    from envace.train.forward import batch_loss, recompute_logprobs
    from envace.train.loss_support import truncated_is_weight

    model, tok = load_model("tiny")
    samples = [TurnSample(role="caller", group_id="t", trajectory_index=i, turn=0, prompt_ids=tok.encode(text),
                          gen_ids=[42, 7, 99], logprobs=[0.0] * 3)
               for i, text in enumerate(TEXTS[:2])]
    recompute_logprobs(model, samples)  # the trainer's own log-probs
    trainer = [list(s.logprobs) for s in samples]
    scored = [ScoredSample(sample=s, advantage=a, reward=0.0) for s, a in zip(samples, (1.0, -0.5))]

    def loss(shift, cap):
        for s, lp in zip(samples, trainer):
            s.logprobs = [v + shift for v in lp]
        value, stats = batch_loss(model, scored, old_logprobs="current", is_cap=cap, with_entropy=False)
        return float(value.detach()), stats

    plain, stats = loss(0.0, None)
    same, same_stats = loss(0.0, 2.0)
    low, low_stats = loss(-10.0, 2.0)
    high, high_stats = loss(+10.0, 2.0)
    assert same == pytest.approx(plain, rel=1e-5) and same_stats["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert low == pytest.approx(2.0 * plain, rel=1e-5) and low_stats["is_capped"] == 1.0  # weight capped at 2
    assert high == pytest.approx(float(np.exp(-10.0)) * plain, rel=1e-3)  # an engine surer than the trainer
    assert low_stats["rollout_kl"] == pytest.approx(-10.0, abs=1e-4) and abs(stats["rollout_kl"]) < 1e-4
    # off the mask, and where the engine gave no log-prob, the weight is 1
    w = truncated_is_weight(torch.tensor([[0.0, -1.0, 0.0]]), torch.tensor([[-5.0, float("nan"), -5.0]]),
                            torch.tensor([[True, True, False]]), 3.0)
    assert w.tolist() == [[3.0, 1.0, 1.0]]


def test_the_rollout_backend_setting_builds_a_synced_llamacpp_engine(tmp_path):
    """rollout.backend llamacpp: the caller's engine is llama.cpp, one engine for both roles in
    share mode, its weights pushed by the run's pusher; the trainer rescores its log-probs."""
    from envace.experiments.config import parse_config
    from envace.experiments.rollout_backends import rollout_backends

    model, tok = load_model("tiny")
    models = type("Models", (), {"trained": {"policy": model}, "for_role": lambda self, r: model})()
    cfg = parse_config({"model": "tiny", "rollout": {"backend": "llamacpp", "llamacpp_quant": "F32",
                                                     "llamacpp_ctx": 1024, "max_batch": 4}})
    assert cfg.grpo.is_cap == 2.0 and cfg.rollout.recomputes_logprobs
    backends = rollout_backends(cfg, models, model, tok, "cpu", tmp_path)
    assert isinstance(backends.caller, LlamaCppBackend) and backends.simulator is backends.caller
    assert backends.recompute and len(backends.pushers) == 1
    backends.sync()
    assert backends.caller.syncs == 1 and backends.caller.path.parent.parent == tmp_path / "sync"
    prompts = _prompts(tok)
    ref = TransformersBackend(model, tok).generate(prompts, GREEDY)
    assert [g.token_ids for g in backends.caller.generate(prompts, GREEDY)] == [g.token_ids for g in ref]


def test_a_row_longer_than_the_context_is_refused_by_name():
    model, tok = load_model("tiny")
    backend = LlamaCppBackend(tok, model, quant="F32", n_ctx=256, max_batch=2, n_threads=1)
    with pytest.raises(ValueError, match="llamacpp_ctx"):
        backend.generate([[5] * 250], GREEDY)
    with pytest.raises(RuntimeError, match="sync_weights"):
        LlamaCppBackend(tok, n_threads=1).generate([[5]], GREEDY)


def test_q4_1_prompts_of_32_tokens_and_more_decode_correctly():
    """ik_llama.cpp's Q4_1 kernel for 32+ token batches gives wrong logits; the backend feeds Q4_1
    engines smaller pieces, so a long prompt's next token is the trainer's (it was not before)."""
    model, tok = load_model("tiny")
    prompt = tok.encode(" ".join(["The capital of France is Paris and the capital of Spain is Madrid."] * 4))[:48]
    one = SamplingParams(max_new_tokens=1, temperature=0)
    ref = TransformersBackend(model, tok).generate([prompt], one)[0]
    out = _llama(tok, model, "Q4_1").generate([prompt] * 2, one)
    assert all(o.token_ids == ref.token_ids for o in out)


def test_rows_of_different_lengths_decode_together_for_many_tokens():
    """Several sequences in one context, past a few dozen positions (ik_llama.cpp's flash
    attention aborted or attended wrongly here; the backend runs without it)."""
    model, tok = load_model("tiny")
    prompts = [tok.encode(t) for t in TEXTS[:3]]
    params = SamplingParams(max_new_tokens=48, temperature=0)
    backend = _llama(tok, model)
    ref = TransformersBackend(model, tok).generate(prompts, params)
    out = backend.generate(prompts, params)
    assert [g.token_ids for g in out] == [g.token_ids for g in ref]
    assert all(np.allclose(o.logprobs, r.logprobs, atol=2e-2) for o, r in zip(out, ref))


def test_a_llamacpp_run_evaluates_on_llamacpp_unless_told_otherwise(tmp_path, monkeypatch):
    """eval.backend auto: a run whose rollouts are on llama.cpp also evaluates there (its step-0,
    mid and final evals, real and rehearsal-judged), so no episode of the run generates on
    transformers; eval.backend transformers sends the evals back to the trainer's model."""
    from envace.experiments.config import parse_config
    from envace.experiments.train_job import train

    def refuse(self, prompts, params):
        raise AssertionError("generated on transformers")

    monkeypatch.setattr(TransformersBackend, "generate", refuse)
    base = {"model": "tiny", "worlds": ["shop"], "difficulties": [1], "tool_distractors": 0, "steps": 1,
            "tasks_per_step": 1, "group_size": 2, "sft": {"enabled": False}, "lora": {"enabled": True, "r": 2},
            "rollout": {"max_turns": 2, "caller_max_new_tokens": 6, "simulator_max_new_tokens": 6, "max_batch": 4,
                        "backend": "llamacpp", "llamacpp_quant": "F32", "llamacpp_ctx": 4096},
            "prompt": {"max_examples": 1}, "eval": {"tasks": 2, "every": 0}, "checkpoint": {"every": 1}}
    run = train(parse_config({**base, "out": str(tmp_path / "a")}), log=lambda *_: None)
    evals = [r for r in run.metrics() if r.get("phase") == "eval"]
    assert [r["step"] for r in evals] == [0, 1] and all("eval/rehearsal_success" in r for r in evals)
    with pytest.raises(AssertionError, match="generated on transformers"):
        train(parse_config({**base, "eval": {**base["eval"], "backend": "transformers"}, "out": str(tmp_path / "b")}),
              log=lambda *_: None)


def test_prompts_that_share_a_prefix_prefill_it_once_and_decode_as_alone():
    """A later turn's prompts all start with the first turn's: the shared part is prefilled once
    (its cells shared), and every row's tokens and log-probs are the reference's, prefixes and
    strict prefixes of other prompts included."""
    model, tok = load_model("tiny")
    head = tok.encode("The capital of France is Paris, and the capital of Spain is")
    tails = [tok.encode(" Madrid. Next"), tok.encode(" Madrid, of course"), tok.encode(" a city")]
    prompts = [head + tails[0], head, head + tails[1], head + tails[0] + tok.encode(" question"), head + tails[2],
               head + tails[1]]
    params = SamplingParams(max_new_tokens=20, temperature=0)
    ref = TransformersBackend(model, tok).generate(prompts, params)
    # Some rows end early (a stop string one of them writes): the rows still decoding keep their
    # shared prefix (ik_llama.cpp freed shared cells with the ended row's; the rest then went wrong).
    stop = next(t for t in (tok.decode(ref[2].token_ids[k:k + 1]) for k in range(2, 20)) if t.strip())
    params = SamplingParams(max_new_tokens=20, temperature=0, stop=[stop])
    ref = TransformersBackend(model, tok).generate(prompts, params)
    assert {g.finish for g in ref} == {"stop", "length"}, "the test needs rows that end early and rows that do not"
    backend = _llama(tok, model, max_batch=8)
    out = backend.generate(prompts, params)
    assert [g.token_ids for g in out] == [g.token_ids for g in ref]
    assert all(np.allclose(o.logprobs, r.logprobs, atol=2e-2) for o, r in zip(out, ref))
    assert backend.prefilled < sum(map(len, prompts)) - 4 * len(head) + 6  # the head once, not six times
