"""The data tokenizer: a small byte-level BPE trained on a run's text for from-scratch models."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from envace.policy.data_tokenizer import train_data_tokenizer
from envace.policy.loading import load_model, scratch_llama, smollm2_tokenizer

TEXTS = [
    '<|im_start|>user\nCancel order o-7302 please<|im_end|>\n<|im_start|>assistant\n<tool_call>\n'
    '{"name": "cancel_order", "arguments": {"order_id": "o-7302"}}\n</tool_call><|im_end|>\n',
    '<execution_result>{"orders": [{"order_id": "o-7311", "status": "delivered", "total": "25.40"}]}'
    '</execution_result>',
] * 20


@pytest.fixture(scope="module")
def tok():
    return train_data_tokenizer(TEXTS, 400, smollm2_tokenizer())


def test_keeps_special_tokens_and_chat_template(tok) -> None:
    base = smollm2_tokenizer()
    assert 300 <= len(tok) <= 400
    for name in ("eos_token", "bos_token", "pad_token"):
        assert getattr(tok, name) == getattr(base, name) or (name == "pad_token" and tok.pad_token is not None)
    chat = [{"role": "user", "content": "Cancel o-7302"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        base.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    assert tok.convert_ids_to_tokens(ids[0]) == "<|im_start|>"  # one token, not spelled out
    # Domain words learned as merges; digits stay one per token (ids are copied digit by digit).
    pieces = tok.convert_ids_to_tokens(tok("order_id o-7302", add_special_tokens=False)["input_ids"])
    assert "order" in pieces
    assert [p for p in pieces if any(c.isdigit() for c in p)] == ["7", "3", "0", "2"]


def test_same_text_same_tokenizer(tok, tmp_path: Path) -> None:
    again = train_data_tokenizer(TEXTS, 400, smollm2_tokenizer())
    assert again.get_vocab() == tok.get_vocab()
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.get_vocab() == tok.get_vocab() and loaded.chat_template == tok.chat_template


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60))
def test_any_text_round_trips(text: str) -> None:
    t = _module_tok()
    assert t.decode(t(text, add_special_tokens=False)["input_ids"]) == text


_CACHE: dict = {}


def _module_tok():
    if "t" not in _CACHE:
        _CACHE["t"] = train_data_tokenizer(TEXTS, 400, smollm2_tokenizer())
    return _CACHE["t"]


def test_too_small_vocab_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 300"):
        train_data_tokenizer(TEXTS, 100, smollm2_tokenizer())


def test_scratch_model_takes_the_tokenizer_size_and_loads_back_with_it(tok, tmp_path: Path) -> None:
    model = scratch_llama("llama:64x1:3", tok)
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_model(str(tmp_path))
    assert loaded_tok.get_vocab() == tok.get_vocab()


def test_model_dir_without_tokenizer(tok, tmp_path: Path) -> None:
    """Old checkpoints (no tokenizer saved) of SmolLM2-vocabulary models still load; others are refused."""
    from envace.policy.loading import ModelSpecError

    scratch_llama("llama:64x1", smollm2_tokenizer()).save_pretrained(tmp_path / "old")
    _, t = load_model(str(tmp_path / "old"))
    assert len(t) == len(smollm2_tokenizer())
    scratch_llama("llama:64x1", tok).save_pretrained(tmp_path / "data")
    with pytest.raises(ModelSpecError, match="holds no tokenizer"):
        load_model(str(tmp_path / "data"))
