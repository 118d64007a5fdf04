"""Atomic checkpoints: ``<root>/step-00000012/`` is either complete or absent.

A checkpoint is written into ``<root>/.tmp-...`` and renamed into place (same filesystem, so
the rename is atomic); a run killed mid-save leaves only a temp dir, which ``find_latest``
ignores and the next save removes. ``<root>/latest`` names the newest checkpoint and is itself
replaced atomically. Layout of one checkpoint:

* model files in ``save_pretrained`` format at the top (a peft model: its adapter), so the
  directory loads as a Hugging Face model / adapter dir; several models (``noshare``) go to
  one sub-directory each, named by model key;
* ``optimizer.pt`` (or ``optimizer-<key>.pt``), ``scheduler.pt``, ``rng.pt``;
* ``trainer_state.json`` (step, extra), written last.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_model
from torch import nn
from transformers.utils import logging as hf_logging

CHECKPOINT_PREFIX = "step-"
TMP_PREFIX = ".tmp-"
LATEST_FILE = "latest"
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.pt"
SCHEDULER_FILE = "scheduler.pt"
_STEP_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")

ModelArg = nn.Module | Mapping[str, nn.Module]
OptimArg = torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer] | None
# save_checkpoint also takes, per model key, an optimiser state dict already gathered (FSDP).
SavedOptimArg = torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer | Mapping[str, Any]] | None


@dataclass
class LoadedCheckpoint:
    path: Path
    step: int
    extra: dict[str, Any] = field(default_factory=dict)
    rng_state: dict[str, Any] | None = None


# ---------------------------------------------------------------- RNG


def capture_rng_state() -> dict[str, Any]:
    """Python, torch (CPU and CUDA) and, if installed, numpy global RNG states; plain types
    and tensors only, so ``torch.load(weights_only=True)`` reads them back."""
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [py_version, list(py_internal), py_gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np  # optional here: the state is saved without it

        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# ---------------------------------------------------------------- model files


def _is_peft(model: nn.Module) -> bool:
    try:
        from peft import PeftModel  # seconds to import; a model cannot be a PeftModel without it
    except ImportError:
        return False
    return isinstance(model, PeftModel)


@contextmanager
def _no_shard_bar():
    """Hide transformers' "Writing model shards" bar: with a checkpoint every step it floods the
    training log (one bar per save) under the run's own progress bar."""
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _save_model(model: nn.Module, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):  # HF model, or peft (which saves just the adapter)
        with _no_shard_bar():
            model.save_pretrained(directory, safe_serialization=True, **_adapter_save_kwargs(model))
    else:
        save_model(model, str(directory / "model.safetensors"))


EMBEDDING_NAMES = ("embed_tokens", "lm_head", "wte", "word_embeddings", "embed_in", "embed_out")


def _adapter_save_kwargs(model: nn.Module) -> dict:
    """For a peft model whose adapters touch no embedding: ``save_embedding_layers=False``. peft's
    "auto" otherwise looks the base model's name up to compare vocabularies, which for an envace
    alias ("smollm2") or offline warns at every checkpoint that it found no config."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict):
        return {}
    for c in configs.values():
        targets = getattr(c, "target_modules", None) or []
        text = targets if isinstance(targets, str) else " ".join(map(str, targets))
        if any(name in text for name in EMBEDDING_NAMES) or getattr(c, "modules_to_save", None):
            return {}
    return {"save_embedding_layers": False}


def _read_safetensors(directory: Path, single: str, index: str) -> dict[str, torch.Tensor]:
    if (directory / single).exists():
        return load_file(str(directory / single))
    if (directory / index).exists():  # sharded save_pretrained
        files = sorted(set(json.loads((directory / index).read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(directory / f)))
        return state
    raise FileNotFoundError(f"no {single} or {index} in {directory}")


def _load_model(model: nn.Module, directory: Path) -> None:
    if _is_peft(model):
        from peft import set_peft_model_state_dict

        state = _read_safetensors(directory, "adapter_model.safetensors", "adapter_model.safetensors.index.json")
        result = set_peft_model_state_dict(model, state)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"adapter checkpoint {directory} has unexpected keys: {unexpected[:5]}")
        return
    state = _read_safetensors(directory, "model.safetensors", "model.safetensors.index.json")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"checkpoint {directory} has keys the model lacks: {unexpected[:5]}")
    # save_pretrained drops tied weights (lm_head = embeddings); those are fine to be missing
    # as long as they share storage with a loaded tensor.
    params = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
    really_missing = [k for k in missing if k not in params or params[k].data_ptr() not in loaded_ptrs]
    if really_missing:
        raise ValueError(f"checkpoint {directory} lacks model keys: {really_missing[:5]}")


def _as_mapping(obj: Any) -> dict[str, Any]:
    """A single object is stored under key "" (files at the checkpoint's top level)."""
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        for key in obj:
            if not key or "/" in key or key.startswith("."):
                raise ValueError(f"bad model key {key!r}")
        return dict(obj)
    return {"": obj}


def _optimizer_file(key: str) -> str:
    return "optimizer.pt" if not key else f"optimizer-{key}.pt"


# ---------------------------------------------------------------- durability helpers


def _fsync_tree(directory: Path) -> None:
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(dirpath))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{uuid.uuid4().hex}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _remove_tree(path: Path) -> None:
    """Rename away first, so a half-deleted checkpoint never looks like a checkpoint."""
    trash = path.with_name(f"{TMP_PREFIX}trash-{path.name}-{uuid.uuid4().hex}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


# ---------------------------------------------------------------- public API


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def is_complete_checkpoint(path: Path) -> bool:
    return path.is_dir() and _STEP_RE.match(path.name) is not None and (path / STATE_FILE).is_file()


def list_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root``, oldest step first (temp dirs are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and is_complete_checkpoint(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


def find_latest(root: str | os.PathLike[str]) -> Path | None:
    """The checkpoint ``latest`` names if it is complete, else the highest complete step."""
    root = Path(root)
    pointer = root / LATEST_FILE
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if named.parent == root and is_complete_checkpoint(named):
            return named
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def save_checkpoint(
    root: str | os.PathLike[str],
    model: ModelArg,
    optimizer: SavedOptimArg = None,
    step: int = 0,
    rng_state: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    keep_last: int | None = 3,
    scheduler: Any | None = None,
    tokenizer: Any | None = None,
) -> Path:
    """Write ``<root>/step-<step>`` atomically, point ``latest`` at it, keep the newest
    ``keep_last`` checkpoints (None or 0: keep all). ``rng_state`` defaults to the current
    global RNG state (``capture_rng_state()``); ``extra`` must be JSON-serialisable.
    ``optimizer`` may map a model key to a state dict instead of an optimiser (a state gathered
    from shards). Returns the checkpoint path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    state_json = json.dumps(
        {"step": int(step), "extra": dict(extra or {}), "models": sorted(_as_mapping(model)), "saved_at": time.time()},
        indent=2,
    )  # serialise first: a bad `extra` fails before anything is written
    _remove_stale_temps(root)

    tmp = root / f"{TMP_PREFIX}{checkpoint_name(step)}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        for key, m in _as_mapping(model).items():
            _save_model(m, tmp / key if key else tmp)
            if tokenizer is not None:  # beside each model: each model dir loads on its own
                tokenizer.save_pretrained(tmp / key if key else tmp)
        for key, opt in _as_mapping(optimizer).items():
            torch.save(dict(opt) if isinstance(opt, Mapping) else opt.state_dict(), tmp / _optimizer_file(key))
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
        torch.save(dict(rng_state) if rng_state is not None else capture_rng_state(), tmp / RNG_FILE)
        (tmp / STATE_FILE).write_text(state_json)  # last: marks the checkpoint complete
        _fsync_tree(tmp)
        final = root / checkpoint_name(step)
        if final.exists():  # re-saving a step (e.g. after a resume): replace it whole
            _remove_tree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:  # even on Ctrl-C: no half-written checkpoint left behind; re-raised
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(root / LATEST_FILE, final.name + "\n")
    if keep_last:
        for _, old in list_checkpoints(root)[:-keep_last]:
            if old != final:
                _remove_tree(old)
    return final


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a complete checkpoint, else the latest one under it (a checkpoint root)."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    latest = find_latest(path)
    if latest is None:
        raise FileNotFoundError(f"no complete checkpoint in {path}")
    return latest


def load_checkpoint(
    path: str | os.PathLike[str],
    model: ModelArg | None = None,
    optimizer: OptimArg = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
    map_location: str | torch.device = "cpu",
) -> LoadedCheckpoint:
    """Restore in place what is passed: model weights (or adapter), optimizer, scheduler, and
    the global RNG states (``restore_rng``). ``path`` is a checkpoint dir, or a root dir whose
    latest checkpoint is used. Pass the same model/optimizer structure (single or mapping by
    key) that was saved."""
    path = resolve_checkpoint(path)
    state = json.loads((path / STATE_FILE).read_text())
    saved_models = state.get("models", [""])
    for key, m in _as_mapping(model).items():
        if key not in saved_models:
            raise ValueError(f"checkpoint {path} has models {saved_models}, not {key!r}")
        _load_model(m, path / key if key else path)
    for key, opt in _as_mapping(optimizer).items():
        opt.load_state_dict(read_optimizer_state(path, key, map_location))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / SCHEDULER_FILE, map_location=map_location, weights_only=True))
    rng_state = torch.load(path / RNG_FILE, weights_only=True) if (path / RNG_FILE).exists() else None
    if restore_rng and rng_state is not None:
        restore_rng_state(rng_state)
    return LoadedCheckpoint(path=path, step=int(state["step"]), extra=state.get("extra", {}), rng_state=rng_state)


def read_optimizer_state(path: str | os.PathLike[str], key: str = "",
                         map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The optimiser state dict saved in checkpoint ``path`` for model ``key`` ("" for a single
    model), for a caller that loads it itself (into a sharded optimiser)."""
    return torch.load(resolve_checkpoint(path) / _optimizer_file(key), map_location=map_location, weights_only=True)


def _remove_stale_temps(root: Path) -> None:
    """Temp dirs left by a run killed mid-save (one writer per run dir is assumed)."""
    for p in root.iterdir():
        if p.name.startswith(TMP_PREFIX):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
