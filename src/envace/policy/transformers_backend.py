"""Batched sampling with a plain transformers model: the CPU default and the reference backend.

A hand-written decode loop rather than ``model.generate``: it gives exact per-token logprobs
under the sampling temperature, stop strings that keep the stop text, and per-row seeds, with
one forward per step over only the rows still running (finished rows leave the KV cache).

Prompts that share a prefix are prefilled in two phases (see :func:`plan_shared_prefixes`): each
shared prefix once, then every row's own suffix on top of a copy of its prefix's KV cache. A
rollout's prompts are mostly shared prefix (the G episodes of a task share the system prompt,
tools and instruction; at turn 0 they are identical), and prefill, not decoding, is most of a
rollout's generation time on CPU (profiled for issue #6), so this is where batching pays.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch.nn.functional as F

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from envace.policy.kv_reuse import KVStore
from envace.policy.loading import load_model
from envace.policy.prefixes import PrefixPlan, pad_rows, plan_shared_prefixes, prefix_inputs
from envace.core.sampling import FinishReason, Generation, SamplingParams

# on_tokens(row, token_ids, logprobs): called from the decode loop with each row's new tokens.
TokenCallback = Callable[[int, list[int], list[float]], None]

# Mixes the run seed with a prompt's index so each prompt draws from its own stream: a row's
# sample then does not depend on which other rows share its batch or when they finish.
_SEED_STRIDE = 0x9E3779B97F4A7C15


# Generation dtypes by name (rollout.dtype, --dtype): None generates with the model as it is.
GENERATION_DTYPES: dict[str, torch.dtype | None] = {"float32": None, "bfloat16": torch.bfloat16}


def generation_dtype(name: str) -> torch.dtype | None:
    if name not in GENERATION_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(GENERATION_DTYPES)}, got {name!r}")
    return GENERATION_DTYPES[name]


def row_seed(seed: int, index: int) -> int:
    return (seed * _SEED_STRIDE + index) % (1 << 63)


class TransformersBackend:
    """GenerationBackend over a causal LM (any transformers model, or a peft-wrapped one)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        device: str | torch.device = "cpu",
        max_batch: int = 16,
        dtype: torch.dtype | None = None,
        kv_reuse_tokens: int = 0,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        # Generate with a copy of the model in ``dtype`` (e.g. bfloat16 on a CPU with AVX512-BF16):
        # ``model`` stays what a trainer steps; its trainable weights are copied over before each
        # generate() call, so the copy always samples from the current policy.
        needs_copy = dtype is not None and any(p.dtype != dtype for p in model.parameters())
        self.dtype = dtype if needs_copy else None
        self._low: PreTrainedModel | None = None
        self._synced: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []  # (trainer's, copy's)
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)
        self._cache_kwarg = _cache_kwarg(model)
        # Two-phase prefill of shared prompt prefixes; False: always one padded prefill (the
        # reference path, kept for comparison and tests). Same tokens either way, up to float
        # rounding of the attention sums.
        self.share_prefixes = True
        # Key/value caches kept between calls (kv_reuse.py): a later turn prefills only its new
        # tokens. 0: off. Only for models whose every layer keeps a plain, full-length cache.
        self.kv_store = KVStore(kv_reuse_tokens) if kv_reuse_tokens > 0 and _plain_cache(model) else None
        # One-row bf16 linears as matrix-vector products while generating (_one_row_matvec).
        self.one_row_matvec = self.device.type == "cpu" and _has_amx()

    @classmethod
    def from_spec(cls, spec: str, dtype: torch.dtype = torch.float32, **kw: Any) -> "TransformersBackend":
        """Load ``spec`` with :func:`envace.policy.loading.load_model` and wrap it."""
        model, tokenizer = load_model(spec, dtype=dtype)
        return cls(model, tokenizer, **kw)

    # ------------------------------------------------------------------ public

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, on_tokens: TokenCallback | None = None
    ) -> list[Generation]:
        """One Generation per prompt, in prompt order.

        ``on_tokens(row, token_ids, logprobs)``, if given, is called from the decode loop each time
        row ``row`` (an index into ``prompts``) samples tokens, with those tokens and their
        logprobs, on this thread, before the row's next token is computed: a server streams with
        it. The tokens are exactly the ones the row's Generation will hold (an EOS and a stop
        string's tokens included). An exception it raises ends the whole call.
        """
        for i, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prompt {i} is empty; a prompt needs at least one token")
        reuse = self._reuse_plan(prompts)
        # Similar lengths share a batch, so less compute goes into padding, and equal prompts
        # (a group's G copies) sit together, so they share one prefill. Rows that start from a
        # stored cache batch by the length of what they still prefill. Seeds follow the prompt's
        # original index, so this reordering never changes what is sampled.
        if reuse:
            order = sorted(reuse, key=lambda i: (len(prompts[i]) - reuse[i][0][0].shape[-2], i))
        else:
            order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), list(prompts[i])))
        results: list[Generation | None] = [None] * len(prompts)
        model = self._generating_model()
        was_training = model.training
        model.eval()  # no dropout while sampling, even if a trainer left it in train mode
        try:
            with torch.inference_mode(), _one_row_matvec(model, self.one_row_matvec):
                for start in range(0, len(order), self.max_batch):
                    chunk = order[start : start + self.max_batch]
                    start_from = [reuse[i] for i in chunk] if reuse else None
                    outs = self._generate_batch(model, [prompts[i] for i in chunk], chunk, params, start_from,
                                                on_tokens)
                    for i, out in zip(chunk, outs):
                        results[i] = out
        finally:
            model.train(was_training)
        return results  # type: ignore[return-value]

    def _reuse_plan(self, prompts: list[list[int]]) -> dict[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Prompt index -> the stored keys/values it starts from (per layer, [heads, n, dim]).
        The matched entries leave the store now: each row's new entry will contain its old one,
        and nothing stored during this call can then evict a cache this call still needs."""
        store = self.kv_store
        if store is None:
            return {}
        store.check_weights(self.model)
        store.prompt_tokens += sum(len(p) for p in prompts)
        matches = {i: m for i, p in enumerate(prompts) if (m := store.match(p)) is not None}
        if len(matches) < len(prompts):
            # All or nothing: a call split into reused and fresh rows would decode two batches
            # instead of one.
            return {}
        # Reused rows each prefill their own rest; a fresh batch prefills each shared prefix
        # once (a group's identical prompts: one row's work). Take the cheaper, by padded tokens.
        rest = max(len(p) - matches[i][1] for i, p in enumerate(prompts))
        if self.share_prefixes and len(prompts) * rest >= _fresh_prefill_tokens(prompts):
            return {}
        plan = {i: store.take(key, n) for i, (key, n) in matches.items()}
        store.drop([key for key, _ in matches.values()])
        store.reused_tokens += sum(n for _, n in matches.values())
        return plan

    def _generating_model(self) -> PreTrainedModel:
        """The model itself, or its copy in ``self.dtype`` with the current trainable weights."""
        if self.dtype is None:
            return self.model
        if self._low is None:
            self._low = copy.deepcopy(self.model)
            # Parameters only: buffers (e.g. rotary inv_freq) keep their precision, as from_pretrained keeps them.
            for p in self._low.parameters():
                p.data = p.data.to(self.dtype)
                p.requires_grad_(False)
            low = dict(self._low.named_parameters())
            # frozen weights (a LoRA model's base) never change: only trainable ones are copied again
            self._synced = [(p, low[name]) for name, p in self.model.named_parameters() if p.requires_grad]
            return self._low
        with torch.no_grad():
            for src, dst in self._synced:
                dst.copy_(src.detach())
        return self._low

    # ------------------------------------------------------------------ decode loop

    def _generate_batch(
        self,
        model: PreTrainedModel,
        prompts: Sequence[list[int]],
        indices: Sequence[int],
        params: SamplingParams,
        start_from: Sequence[list[tuple[torch.Tensor, torch.Tensor]]] | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> list[Generation]:
        n = len(prompts)
        generators = None
        if params.seed is not None:
            generators = [
                torch.Generator(device=self.device).manual_seed(row_seed(params.seed, i)) for i in indices
            ]
        cache = DynamicCache(config=model.config)
        plan = plan_shared_prefixes(prompts) if self.share_prefixes and start_from is None else None
        if start_from is not None:
            logits, attention = self._prefill_from(model, prompts, start_from, cache)
        elif plan is None:
            input_ids, attention = pad_rows(prompts, self.pad_id)
            # Positions count real tokens only, so a padded row sees the positions it would alone.
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
            input_ids, attention, positions = (t.to(self.device) for t in (input_ids, attention, positions))
            logits = self._forward(model, input_ids, attention, positions, cache, last_only=True)
        else:
            logits, attention = self._prefill_shared(model, prompts, plan, cache)
        next_position = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=self.device)

        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        done: list[Generation | None] = [None] * n
        running = list(range(n))  # batch rows still decoding, aligned with the cache's batch dim
        for _ in range(params.max_new_tokens):
            gens = [generators[r] for r in running] if generators is not None else None
            chosen, chosen_logprobs = sample_next(logits, params, gens)
            keep: list[int] = []  # positions within `running` that go on
            for j, (row, token, logprob) in enumerate(zip(running, chosen.tolist(), chosen_logprobs.tolist())):
                tokens[row].append(token)
                logprobs[row].append(logprob)
                if on_tokens is not None:
                    on_tokens(indices[row], [token], [logprob])
                done[row] = self._finished(tokens[row], logprobs[row], params)
                if done[row] is None:
                    keep.append(j)
                elif self.kv_store is not None:
                    self._store_row(cache, j, attention[j], prompts[row] + tokens[row][:-1])
            if not keep:
                break
            if len(keep) < len(running):  # drop finished rows from every tensor and the cache
                keep_index = torch.tensor(keep, dtype=torch.long, device=self.device)
                cache.batch_select_indices(keep_index)
                attention, next_position, chosen = attention[keep_index], next_position[keep_index], chosen[keep_index]
                running = [running[j] for j in keep]
            attention = torch.cat([attention, attention.new_ones((len(running), 1))], dim=-1)
            logits = self._forward(model, chosen[:, None], attention, next_position[:, None], cache, last_only=False)
            next_position = next_position + 1
        return done  # type: ignore[return-value]

    def _prefill_shared(
        self, model: PreTrainedModel, prompts: Sequence[list[int]], plan: "PrefixPlan", cache: DynamicCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Phase 1: each group's shared prefix once (one row per group). Phase 2: the cache rows
        are copied out to one per prompt, and every prompt's suffix (at least one token) runs on
        top, at the positions it has in the full prompt. The cache then holds, per row,
        ``[pad][prefix][pad][suffix]``; the attention mask hides both pads. Returns the last
        prompt position's logits and that mask."""
        x = prefix_inputs(prompts, plan, self.pad_id, "left")
        self._forward(model, x.head_ids.to(self.device), x.head_mask.to(self.device), x.head_pos.to(self.device),
                      cache, last_only=True)
        cache.batch_select_indices(x.group.to(self.device))
        attention = x.attention.to(self.device)
        logits = self._forward(model, x.tail_ids.to(self.device), attention, x.tail_pos.to(self.device), cache,
                               last_only=True)
        return logits, attention

    def _prefill_from(
        self, model: PreTrainedModel, prompts: Sequence[list[int]],
        start_from: Sequence[list[tuple[torch.Tensor, torch.Tensor]]], cache: DynamicCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's stored keys/values (left-padded to the longest) go into ``cache``; only the
        rest of each prompt runs, at its positions in the full prompt. Returns the last prompt
        position's logits and the attention mask over the cache."""
        lengths = [layers[0][0].shape[-2] for layers in start_from]
        width = max(lengths)
        for layer in range(len(start_from[0])):
            k0, v0 = start_from[0][layer]
            keys = k0.new_zeros((len(prompts), k0.shape[0], width, k0.shape[-1]))
            values = v0.new_zeros((len(prompts), v0.shape[0], width, v0.shape[-1]))
            for r, (layers, n) in enumerate(zip(start_from, lengths)):
                keys[r, :, width - n :] = layers[layer][0]
                values[r, :, width - n :] = layers[layer][1]
            cache.update(keys.to(self.device), values.to(self.device), layer)
        head_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for r, n in enumerate(lengths):
            head_mask[r, width - n :] = 1
        tail_ids, tail_mask = pad_rows([p[n:] for p, n in zip(prompts, lengths)], self.pad_id, "left")
        offset = torch.tensor(lengths, dtype=torch.long)
        tail_pos = offset[:, None] + (tail_mask.cumsum(-1) - 1).clamp(min=0)
        attention = torch.cat([head_mask, tail_mask], dim=-1).to(self.device)
        logits = self._forward(model, tail_ids.to(self.device), attention, tail_pos.to(self.device), cache,
                               last_only=True)
        return logits, attention

    def _store_row(self, cache: DynamicCache, j: int, mask: torch.Tensor, tokens: list[int]) -> None:
        """Keep one finished row's keys/values (cache row ``j``, its real positions only) for a
        later call. ``tokens`` is what those positions hold: the prompt and all but the last
        sampled token, which was never fed back."""
        keep = mask.bool()
        if int(keep.sum()) != len(tokens) or self.kv_store is None:
            return
        self.kv_store.put(tokens, [(layer.keys[j][:, keep].clone(), layer.values[j][:, keep].clone())
                                   for layer in cache.layers])

    def _forward(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        last_only: bool,
    ) -> torch.Tensor:
        extra = {"logits_to_keep": 1} if last_only else {}  # skip the vocab projection of the prompt
        out = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **{self._cache_kwarg: cache},
            **extra,
        )
        return out.logits[:, -1, :].float()

    def _finished(self, token_ids: list[int], logprobs: list[float], params: SamplingParams) -> Generation | None:
        """The row's Generation if its last token ended it, else None."""
        if token_ids[-1] in self.eos_ids:
            return self._result(token_ids, logprobs, self._decode(token_ids[:-1]), "stop")
        if params.stop:
            text = self._decode(token_ids)
            end = first_stop_end(text, params.stop)
            if end is not None:
                return self._result(token_ids, logprobs, text[:end], "stop")
        if len(token_ids) >= params.max_new_tokens:
            return self._result(token_ids, logprobs, self._decode(token_ids), "length")
        return None

    @staticmethod
    def _result(token_ids: list[int], logprobs: list[float], text: str, finish: FinishReason) -> Generation:
        return Generation(token_ids=list(token_ids), logprobs=list(logprobs), text=text, finish=finish)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@contextlib.contextmanager
def _one_row_matvec(model: PreTrainedModel, enabled: bool) -> Iterator[None]:
    """While generating, bfloat16 linear layers given one row (a batch-1 decode step, or the last
    row left running) compute ``W @ x`` as a matrix-vector product instead of ``x @ W.T``.

    On CPUs with AMX, oneDNN runs a one-row bf16 ``F.linear`` as an AMX matmul whose right-hand
    operand is the weight, re-laid out for the tiles on every call: the whole model's weights are
    re-packed for every generated token, which made batch-1 bf16 decoding slower than fp32 (and
    HF ``generate`` pays it too). As a matrix-vector product the weight is the left operand, read
    as it lies, and only the one row is re-packed; both accumulate in fp32 to the same bf16 values
    (the tiny-model reference tokens are unchanged). Other row counts and dtypes run ``F.linear``
    as before; layers with their own ``forward`` attribute (hooks, offloading) are left alone.
    The swap is undone when generation ends. Only on CPUs with AMX, where it was measured.
    """
    if not enabled:
        yield
        return
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16
              and "forward" not in m.__dict__]
    for layer in layers:
        layer.forward = _matvec_forward(layer)
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


def _matvec_forward(layer: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        weight, bias = layer.weight, layer.bias  # read per call: a trainer may replace the tensors
        if x.numel() != x.shape[-1] or x.dtype != weight.dtype:
            return F.linear(x, weight, bias)
        y = torch.mv(weight, x.reshape(-1))
        if bias is not None:
            y = y + bias
        return y.reshape(*x.shape[:-1], weight.shape[0])

    return forward


def _has_amx() -> bool:
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private in torch 2.x: absent means no
    try:
        return bool(check()) if check is not None else False
    except Exception:  # noqa: BLE001 - a CPU probe that fails means the plain path
        return False


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (token ids, their logprobs under log_softmax(logits / T))."""
    scaled = logits / params.logprob_temperature if params.logprob_temperature != 1.0 else logits
    log_norm = torch.logsumexp(scaled, dim=-1, keepdim=True)
    if params.greedy:
        chosen = scaled.argmax(dim=-1)
    else:
        chosen = sample_rows((scaled - log_norm).exp(), params.top_p, generators)
    # logit - logsumexp: exact even for tiny probabilities, without a full log_softmax tensor.
    return chosen, (scaled.gather(-1, chosen[:, None]) - log_norm).squeeze(-1)


def sample_rows(probs: torch.Tensor, top_p: float, generators: list[torch.Generator] | None) -> torch.Tensor:
    """One draw per row of ``probs`` [B, V] by inverse CDF, keeping only the top-p nucleus.

    Inverse CDF needs one uniform number per row (torch.multinomial over a 49k vocab costs
    ~15 ms a row on CPU); the CDF is summed in float64 so rounding cannot pick a zero-mass token.
    """
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before >= top_p, 0.0)  # the top token always stays
    if generators is None:
        uniform = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device)
    else:
        uniform = torch.cat(
            [torch.rand((1, 1), dtype=torch.float64, device=probs.device, generator=g) for g in generators]
        )
    cdf = probs.double().cumsum(dim=-1)
    # right=True: the first index whose CDF exceeds the draw, so it has non-zero mass.
    picked = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1)
    if order is not None:
        picked = order.gather(-1, picked)
    return picked.squeeze(-1)


def first_stop_end(text: str, stops: Sequence[str]) -> int | None:
    """End offset of the earliest-ending stop string in text, or None."""
    ends = [i + len(s) for s in stops if (i := text.find(s)) >= 0]
    return min(ends) if ends else None


def _fresh_prefill_tokens(prompts: Sequence[list[int]]) -> int:
    """Padded tokens a fresh prefill of ``prompts`` runs (two-phase where prefixes are shared)."""
    plan = plan_shared_prefixes(prompts)
    if plan is None:
        return len(prompts) * max(len(p) for p in prompts)
    own = max(len(p) - plan.prefix_len[g] for p, g in zip(prompts, plan.group_of))
    return len(plan.prefix_len) * max(plan.prefix_len) + len(prompts) * own


def _plain_cache(model: PreTrainedModel) -> bool:
    """Whether every layer of the model's cache keeps all positions (no sliding window), the
    only kind whose rows kv_reuse can cut out and put back."""
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # a config the cache cannot read: no reuse, generation as before
        return False
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


def _cache_kwarg(model: PreTrainedModel) -> str:
    """transformers 5.x renames forward's ``past_key_values`` to ``cache`` (old name deprecated)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wrapper
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    config = getattr(model, "generation_config", None)
    configured = getattr(config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return frozenset(ids)
