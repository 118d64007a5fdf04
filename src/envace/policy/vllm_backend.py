"""GenerationBackend over an in-process ``vllm.LLM`` (GPU rollouts), with weight sync from the trainer.

Install with ``pip install 'envace[vllm]'`` on a Linux machine with CUDA. This module imports
without vLLM (so the CPU test-suite and ``envace`` itself never need it); constructing a
:class:`VLLMBackend` without vLLM raises an ImportError that names the extra.

What it does, and what maps to what:

* Prompts go in as token ids (``TokensPrompt``), so vLLM sees exactly the ids the rollout
  rendered. Our :class:`~envace.core.sampling.SamplingParams` map to vLLM's
  (:func:`vllm_sampling_kwargs`): ``max_new_tokens -> max_tokens``, temperature (0 = greedy),
  top_p, stop strings (kept in the output, as our convention wants), a per-prompt seed derived
  from ``seed`` and the prompt's index (so G copies of one prompt get G different samples), and
  ``logprobs=0`` (the sampled token's logprob only).
* Logprobs: the engine is created with ``logprobs_mode="processed_logprobs"``, i.e.
  ``log_softmax(logits / T)``, the same quantity the trainer recomputes (vLLM's default,
  ``raw_logprobs``, ignores the temperature and would bias every PPO ratio when T != 1). With
  ``top_p < 1`` vLLM renormalises over the nucleus; our trainer does not, so keep top_p = 1 for
  training rollouts.
* Outputs map to :class:`Generation` by :func:`generation_from_output`: token ids as vLLM
  sampled them (EOS included when the model stopped), text decoded with our tokenizer under
  the transformers backend's rules (no EOS, cut right after the first stop string).
* Weight sync: :meth:`VLLMBackend.sync_weights` takes the trained module, builds the state dict
  vLLM's loader expects (:func:`vllm_weights`: LoRA merged out of place, wrapper prefixes
  removed) and calls the model's ``load_weights`` in the engine -- directly when the engine
  runs in this process (``distributed_executor_backend="external_launcher"``, the colocated
  setup, or ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), else through ``LLM.collective_rpc`` /
  ``apply_model`` in every worker -- then resets the prefix cache, whose KV entries were
  computed with the old weights.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envace.core.sampling import FinishReason, Generation, SamplingParams
from envace.policy.loading import cache_root, load_model

if TYPE_CHECKING:
    from torch import nn

INSTALL_HINT = ("VLLMBackend needs vLLM, which is an optional extra: pip install 'envace[vllm]' "
                "(Linux with a CUDA GPU). Without a GPU, use TransformersBackend, or serve the model "
                "elsewhere (vllm serve / envace serve) and use HTTPBackend.")

_SEED_STRIDE = 0x9E3779B97F4A7C15  # the transformers backend's per-row stream rule


def row_seed(seed: int, index: int) -> int:
    return (seed * _SEED_STRIDE + index) % (1 << 63)


def import_vllm() -> Any:
    try:
        import vllm  # noqa: PLC0415 - optional, heavy, GPU only
    except ImportError as err:
        raise ImportError(f"{INSTALL_HINT} (import failed: {err})") from err
    return vllm


# ---------------------------------------------------------------------------- parameter mapping


def vllm_sampling_kwargs(params: SamplingParams, seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one prompt (``seed``: that prompt's own)."""
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": params.max_new_tokens,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "logprobs": 0,  # the sampled token's logprob, no alternatives
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "detokenize": True,
    }
    if params.stop:
        kwargs["stop"] = list(params.stop)
    if seed is not None and not params.greedy:
        kwargs["seed"] = int(seed)
    return kwargs


def per_prompt_seeds(params: SamplingParams, n: int) -> list[int | None]:
    if params.seed is None or params.greedy:
        return [None] * n
    return [row_seed(params.seed, i) for i in range(n)]


# ---------------------------------------------------------------------------- output conversion


def _entry_logprob(entry: Any, token: int) -> float:
    """The logprob of ``token`` in one position's logprobs (a dict of token id -> Logprob)."""
    if entry is None:
        return math.nan
    try:
        value = entry[token]
    except (KeyError, IndexError, TypeError):
        return math.nan
    value = getattr(value, "logprob", value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def generation_from_output(output: Any, params: SamplingParams, tokenizer: Any,
                           eos_ids: Iterable[int] = ()) -> Generation:
    """Map a vLLM ``CompletionOutput`` (or a ``RequestOutput``: its first completion) to a Generation.

    ``eos_ids``: token ids that end a row by themselves (the tokenizer's EOS and the model's
    generation-config EOS ids); a final one is kept in ``token_ids`` and left out of ``text``.
    """
    if hasattr(output, "outputs"):  # a RequestOutput
        if not output.outputs:
            raise ValueError(f"vLLM request {getattr(output, 'request_id', '?')} returned no completion")
        output = output.outputs[0]
    reason = getattr(output, "finish_reason", None)
    if reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM completion finished with {reason!r} (aborted or unfinished request)")
    finish: FinishReason = "length" if reason == "length" else "stop"
    ids = [int(t) for t in output.token_ids]
    entries = getattr(output, "logprobs", None)
    if entries is None:
        logprobs = [math.nan] * len(ids)
    else:
        logprobs = [_entry_logprob(entries[i] if i < len(entries) else None, t) for i, t in enumerate(ids)]
    ends = set(int(e) for e in eos_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ends.add(int(tokenizer.eos_token_id))
    stop_reason = getattr(output, "stop_reason", None)
    body = ids
    if finish == "stop" and ids and (ids[-1] in ends or (isinstance(stop_reason, int) and ids[-1] == stop_reason)):
        body = ids[:-1]
    text = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if params.stop:
        cut = [i + len(s) for s in params.stop if (i := text.find(s)) >= 0]
        if cut:
            text = text[: min(cut)]
    return Generation(token_ids=ids, logprobs=logprobs, text=text, finish=finish)


# ---------------------------------------------------------------------------- state dict for vLLM

def clean_param_name(name: str) -> str:
    """Strip wrapper prefixes (DDP ``module.``, torch.compile ``_orig_mod.``, FSDP and activation
    checkpointing wrappers) and peft's ``base_model.model.`` so names match the HF checkpoint."""
    for part in ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    while name.startswith("module."):
        name = name[len("module."):]
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    return name


def _full(t: "torch.Tensor") -> "torch.Tensor":
    full = getattr(t, "full_tensor", None)  # FSDP2 / DTensor: gather the shards
    return (full() if callable(full) else t).detach()


def _lora_layers(model: "nn.Module") -> dict[str, Any]:
    try:
        from peft.tuners.lora import LoraLayer  # peft takes seconds to import; no LoRA without it
    except ImportError:
        return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def vllm_state_dict(model: "nn.Module") -> dict[str, "torch.Tensor"]:
    """:func:`vllm_weights` as a dict (every tensor materialised at once)."""
    return dict(vllm_weights(model))


def vllm_weights(model: "nn.Module") -> Iterator[tuple[str, "torch.Tensor"]]:
    """The model's weights under the names of its Hugging Face checkpoint (what vLLM's
    ``load_weights`` takes), for a plain, wrapped (DDP, compiled, FSDP) or peft LoRA model,
    yielded one at a time (so a sync in buckets never holds more than a bucket of gathered or
    merged tensors).

    LoRA adapters are merged *out of place*: ``W + scaling * B @ A`` per active adapter, the
    trainer's weights untouched (merge-then-unmerge in place would drift them by rounding at
    every sync); ``modules_to_save`` copies replace their originals. LoRA variants (DoRA, ...)
    fall back to ``merge_and_unload`` on a copy. Tensors that need no merge are the model's own
    (no copy); FSDP2 / DTensor shards are gathered to full tensors as they are yielded. A tensor
    shared by two names (tied embeddings) is sent once, under its first name, as in a saved
    checkpoint (vLLM re-ties it).
    """
    layers = _lora_layers(model)
    if any(getattr(m, "lora_variant", {}) for m in layers.values()):
        model, layers = copy.deepcopy(model).merge_and_unload(), {}
    merges = {}
    for name, layer in layers.items():
        merges[f"{name}.base_layer.weight"] = (layer, "weight")
        merges[f"{name}.base_layer.bias"] = (layer, "bias")
    adapters = _active_adapter_names(layers)
    seen: set[tuple[int, tuple[int, ...], str]] = set()
    for key, value in model.state_dict().items():
        if _LORA_SEGMENT.search(key):
            continue  # adapter factors: merged into their base weights below
        name = clean_param_name(key)
        if ".original_module." in name:
            continue  # replaced by its modules_to_save copy
        saved = re.search(r"\.modules_to_save\.([^.]+)\.", name)
        if saved:
            if saved.group(1) not in adapters:
                continue
            name = name.replace(saved.group(0), ".")
        local = getattr(value, "_local_tensor", value)
        if local.numel():
            ident = (local.data_ptr(), tuple(value.shape), str(value.dtype))
            if ident in seen:
                continue
            seen.add(ident)
        if key in merges:
            value = _merged(*merges[key], value)
        yield name.replace(".base_layer.", "."), _full(value)


def _merged(layer: Any, kind: str, value: "torch.Tensor") -> "torch.Tensor":
    """``value`` (the base layer's weight or bias) plus the deltas of the active, unmerged adapters."""
    active = [] if getattr(layer, "disable_adapters", False) else list(layer.active_adapters)
    already = set(getattr(layer, "merged_adapters", []) or [])
    out = _full(value)
    with torch.no_grad():
        for adapter in active:
            if adapter in already or not _has_adapter(layer, adapter):
                continue
            if kind == "weight":
                out = out + _full(layer.get_delta_weight(adapter)).to(out.dtype)
            elif getattr(layer, "lora_bias", {}).get(adapter, False):
                out = out + (_full(layer.lora_B[adapter].bias) * layer.scaling[adapter]).to(out.dtype)
    return out


def _has_adapter(layer: Any, adapter: str) -> bool:
    for attr in ("lora_A", "lora_embedding_A"):
        table = getattr(layer, attr, None)
        if table is not None and adapter in table:
            return True
    return False


def _active_adapter_names(layers: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for layer in layers.values():
        names.update(getattr(layer, "active_adapters", []) or [])
    return names or {"default"}


_LORA_SEGMENT = re.compile(r"(^|\.)lora_[A-Za-z_]+(\.|$)")


def iter_buckets(named: Mapping[str, "torch.Tensor"] | Iterable[tuple[str, "torch.Tensor"]],
                 bucket_bytes: int = 1 << 30) -> Iterator[list[tuple[str, "torch.Tensor"]]]:
    """Group (name, tensor) pairs into lists of about ``bucket_bytes`` (bounds transfer memory)."""
    items = named.items() if isinstance(named, Mapping) else named
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


# ---------------------------------------------------------------------------- engine access


def inprocess_model(llm: Any) -> Any | None:
    """The engine's ``nn.Module`` when the engine runs in this process, else None.

    ``llm.llm_engine.model_executor.driver_worker`` is a worker wrapper: the model runner sits on
    it (older vLLM) or on its ``.worker`` (V1)."""
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    for holder in (worker, getattr(worker, "worker", None)):
        runner = getattr(holder, "model_runner", None)
        model = getattr(runner, "model", None)
        if model is not None and hasattr(model, "load_weights"):
            return model
    return None


def _load_in_worker(model: Any, weights: list[tuple[str, Any]]) -> int:
    device = next(model.parameters()).device
    model.load_weights([(n, t.to(device)) for n, t in weights])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return len(weights)


def load_weights_into(llm: Any, named: Mapping[str, "torch.Tensor"] | Iterable[tuple[str, "torch.Tensor"]],
                      bucket_bytes: int = 1 << 30) -> int:
    """Load (name, tensor) pairs into a ``vllm.LLM``'s model; returns how many were sent.

    In-process engine: ``model.load_weights`` directly (tensors stay on the trainer's device).
    Engine in worker processes: ``LLM.apply_model`` (newer vLLM) or ``collective_rpc`` with a
    function, one bucket at a time, tensors moved to CPU for pickling (vLLM V1 needs
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` to send functions to its workers).
    """
    model = inprocess_model(llm)
    sent = 0
    for bucket in iter_buckets(named, bucket_bytes):
        if model is not None:
            model.load_weights(bucket)
        else:
            cpu = [(n, t.detach().to("cpu")) for n, t in bucket]
            if hasattr(llm, "apply_model"):
                llm.apply_model(lambda m, w=cpu: _load_in_worker(m, w))
            elif hasattr(llm, "collective_rpc"):
                llm.collective_rpc(lambda worker, w=cpu: _load_in_worker(worker.model_runner.model, w))
            else:
                raise RuntimeError("this vLLM version exposes neither an in-process model, LLM.apply_model "
                                   "nor LLM.collective_rpc; cannot sync weights")
        sent += len(bucket)
    reset = getattr(llm, "reset_prefix_cache", None)
    if callable(reset):
        reset()  # cached KV blocks were computed with the old weights
    return sent


# ---------------------------------------------------------------------------- the backend


class VLLMBackend:
    """GenerationBackend over ``vllm.LLM``.

    Pass a built ``llm``, or ``model`` (a local HF directory) plus engine keyword arguments
    (``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``, ``dtype``,
    ``enable_sleep_mode``, ``distributed_executor_backend="external_launcher"`` to colocate one
    engine per training rank, ...). ``tokenizer``: the policy's (default: the engine's).
    """

    def __init__(self, llm: Any = None, *, model: str | None = None, tokenizer: Any = None,
                 logprobs_mode: str | None = "processed_logprobs", **engine_kwargs: Any) -> None:
        vllm = import_vllm()
        if llm is None:
            if model is None:
                raise ValueError("VLLMBackend needs llm=vllm.LLM(...) or model='path/to/hf_model'")
            kwargs = dict(engine_kwargs)
            if logprobs_mode is not None:
                kwargs.setdefault("logprobs_mode", logprobs_mode)
            llm = vllm.LLM(model=model, **kwargs)
        self.llm = llm
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        self._vllm = vllm
        self.eos_ids = _engine_eos_ids(llm, self.tokenizer)

    @classmethod
    def from_spec(cls, spec: str, cache_dir: str | None = None, **engine_kwargs: Any) -> "VLLMBackend":
        """A backend for any :func:`envace.policy.loading.load_model` spec: a local HF directory is
        used as is; other specs (``smollm2``, a .gguf, a LoRA adapter) are saved once as a merged
        HF directory (vLLM loads from disk) under ``cache_dir`` (default: envace's cache)."""
        path = Path(spec).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            return cls(model=str(path), **engine_kwargs)
        target = Path(cache_dir) if cache_dir else cache_root() / "vllm" / re.sub(r"[^A-Za-z0-9_.-]+", "_", spec)
        if not (target / "config.json").is_file():
            model, tokenizer = load_model(spec, merge_lora=True)
            target.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(target)
            tokenizer.save_pretrained(target)
        return cls(model=str(target), **engine_kwargs)

    @classmethod
    def colocated(cls, model: str, accelerator: Any = None, gpu_memory_utilization: float = 0.3,
                  **engine_kwargs: Any) -> "VLLMBackend":
        """One engine per training rank, in the rank's own process and on its GPU, next to the
        trainer (the layout of docs/scaling.md): ``external_launcher`` makes vLLM use the process
        group ``accelerate launch`` set up instead of spawning workers, so weight sync is a
        direct ``load_weights`` on the same device. Each rank samples with its own seed."""
        rank = int(getattr(accelerator, "process_index", 0) or 0)
        kwargs = {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1,
                  "gpu_memory_utilization": gpu_memory_utilization, "seed": rank, **engine_kwargs}
        return cls(model=model, **kwargs)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; a prompt needs at least one token")
        if not prompts:
            return []
        inputs = [_tokens_prompt(self._vllm, p) for p in prompts]
        seeds = per_prompt_seeds(params, len(prompts))
        if all(s is None for s in seeds):
            sampling: Any = self._vllm.SamplingParams(**vllm_sampling_kwargs(params))
        else:
            sampling = [self._vllm.SamplingParams(**vllm_sampling_kwargs(params, s)) for s in seeds]
        outputs = self.llm.generate(inputs, sampling_params=sampling, use_tqdm=False)
        return [generation_from_output(o, params, self.tokenizer, self.eos_ids) for o in outputs]

    def sync_weights(self, model: "nn.Module", bucket_bytes: int = 1 << 30) -> int:
        """Push ``model``'s current weights (LoRA merged) into the engine; returns tensors sent."""
        return load_weights_into(self.llm, vllm_weights(model), bucket_bytes)

    def load_weights(self, named: Mapping[str, "torch.Tensor"] | Iterable[tuple[str, "torch.Tensor"]]) -> int:
        """Push already prepared (HF-named) tensors into the engine."""
        return load_weights_into(self.llm, named)

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory for the training step (needs ``enable_sleep_mode=True``)."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        self.llm.wake_up(tags=list(tags) if tags is not None else None)


def _tokens_prompt(vllm: Any, ids: list[int]) -> Any:
    try:
        from vllm.inputs import TokensPrompt  # a TypedDict: a plain dict works the same
    except ImportError:
        return {"prompt_token_ids": list(ids)}
    return TokensPrompt(prompt_token_ids=list(ids))


def _engine_eos_ids(llm: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    try:
        gen_cfg = llm.llm_engine.model_config.try_get_generation_config()
        eos = gen_cfg.get("eos_token_id") if isinstance(gen_cfg, dict) else None
    except Exception:  # noqa: BLE001 - best effort across vLLM versions
        eos = None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return frozenset(ids)
