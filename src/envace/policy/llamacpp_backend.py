"""GenerationBackend over llama.cpp (``ik-llama-cpp-python``): fast CPU rollouts, weights from the trainer.

Install with ``pip install 'envace[llamacpp]'`` (a manylinux wheel, no compiler). This module
imports without it; building a :class:`LlamaCppBackend` without it raises an ImportError that
names the extra.

* Prompts go in as token ids, so the engine sees exactly the ids the trainer scores.
* Sampling happens here, not in the binding (its sampler has no seed and no log-probs): the
  logits llama.cpp leaves for each running row are read in place as numpy arrays and passed to
  the transformers backend's own sampler (:func:`~envace.policy.transformers_backend.sample_next`),
  so temperature, top-p, per-row seeds (:func:`row_seed`) and the reported log-probs
  (``log_softmax(logits / T)``) follow the reference backend's rules exactly; only the logits differ.
* Rows decode together: one llama.cpp context holds up to ``max_batch`` sequences (a unified
  KV cache), each step decodes one token of every running row in one batch, and a finished row's
  cache cells are freed at once. Identical prompts (a group's G copies) are prefilled once and
  their cache cells shared (``llama_kv_cache_seq_cp``).
* Weights: :meth:`LlamaCppBackend.sync_weights` writes the trained model (LoRA merged out of
  place, :func:`~envace.policy.vllm_backend.vllm_weights`) as a GGUF file with the ``gguf``
  package -- architecture keys from the HF config, no vocabulary (``no_vocab``: the engine only
  ever sees token ids) -- in ``quant`` (F32, BF16, Q8_0, Q4_1), and reloads it. Llama's q/k
  projections are permuted to llama.cpp's rotary layout on the way; tensors unchanged since the
  last sync (frozen weights beside LoRA) are not encoded again. (llama.cpp's own
  ``convert_hf_to_gguf.py``, shipped with the wheel, needs ik_llama.cpp's fork of ``gguf`` and
  fails with the registry's; it would also re-read a saved checkpoint every step.)
* Quantised engines sample from slightly different distributions than the trainer's weights:
  the trainer recomputes the log-probs (``rollout.recompute_logprobs`` is on for this backend),
  logs the rollout/trainer KL, and weights each token's loss by a truncated importance weight
  (``grpo.is_cap``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from envace.core.sampling import FinishReason, Generation, SamplingParams
from envace.policy.transformers_backend import first_stop_end, row_seed, sample_next
from envace.policy.vllm_backend import vllm_weights

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

INSTALL_HINT = "the llamacpp rollout backend needs ik-llama-cpp-python: pip install 'envace[llamacpp]'"
QUANTS = ("F32", "BF16", "Q8_0", "Q4_1")


def import_binding() -> Any:
    """The binding's ctypes API module; an ImportError naming the extra without it."""
    try:
        from ik_llama_cpp import _ctypes_api  # noqa: PLC0415 - optional
    except (ImportError, OSError) as err:  # OSError: the wheel's shared library failed to load
        raise ImportError(f"{INSTALL_HINT} ({err})") from err
    return _ctypes_api


# ---------------------------------------------------------------------------- GGUF writing

_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    """llama.cpp's tensor name for a Llama checkpoint's tensor name."""
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    parts = hf_name.split(".", 3)  # model.layers.N.rest
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER_NAMES:
        return f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"
    raise ValueError(f"tensor {hf_name!r} has no llama.cpp name: the llamacpp backend writes Llama models only")


def permute_rotary(w: "torch.Tensor", n_head: int) -> "torch.Tensor":
    """HF's q/k row order (rotary halves) to llama.cpp's (interleaved pairs), per head;
    the transform of llama.cpp's convert_hf_to_gguf.py."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _tensor_type(name: str, quant: str) -> str:
    if name.endswith("_norm.weight"):
        return "F32"  # norms are tiny and llama.cpp wants them in F32
    if quant == "Q4_1" and name in ("token_embd.weight", "output.weight"):
        return "Q8_0"  # as in the shipped SmolLM2 Q4_1 file: the embedding is the most sensitive
    return quant


def _encode(t: "torch.Tensor", kind: str) -> tuple[np.ndarray, Any]:
    if kind == "BF16":  # torch rounds to bf16 natively; numpy has no bf16
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), GGMLQuantizationType.BF16
    if kind == "F32":
        return t.to(torch.float32).numpy(), GGMLQuantizationType.F32
    return quantize_blocks(t, kind), GGMLQuantizationType[kind]


def quantize_blocks(t: "torch.Tensor", kind: str) -> np.ndarray:
    """``t`` [rows, cols] in ggml's Q8_0 or Q4_1 blocks of 32, as uint8 [rows, bytes per row], by the
    ``gguf`` package's own quantiser (what llama.cpp's converter writes)."""
    if kind not in ("Q8_0", "Q4_1"):
        raise ValueError(f"no block quantisation {kind!r}")
    if t.shape[-1] % 32:
        raise ValueError(f"{kind} needs rows of a multiple of 32 values, got {t.shape[-1]}")
    return quants.quantize(t.detach().to(torch.float32).numpy(), GGMLQuantizationType[kind])


def write_gguf(weights: Iterable[tuple[str, "torch.Tensor"]], config: Any, path: Path, quant: str = "F32",
               reuse: dict[str, Any] | None = None, owned: set[int] | None = None) -> int:
    """Write a Llama model's (HF-named) ``weights`` as a GGUF file in ``quant``, atomically;
    returns the number of tensors. The file has no vocabulary (``no_vocab``): prompts arrive as
    token ids and the policy's own tokenizer decodes, so any vocabulary works and nothing is
    copied per sync.
    ``reuse``: a dict kept between calls; a tensor of the model's own (its storage in ``owned``)
    that is still the same storage, autograd version and sum as at the last call (a frozen weight
    next to LoRA: the embedding, the norms) is not encoded again. Temporaries (LoRA-merged
    weights) are never kept: a later one may be allocated at the same address."""
    if quant not in QUANTS:
        raise ValueError(f"llama.cpp quant must be one of {', '.join(QUANTS)}, got {quant!r}")
    if getattr(config, "model_type", "llama") != "llama":
        raise ValueError(f"the llamacpp backend writes Llama models only, not {config.model_type!r}")
    n_head = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_head)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // n_head)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_block_count(int(config.num_hidden_layers))
    w.add_context_length(int(config.max_position_embeddings))
    w.add_embedding_length(int(config.hidden_size))
    w.add_feed_forward_length(int(config.intermediate_size))
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(rope_theta(config))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    w.add_vocab_size(int(config.vocab_size))
    w.add_rope_dimension_count(head_dim)
    w.add_file_type({"F32": 0, "BF16": 32, "Q8_0": 7, "Q4_1": 3}[quant])
    w.add_tokenizer_model("no_vocab")
    n = 0
    for hf_name, tensor in weights:
        name = gguf_name(hf_name)
        kind = _tensor_type(name, quant)
        keep = reuse is not None and owned is not None and tensor.data_ptr() in owned
        ident = None
        if keep:  # the sum guards against writes the version counter misses (``.data`` assignments)
            ident = (tensor.data_ptr(), tensor._version, tuple(tensor.shape), tensor.dtype, kind,
                     float(torch.sum(tensor.detach(), dtype=torch.float64)))
        if keep and name in reuse and reuse[name][0] == ident:
            data, qtype = reuse[name][1]
        else:
            t = tensor.detach().to("cpu")
            if name.endswith("attn_q.weight") or name.endswith("attn_k.weight"):
                t = permute_rotary(t, n_head if name.endswith("attn_q.weight") else n_kv)
            data, qtype = _encode(t, kind)
            if keep:
                reuse[name] = (ident, (data, qtype))
        w.add_tensor(name, data, raw_dtype=qtype)
        n += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return n


def rope_theta(config: Any) -> float:
    """The rotary base of a HF Llama config (transformers 5 keeps it in ``rope_parameters``);
    scaled rotary variants (llama3, yarn, ...) are not written, so they are refused."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if kind not in ("default", None):
        raise ValueError(f"the llamacpp backend writes plain rotary embeddings only, this model's are {kind!r}")
    theta = getattr(config, "rope_theta", None) or (rope.get("rope_theta") if isinstance(rope, dict) else None)
    return float(theta or 10000.0)


# ---------------------------------------------------------------------------- the backend


class _Engine:
    """One loaded GGUF file and a context of ``n_seq`` sequences over ``n_ctx`` shared cache cells."""

    def __init__(self, C: Any, path: Path, n_ctx: int, n_seq: int, n_threads: int) -> None:
        self.C = C
        C.llama_backend_init()
        mp = C.llama_model_default_params()
        mp.use_mmap = True
        self.model = C.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(self.model))
        cp = C.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = n_threads
        # Off: ik_llama.cpp 0.1.5's flash attention with several sequences in one context aborts
        # (GGML_ASSERT(S > 0) in iqk_fa_templates.h) or attends wrongly, even with AVX-VNNI.
        cp.flash_attn = False
        self.ctx = C.llama_init_from_model(self.model, cp)
        if not self.ctx:
            C.llama_free_model(self.model)
            raise RuntimeError(f"llama.cpp could not create a context of {n_ctx} tokens for {path}")
        self.n_ctx, self.n_seq = n_ctx, n_seq

    def close(self) -> None:
        if self.ctx:
            self.C.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self.C.llama_free_model(self.model)
            self.model = None


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


@functools.lru_cache(maxsize=1)
def _quiet(lib: Any) -> Any:
    """Silence llama.cpp's model-loading log (pages per load, every sync); failures still
    surface as return codes. The callback object is kept alive by the cache."""
    callback = _LOG_CALLBACK(lambda level, text, data: None)
    lib.llama_log_set.argtypes = [_LOG_CALLBACK, ctypes.c_void_p]
    lib.llama_log_set.restype = None
    lib.llama_log_set(callback, None)
    return callback


@functools.lru_cache(maxsize=1)
def _extra_api(lib: Any) -> tuple[Any, Any]:
    """Cache calls the binding does not wrap: seq_rm (free a row's cells), seq_cp (share cells)."""
    rm = lib.llama_kv_cache_seq_rm
    rm.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
    rm.restype = ctypes.c_bool
    cp = lib.llama_kv_cache_seq_cp
    cp.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
    cp.restype = None
    return rm, cp


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


class LlamaCppBackend:
    """GenerationBackend over llama.cpp, fed the trainer's weights by :meth:`sync_weights`.

    ``quant``: the GGUF encoding of the pushed weights (F32, BF16, Q8_0, Q4_1). ``n_ctx``: cache
    cells shared by the rows decoded together (rows are grouped so their prompts plus
    ``max_new_tokens`` fit). ``work_dir``: where the GGUF files are written (default: a temporary
    directory removed with the backend). ``model``: weights to load now (else: before the first
    generate, :meth:`sync_weights` must be called).
    """

    def __init__(self, tokenizer: "PreTrainedTokenizerBase", model: "nn.Module | None" = None, *,
                 quant: str = "Q8_0", max_batch: int = 16, n_ctx: int = 8192, n_threads: int | None = None,
                 work_dir: str | Path | None = None, eos_ids: Iterable[int] = ()) -> None:
        self.C = import_binding()
        if quant not in QUANTS:
            raise ValueError(f"rollout.llamacpp_quant must be one of {', '.join(QUANTS)}, got {quant!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.tokenizer = tokenizer
        self.quant, self.max_batch, self.n_ctx = quant, max_batch, n_ctx
        if n_threads is None:
            n_threads = torch.get_num_threads()
        self.n_threads = max(1, int(n_threads))
        self._tmp = None
        if work_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="envace-llamacpp-")
            work_dir = self._tmp.name
        self.work_dir = Path(work_dir)
        self.eos_ids = frozenset(int(e) for e in eos_ids) | (
            {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set())
        self._engine: _Engine | None = None
        self._encoded: dict[str, Any] = {}  # write_gguf's reuse of unchanged tensors
        # Tokens per llama_decode. ik_llama.cpp 0.1.5's Q4_1 matrix kernel for batches of 32 or more
        # tokens returns wrong logits (the shipped SmolLM2 Q4_1 file too; Q8_0, BF16 and F32 agree
        # with transformers at any size), so Q4_1 prompts and row steps go in smaller pieces.
        self._step_tokens = 16 if quant == "Q4_1" else n_ctx
        self.syncs = 0
        self.prefilled = 0  # prompt tokens decoded (shared prefixes once)
        self.path: Path | None = None
        self._seq_rm, self._seq_cp = _extra_api(self.C._lib)
        _quiet(self.C._lib)
        if model is not None:
            self.sync_weights(model)

    # ------------------------------------------------------------------ weights

    def sync_weights(self, model: "nn.Module") -> int:
        """Write ``model``'s current weights (LoRA merged out of place) as GGUF and reload; returns
        the number of tensors written."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        generation = getattr(base, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None)
        self.eos_ids = self.eos_ids | frozenset([eos] if isinstance(eos, int) else (eos or []))
        path = self.work_dir / f"policy-{self.quant}.gguf"
        owned = {t.data_ptr() for t in model.state_dict().values()}
        n = write_gguf(vllm_weights(model), config, path, self.quant, self._encoded, owned)
        self.load(path)
        self.syncs += 1
        return n

    def load(self, path: str | Path) -> None:
        """Serve the GGUF file at ``path`` (the old engine is freed first: the file may be the same)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        self._engine = _Engine(self.C, Path(path), self.n_ctx, self.max_batch, self.n_threads)
        self.path = Path(path)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; a prompt needs at least one token")
            if len(p) + params.max_new_tokens > self.n_ctx:
                raise ValueError(f"prompt {i} has {len(p)} tokens + {params.max_new_tokens} new: more than the "
                                 f"llama.cpp context's {self.n_ctx} cells (rollout.llamacpp_ctx)")
        if self._engine is None:
            raise RuntimeError("LlamaCppBackend has no weights yet: call sync_weights(model) first")
        results: list[Generation | None] = [None] * len(prompts)
        # In token order, a prompt's longest common prefix with any earlier one is with the one just
        # before it: prefilled once, its cells shared (a later turn's prompts all start with the
        # first turn's). Seeds follow the original index.
        order = sorted(range(len(prompts)), key=lambda i: prompts[i])
        group: list[int] = []
        used = 0
        for i in order:
            shared = _common_prefix(prompts[group[-1]], prompts[i]) if group else 0
            need = len(prompts[i]) - shared + params.max_new_tokens
            if group and (len(group) == self.max_batch or used + need > self.n_ctx):
                self._run(prompts, group, params, results)
                group, used = [], 0
                need = len(prompts[i]) + params.max_new_tokens
            group.append(i)
            used += need
        if group:
            self._run(prompts, group, params, results)
        return results  # type: ignore[return-value]

    def _run(self, prompts: Sequence[list[int]], rows: list[int], params: SamplingParams,
             results: list[Generation | None]) -> None:
        e, C = self._engine, self.C
        assert e is not None
        C.llama_kv_cache_clear(e.ctx)
        generators = None
        if params.seed is not None:
            generators = [torch.Generator().manual_seed(row_seed(params.seed, i)) for i in rows]
        cap = max(max(len(prompts[i]) for i in rows), len(rows))
        batch = C.llama_batch_init(cap, 0, 1)
        try:
            logits = self._prefill(batch, prompts, rows)
            pos = [len(prompts[i]) for i in rows]
            tokens: list[list[int]] = [[] for _ in rows]
            logprobs: list[list[float]] = [[] for _ in rows]
            running = list(range(len(rows)))  # seq ids (= index into rows) still decoding
            for _ in range(params.max_new_tokens):
                gens = [generators[s] for s in running] if generators is not None else None
                chosen, chosen_lp = sample_next(torch.from_numpy(logits), params, gens)
                keep = []
                for s, tok, lp in zip(running, chosen.tolist(), chosen_lp.tolist()):
                    tokens[s].append(tok)
                    logprobs[s].append(lp)
                    done = self._finished(tokens[s], logprobs[s], params)
                    if done is None:
                        keep.append(s)
                    else:
                        results[rows[s]] = done
                        # Its cells stay until the next group: ik_llama.cpp 0.1.5's llama_kv_cache_seq_rm
                        # frees a cell other rows share with it (a prompt prefix), and those rows then
                        # decode from a prefix that is no longer there (their samples went wrong a few
                        # tokens after the first row ended). Every row's cells are budgeted anyway.
                if not keep:
                    break
                running = keep
                parts = []
                for lo in range(0, len(running), self._step_tokens):
                    chunk = running[lo: lo + self._step_tokens]
                    for j, s in enumerate(chunk):
                        self._put(batch, j, tokens[s][-1], pos[s], s, True)
                        pos[s] += 1
                    batch.n_tokens = len(chunk)
                    self._decode(batch)
                    parts.append(self._logits(range(len(chunk))))
                logits = parts[0] if len(parts) == 1 else np.concatenate(parts)
        finally:
            C.llama_batch_free(batch)

    def _prefill(self, batch: Any, prompts: Sequence[list[int]], rows: list[int]) -> np.ndarray:
        """Prompt KV for every row (``rows`` in token order): the prefix a row shares with the row
        before it takes that row's cells, only the rest is decoded; returns the rows' next-token
        logits [len(rows), vocab]."""
        e = self._engine
        assert e is not None
        out = np.empty((len(rows), e.n_vocab), dtype=np.float32)
        for s, i in enumerate(rows):
            p = prompts[i]
            shared = _common_prefix(prompts[rows[s - 1]], p) if s else 0
            if shared == len(p) == len(prompts[rows[s - 1]]):  # the same prompt: its cells and logits
                self._seq_cp(e.ctx, s - 1, s, -1, -1)
                out[s] = out[s - 1]
                continue
            shared = min(shared, len(p) - 1)  # the last prompt token is decoded: its logits are needed
            if shared:
                self._seq_cp(e.ctx, s - 1, s, 0, shared)
            for lo in range(shared, len(p), self._step_tokens):
                chunk = p[lo: lo + self._step_tokens]
                for j, tok in enumerate(chunk):
                    self._put(batch, j, tok, lo + j, s, lo + j == len(p) - 1)
                batch.n_tokens = len(chunk)
                self._decode(batch)
                self.prefilled += len(chunk)
            out[s] = self._logits([len(chunk) - 1])[0]
        return out

    @staticmethod
    def _put(batch: Any, j: int, token: int, pos: int, seq: int, logits: bool) -> None:
        batch.token[j] = token
        batch.pos[j] = pos
        batch.n_seq_id[j] = 1
        batch.seq_id[j][0] = seq
        batch.logits[j] = 1 if logits else 0

    def _decode(self, batch: Any) -> None:
        ret = self.C.llama_decode(self._engine.ctx, batch)  # type: ignore[union-attr]
        if ret != 0:
            raise RuntimeError(f"llama_decode failed ({ret}) on {batch.n_tokens} tokens "
                               f"(context {self.n_ctx} cells: raise rollout.llamacpp_ctx?)")

    def _logits(self, indices: Iterable[int]) -> np.ndarray:
        """The logits rows of the last decode's outputs at batch ``indices``, read in place."""
        e = self._engine
        assert e is not None
        rows = [np.ctypeslib.as_array(self.C.llama_get_logits_ith(e.ctx, j), shape=(e.n_vocab,)) for j in indices]
        return np.stack(rows)  # one copy: the engine overwrites its buffer at the next decode

    def _finished(self, token_ids: list[int], logprobs: list[float], params: SamplingParams) -> Generation | None:
        """The transformers backend's stopping rule (EOS, stop string, length)."""
        if token_ids[-1] in self.eos_ids:
            return _result(token_ids, logprobs, self._decode_text(token_ids[:-1]), "stop")
        if params.stop:
            text = self._decode_text(token_ids)
            end = first_stop_end(text, params.stop)
            if end is not None:
                return _result(token_ids, logprobs, text[:end], "stop")
        if len(token_ids) >= params.max_new_tokens:
            return _result(token_ids, logprobs, self._decode_text(token_ids), "length")
        return None

    def _decode_text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _result(token_ids: list[int], logprobs: list[float], text: str, finish: FinishReason) -> Generation:
    return Generation(token_ids=list(token_ids), logprobs=list(logprobs), text=text, finish=finish)
