"""A small byte-level BPE tokenizer trained on a run's own text, for models trained from scratch.

Why: a small Llama with SmolLM2's 49,152-token vocabulary spends almost all of its compute and
parameters on the embedding and output head (hidden 128: 6.3 M of 6.7 M parameters, ~94% of the
multiply-adds per token), while the embedded worlds' text uses about 1,200 of those tokens. A
vocabulary of a few thousand tokens learned on the warm start's oracle text frees that compute
for a wider, deeper body, and shortens the sequences (domain words become single tokens).

The tokenizer keeps the base tokenizer's special tokens and chat template, so prompts render the
same way; digits are split one by one (ids and amounts are copied digit by digit), and any byte
sequence still encodes (byte-level alphabet), so unseen names and ids at evaluation time work.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

MIN_VOCAB = 300  # 256 byte tokens + the special tokens + a few merges


def train_data_tokenizer(texts: Iterable[str], vocab_size: int,
                         base: PreTrainedTokenizerBase) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of ``vocab_size`` tokens on ``texts`` (special tokens of ``base``
    removed from them first) that renders chats with ``base``'s template. Deterministic: the same
    texts in the same order give the same tokenizer."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"vocab size {vocab_size}: at least {MIN_VOCAB} (256 bytes, special tokens, merges)")
    specials = list(dict.fromkeys(base.all_special_tokens))

    def cleaned() -> Iterable[str]:
        for text in texts:
            for s in specials:  # special tokens are added whole, never learned as merges
                text = text.replace(s, "\n")
            yield text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(cleaned(), trainer=trainer)
    named = {k: getattr(base, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
             if getattr(base, k, None) is not None}
    out = PreTrainedTokenizerFast(tokenizer_object=tok, **named)
    extra = [s for s in specials if s not in named.values()]
    if extra:
        out.add_special_tokens({"additional_special_tokens": extra})
    out.chat_template = base.chat_template
    if out.pad_token is None:
        out.pad_token = out.eos_token
    return out
