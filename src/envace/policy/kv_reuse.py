"""Key/value caches kept between generate() calls, so a later turn of an episode prefills only
what is new since the earlier turn.

An episode's turn-t prompt repeats its turn t-1 prompt and generation, then adds the tool
result; without reuse every turn prefills the whole conversation again. The store keeps, for
each finished row, the key/value cache of its prompt + generated tokens (pads removed); a new
prompt that starts with a stored sequence starts from that cache. Matching is by longest common
token prefix, so a re-tokenised end of the earlier generation costs only the tokens after the
first difference (a position's keys/values depend only on the tokens up to it).

Entries are only valid for the weights that computed them: the store is emptied whenever the
model's parameters change (:func:`weights_fingerprint`). Memory is bounded by a token budget,
oldest entries out first; an entry reused by a longer prompt is dropped, since the new turn's
entry contains it. A call reuses only when every one of its prompts matches (the backend's rule).
Measured: faster on an eval, slower in a rehearsal training step (docs/notes/2026-12-06-kv-reuse.md),
so it is off by default.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


def weights_fingerprint(model: nn.Module) -> tuple:
    """Changes whenever a parameter's values can have changed: an in-place update (optimizer
    step, ``copy_``, ``load_state_dict``) bumps the tensor's version, a ``p.data = ...``
    assignment changes its storage."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


@dataclass
class _Entry:
    tokens: torch.Tensor  # long [L]: the sequence whose keys/values are stored
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [heads, L, dim]


class KVStore:
    """Per-sequence key/value caches, at most ``max_tokens`` tokens in all."""

    def __init__(self, max_tokens: int, min_reuse: int = 16) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.min_reuse = min_reuse  # shorter matches save too little to be worth a rebuilt cache
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self._tokens = 0
        self._fingerprint: tuple | None = None
        self.reused_tokens = 0  # prompt tokens not prefilled thanks to the store, since creation
        self.prompt_tokens = 0  # prompt tokens asked for, since creation

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def check_weights(self, model: nn.Module) -> None:
        """Empty the store if ``model``'s weights changed since the entries were computed."""
        fp = weights_fingerprint(model)
        if fp != self._fingerprint:
            self.clear()
            self._fingerprint = fp

    def match(self, prompt: Sequence[int]) -> tuple[int, int] | None:
        """(entry key, tokens to reuse) of the entry sharing the longest prefix with ``prompt``,
        leaving the prompt at least its last token to run (its logits start the generation);
        None below ``min_reuse`` tokens."""
        if not self._entries or len(prompt) - 1 < self.min_reuse:
            return None
        p = torch.tensor(prompt, dtype=torch.long)
        best: tuple[int, int] | None = None
        for key, entry in self._entries.items():
            n = min(len(entry.tokens), len(p) - 1)
            if n < self.min_reuse or (best is not None and n <= best[1]):
                continue
            diff = torch.nonzero(entry.tokens[:n] != p[:n])
            common = int(diff[0, 0]) if diff.numel() else n
            if common >= self.min_reuse and (best is None or common > best[1]):
                best = (key, common)
        return best

    def take(self, key: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``length`` positions of an entry's keys/values. The entry stays until
        :meth:`drop` (several prompts of one batch may reuse it)."""
        entry = self._entries[key]
        self._entries.move_to_end(key)
        return [(k[:, :length], v[:, :length]) for k, v in entry.layers]

    def drop(self, keys: Sequence[int]) -> None:
        for key in set(keys):
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._tokens -= len(entry.tokens)

    def put(self, tokens: Sequence[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        n = len(tokens)
        if n == 0 or n > self.max_tokens:
            return
        while self._entries and self._tokens + n > self.max_tokens:
            _, old = self._entries.popitem(last=False)
            self._tokens -= len(old.tokens)
        self._entries[self._next] = _Entry(torch.tensor(tokens, dtype=torch.long), layers)
        self._next += 1
        self._tokens += n
