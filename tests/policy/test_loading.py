from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envace.policy.loading import ModelSpecError, _tiny_prototype, _write_atomically, load_model


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_is_deterministic_and_seedable() -> None:
    state = torch.random.get_rng_state()
    a, tok = load_model("tiny")
    b, _ = load_model("tiny:0")
    c, _ = load_model("tiny:1")
    assert torch.equal(torch.random.get_rng_state(), state), "loading must not move the global RNG"
    assert _same_weights(a, b)
    assert not _same_weights(a, c)
    _tiny_prototype.cache_clear()  # a fresh random init, not the in-process copy, must agree too
    assert _same_weights(a, load_model("tiny")[0])
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64
    assert a.config.vocab_size == len(tok)
    assert a.name_or_path == "tiny"


def test_tiny_uses_the_smollm2_tokenizer_and_chat_template() -> None:
    _, tok = load_model("tiny")
    assert tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    # Tool-call tags are plain text to SmolLM2 (several tokens) and must round-trip exactly.
    ids = tok.encode("<tool_call>{}</tool_call>", add_special_tokens=False)
    assert tok.decode(ids) == "<tool_call>{}</tool_call>"


def test_tiny_tokenizer_is_a_private_copy() -> None:
    _, tok1 = load_model("tiny")
    tok1.chat_template = "changed"
    _, tok2 = load_model("tiny")
    assert tok2.chat_template != "changed"


@pytest.mark.parametrize("spec", ["gpt-5", "HuggingFaceTB/SmolLM2-135M-Instruct", "/no/such/dir", "tiny:abc"])
def test_bad_spec_names_itself_and_the_accepted_forms(spec: str) -> None:
    with pytest.raises(ModelSpecError) as err:
        load_model(spec)
    message = str(err.value)
    assert repr(spec) in message
    assert "smollm2" in message and "tiny" in message


def test_directory_without_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelSpecError, match="config.json"):
        load_model(str(tmp_path))


def test_hf_directory_round_trip(tmp_path: Path) -> None:
    model, tok = load_model("tiny:3")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model(str(tmp_path))
    assert _same_weights(model, loaded)
    assert loaded_tok.chat_template == tok.chat_template


def test_lora_adapter_directory_loads_on_its_base(tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model

    base, _ = load_model("tiny:2")
    # init_lora_weights=False: non-zero B, so the adapter visibly changes the outputs.
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = peft_model(ids).logits
        plain = load_model("tiny:2")[0](ids).logits

    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded, tok = load_model(str(tmp_path))
    assert isinstance(loaded, PeftModel)
    # `envace eval --model RUN/sft` printed peft's use of a deprecated transformers attribute
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    merged, _ = load_model(str(tmp_path), merge_lora=True)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, expected)
        torch.testing.assert_close(merged(ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(plain, expected)
    assert tok.eos_token == "<|im_end|>"


def test_cache_write_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model"

    def broken_writer(path: Path) -> None:
        (path / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        _write_atomically(target, broken_writer)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []

    _write_atomically(target, lambda path: (path / "ok.bin").write_bytes(b"y"))
    assert (target / "ok.bin").read_bytes() == b"y"


@pytest.mark.slow
def test_smollm2_loads_and_answers_a_chat() -> None:
    from envace.core.sampling import SamplingParams
    from envace.policy.transformers_backend import TransformersBackend

    backend = TransformersBackend.from_spec("smollm2")
    model, tok = backend.model, backend.tokenizer
    assert model.config.num_hidden_layers == 30 and model.dtype == torch.float32
    assert getattr(model.config, "quantization_config", None) is None
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    prompt = list(
        tok.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
            add_generation_prompt=True,
            return_dict=False,
        )
    )
    (gen,) = backend.generate([prompt], SamplingParams(max_new_tokens=16, temperature=0))
    assert gen.text.strip()
    assert "paris" in gen.text.lower()
