"""VLLMBackend logic that needs no GPU: parameter mapping, output conversion, the state dict sent
to vLLM (LoRA merge, names), weight-sync routing, and the backend wired to a stand-in ``vllm``.
vLLM itself is not installed here; the stand-ins have the shapes of its objects."""

from __future__ import annotations

import copy
import math
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from envace.policy import vllm_backend as vb
from envace.core.sampling import SamplingParams


@dataclass
class Logprob:  # vllm.sequence.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


def _as_vllm(gen, finish_reason: str, stop_reason=None) -> RequestOutput:
    lps = [{t: Logprob(lp, rank=1)} for t, lp in zip(gen.token_ids, gen.logprobs)]
    out = CompletionOutput(0, "vllm's own text", list(gen.token_ids), sum(gen.logprobs), lps, finish_reason,
                           stop_reason)
    return RequestOutput("r0", [1], [out])


def test_module_imports_without_vllm_and_names_the_extra():
    assert "vllm" not in sys.modules
    with pytest.raises(ImportError, match=r"pip install 'envace\[vllm\]'"):
        vb.VLLMBackend(model="/nonexistent")


def test_sampling_params_mapping():
    greedy = vb.vllm_sampling_kwargs(SamplingParams(max_new_tokens=7, temperature=0.0, stop=["</tool_call>"]), 5)
    assert greedy == {"n": 1, "max_tokens": 7, "temperature": 0.0, "top_p": 1.0, "logprobs": 0,
                      "include_stop_str_in_output": True, "skip_special_tokens": False, "detokenize": True,
                      "stop": ["</tool_call>"]}  # greedy: no seed
    sampled = SamplingParams(max_new_tokens=3, temperature=0.7, top_p=0.9, seed=11)
    kw = vb.vllm_sampling_kwargs(sampled, 123)
    assert kw["seed"] == 123 and kw["temperature"] == 0.7 and kw["top_p"] == 0.9 and "stop" not in kw
    seeds = vb.per_prompt_seeds(sampled, 4)
    assert len(set(seeds)) == 4 and seeds == [vb.row_seed(11, i) for i in range(4)]
    assert vb.per_prompt_seeds(SamplingParams(seed=None), 3) == [None] * 3


@pytest.mark.parametrize("case", ["eos", "stop_string", "length"])
def test_output_conversion_matches_the_transformers_backend(tiny_backend, case):
    """A vLLM output with the tokens the in-process backend sampled converts to the same Generation."""
    tok = tiny_backend.tokenizer
    prompt = list(tok("The order o-17 was", add_special_tokens=False)["input_ids"])
    base = tiny_backend.generate([prompt], SamplingParams(max_new_tokens=10, temperature=0.0))[0]
    if case == "eos":
        from envace.core.sampling import Generation

        ids = base.token_ids[:4] + [tok.eos_token_id]
        lps = [-0.1 * (i + 1) for i in range(len(ids))]
        gen = Generation(token_ids=ids, logprobs=lps, text=tok.decode(ids[:-1]), finish="stop")
        params = SamplingParams(max_new_tokens=10, temperature=0.0)
        out = _as_vllm(gen, "stop", None)
    elif case == "stop_string":
        stop = base.text[2:4]
        params = SamplingParams(max_new_tokens=10, temperature=0.0, stop=[stop])
        gen = tiny_backend.generate([prompt], params)[0]
        assert gen.finish == "stop"
        out = _as_vllm(gen, "stop", stop)
    else:
        params = SamplingParams(max_new_tokens=10, temperature=0.0)
        gen = base
        out = _as_vllm(gen, "length")
    converted = vb.generation_from_output(out, params, tok, {tok.eos_token_id})
    assert converted.token_ids == gen.token_ids
    assert converted.text == gen.text
    assert converted.finish == gen.finish
    assert converted.logprobs == pytest.approx(gen.logprobs)


def test_output_conversion_edge_cases(tiny_backend):
    tok = tiny_backend.tokenizer
    params = SamplingParams(max_new_tokens=4)
    no_lp = CompletionOutput(0, "", [5, 6], None, None, "length")
    assert all(math.isnan(v) for v in vb.generation_from_output(no_lp, params, tok).logprobs)
    with pytest.raises(RuntimeError, match="abort"):
        vb.generation_from_output(CompletionOutput(0, "", [5], None, None, "abort"), params, tok)
    # A stop token id other than EOS (vLLM's stop_reason is then that id): kept in ids, not in text.
    out = CompletionOutput(0, "", [5, 6, 7], None, [{5: Logprob(-1.0)}, {6: Logprob(-2.0)}, {7: Logprob(-3.0)}],
                           "stop", 7)
    g = vb.generation_from_output(out, params, tok)
    assert g.token_ids == [5, 6, 7] and g.logprobs == [-1.0, -2.0, -3.0] and g.text == tok.decode([5, 6])


# ---------------------------------------------------------------------------- state dict / sync


def _tiny():
    from envace.policy.loading import load_model

    return load_model("tiny")[0]


def _lora(model, **kw):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM", **kw)
    peft_model = get_peft_model(model, cfg)
    torch.manual_seed(1)
    with torch.no_grad():  # as after training: B != 0, so the merge matters
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return peft_model


def test_state_dict_of_plain_and_wrapped_models():
    model = _tiny()
    names = set(model.state_dict()) - {"lm_head.weight"}  # tied to the embeddings: sent once
    assert set(vb.vllm_state_dict(model)) == names

    class Wrapper(torch.nn.Module):  # DDP-style "module." prefix
        def __init__(self, m):
            super().__init__()
            self.module = m

    wrapped = vb.vllm_state_dict(Wrapper(model))
    assert set(wrapped) == names
    assert all(wrapped[k].data_ptr() == v.data_ptr() for k, v in model.state_dict().items() if k in names)  # no copies
    assert vb.clean_param_name("module._orig_mod.model._fsdp_wrapped_module.layers.0._checkpoint_wrapped_module."
                               "mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"


def test_lora_is_merged_out_of_place_under_hf_names():
    base = _tiny()
    names = set(base.state_dict()) - {"lm_head.weight"}
    peft_model = _lora(base, modules_to_save=["norm"])
    with torch.no_grad():
        peft_model.base_model.model.model.norm.modules_to_save["default"].weight.add_(0.25)
    before = {k: v.clone() for k, v in peft_model.state_dict().items()}
    merged = vb.vllm_state_dict(peft_model)
    assert set(merged) == names  # exactly the checkpoint's names: no lora_*, base_layer, original_module
    reference = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    for k in names:
        torch.testing.assert_close(merged[k], reference[k], rtol=1e-5, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(merged[q], before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    assert torch.equal(merged["model.norm.weight"], before["base_model.model.model.norm.modules_to_save.default.weight"])
    after = peft_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the trainer's weights are untouched


class _LoadableModel(torch.nn.Module):
    """Stands in for vLLM's model: ``load_weights(iterable of (name, tensor))`` by HF names."""

    def __init__(self, hf_model) -> None:
        super().__init__()
        self.hf = hf_model
        self.loaded: list[str] = []

    def load_weights(self, weights):
        params = dict(self.hf.named_parameters())
        buffers = dict(self.hf.named_buffers())
        with torch.no_grad():
            for name, tensor in weights:
                target = params.get(name, buffers.get(name))
                if target is None:
                    raise KeyError(name)
                target.copy_(tensor)
                self.loaded.append(name)
        return set(self.loaded)


@dataclass
class _FakeLLM:
    """``llm.llm_engine.model_executor.driver_worker.worker.model_runner.model`` (vLLM V1, in process)."""

    model: Any
    resets: int = 0
    llm_engine: Any = field(init=False)

    def __post_init__(self) -> None:
        runner = types.SimpleNamespace(model=self.model)
        worker = types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=runner))
        self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(driver_worker=worker))

    def reset_prefix_cache(self) -> None:
        self.resets += 1


def test_sync_makes_the_engine_model_compute_the_trained_policy():
    trained = _lora(_tiny())
    engine_model = _LoadableModel(_tiny().eval())  # the engine starts from the base weights
    llm = _FakeLLM(engine_model)
    sent = vb.load_weights_into(llm, vb.vllm_state_dict(trained), bucket_bytes=1 << 20)
    assert sent == len(set(_tiny().state_dict())) - 1 and llm.resets == 1  # lm_head is tied
    ids = torch.tensor([[1, 5, 9, 200, 31]])
    with torch.no_grad():
        want = trained.eval()(input_ids=ids).logits
        got = engine_model.hf(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_sync_through_apply_model_when_the_engine_is_in_worker_processes():
    calls = []

    class WorkerLLM:  # no in-process model: only LLM.apply_model (runs the function in each worker)
        def __init__(self):
            self.model = _LoadableModel(_tiny())

        def apply_model(self, fn):
            calls.append(fn)
            return [fn(self.model)]

        def reset_prefix_cache(self):
            calls.append("reset")

    llm = WorkerLLM()
    weights = {"model.norm.weight": torch.full((64,), 2.0), "model.layers.0.input_layernorm.weight": torch.ones(64)}
    assert vb.load_weights_into(llm, weights, bucket_bytes=300) == 2
    assert len(calls) == 3 and calls[-1] == "reset"  # 2 buckets of < 300 bytes, then the cache reset
    assert torch.equal(llm.model.hf.model.norm.weight, torch.full((64,), 2.0))


def test_iter_buckets_bounds_size():
    tensors = [(f"w{i}", torch.zeros(100)) for i in range(5)]  # 400 bytes each
    assert [len(b) for b in vb.iter_buckets(tensors, bucket_bytes=1000)] == [2, 2, 1]
    assert [len(b) for b in vb.iter_buckets(tensors, bucket_bytes=1)] == [1] * 5


# ---------------------------------------------------------------------------- the backend, stand-in vllm


def test_backend_with_a_stand_in_vllm(monkeypatch, tiny_backend):
    """VLLMBackend wired end to end against an object shaped like vllm.LLM: token-id prompts,
    per-prompt seeded SamplingParams, results converted in prompt order, weight sync."""
    tok = tiny_backend.tokenizer
    seen: dict[str, Any] = {}

    class SamplingParamsStub:
        def __init__(self, **kw):
            self.kw = kw

    class LLMStub:
        def __init__(self, model, **kw):
            seen["init"] = {"model": model, **kw}
            self.engine_model = _LoadableModel(_tiny())
            self.resets = 0
            runner = types.SimpleNamespace(model=self.engine_model)
            self.llm_engine = types.SimpleNamespace(
                model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner)),
                model_config=types.SimpleNamespace(try_get_generation_config=lambda: {"eos_token_id": [2, 3]}))

        def get_tokenizer(self):
            return tok

        def generate(self, prompts, sampling_params=None, use_tqdm=True):
            seen["prompts"], seen["sampling"] = prompts, sampling_params
            outs = []
            for i, p in enumerate(prompts):
                ids = [p["prompt_token_ids"][0], 2]  # echo the first prompt token, then an EOS id
                outs.append(RequestOutput(f"r{i}", p["prompt_token_ids"], [CompletionOutput(
                    0, "", ids, None, [{ids[0]: Logprob(-0.5)}, {2: Logprob(-0.25)}], "stop", None)]))
            return outs

        def reset_prefix_cache(self):
            self.resets += 1

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = LLMStub, SamplingParamsStub
    monkeypatch.setitem(sys.modules, "vllm", fake)
    backend = vb.VLLMBackend(model="/models/Qwen3-8B", tensor_parallel_size=1, gpu_memory_utilization=0.3)
    assert seen["init"] == {"model": "/models/Qwen3-8B", "tensor_parallel_size": 1, "gpu_memory_utilization": 0.3,
                            "logprobs_mode": "processed_logprobs"}
    assert backend.eos_ids == {tok.eos_token_id, 2, 3}
    gens = backend.generate([[10, 11], [20], [30, 31, 32]], SamplingParams(max_new_tokens=5, temperature=1.0, seed=4))
    assert [p["prompt_token_ids"] for p in seen["prompts"]] == [[10, 11], [20], [30, 31, 32]]
    assert [s.kw["seed"] for s in seen["sampling"]] == [vb.row_seed(4, i) for i in range(3)]
    assert [g.token_ids for g in gens] == [[10, 2], [20, 2], [30, 2]]
    assert all(g.finish == "stop" and g.logprobs == [-0.5, -0.25] and g.text == tok.decode([g.token_ids[0]])
               for g in gens)
    backend.generate([[1]], SamplingParams(max_new_tokens=2, temperature=0.0))
    assert isinstance(seen["sampling"], SamplingParamsStub)  # greedy, unseeded: one shared params object
    assert backend.sync_weights(_tiny()) > 0 and backend.llm.resets == 1
