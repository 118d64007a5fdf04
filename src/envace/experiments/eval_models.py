"""Which model(s) an evaluation loads for ``--model``: a spec, or a training checkpoint.

A training checkpoint (``runs/<id>/checkpoints/step-00000020``, written by
:mod:`envace.train.checkpoint`) holds its model files at the top when it saved one bare model, or
in one sub-directory per model key otherwise: ``policy/`` (share and frozen_caller modes),
``caller/`` and ``simulator/`` (noshare), ``caller/`` alone (caller_only, whose simulator was
frozen and is not saved). The caller model acts; the simulator-role model rehearses (the
caller itself where there is no separate one). The prompt style of the training run (its
``config.yaml`` two levels up) is used when found, so the model sees the prompts it learned on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envace.core.prompts import PromptStyle
from envace.policy.llamacpp_backend import LlamaCppBackend, import_binding
from envace.policy.loading import ModelSpecError, load_model
from envace.policy.transformers_backend import TransformersBackend, generation_dtype
from envace.train.checkpoint import find_latest

_MODEL_FILES = ("config.json", "adapter_config.json")


@dataclass
class EvalModels:
    caller: str  # a spec load_model accepts
    simulator: str  # the model that rehearses (== caller for shared-parameter checkpoints)
    notes: list[str] = field(default_factory=list)
    style: PromptStyle | None = None  # the training run's prompt style, when found
    run_config: dict[str, Any] | None = None  # the training run's config.yaml, when found

    @property
    def shared(self) -> bool:
        return self.caller == self.simulator


def _loadable(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in _MODEL_FILES)


def run_dir_of(ckpt: Path) -> Path | None:
    """The run directory (the one holding config.yaml) of ``<run>/checkpoints/step-N``, of
    ``<run>/sft``, or of a model sub-directory of either."""
    return next((d for d in (ckpt.parent.parent, ckpt.parent, ckpt.parent.parent.parent)
                 if (d / "config.yaml").is_file()), None)


EXPORT_CONFIG = "envace_train_config.yaml"  # beside the weights of an `envace export model` directory


def exported_config(model_dir: Path) -> dict[str, Any] | None:
    """The training config an exported model directory carries (its paths cut to their last part)."""
    try:
        cfg = yaml.safe_load((model_dir / EXPORT_CONFIG).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return cfg if isinstance(cfg, dict) else None


def run_config(ckpt: Path) -> dict[str, Any] | None:
    """The ``config.yaml`` of :func:`run_dir_of`, when it is a training config; for an exported
    model directory, the training config it carries."""
    exported = exported_config(ckpt)
    if exported is not None:
        return exported
    run = run_dir_of(ckpt)
    if run is None:
        return None
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
    except yaml.YAMLError:
        return None
    # only a training run's config counts (an eval run's has the eval job's fields)
    return cfg if isinstance(cfg, dict) and "rehearse" not in cfg else None


def train_style(cfg: dict[str, Any] | None) -> PromptStyle | None:
    """The prompt section of a training run's config."""
    prompt = cfg.get("prompt") if cfg else None
    if isinstance(prompt, dict):
        known = {k: v for k, v in prompt.items() if k in PromptStyle.model_fields}
        try:
            return PromptStyle(**known)
        except ValueError:  # pydantic's ValidationError: a config from another version; no style then
            return None
    return None


def resolve_eval_models(spec: str) -> EvalModels:
    """Map ``--model`` to the caller and simulator specs, with a note of what was chosen.

    Raises FileNotFoundError for a path that does not exist, ValueError for a directory that
    holds no model; named specs (``smollm2``, ``tiny``) pass through to ``load_model``.
    """
    spec = spec.strip()
    if not spec:
        raise ValueError("--model is empty")
    looks_like_path = "/" in spec or spec.startswith(".") or spec.startswith("~")
    path = Path(spec).expanduser()
    if not path.exists():
        if looks_like_path:
            raise FileNotFoundError(f"model {spec!r}: no such file or directory")
        return EvalModels(caller=spec, simulator=spec)  # a named spec; load_model checks it
    if path.is_file():
        return EvalModels(caller=spec, simulator=spec)
    roles = ("policy", "caller", "simulator")
    latest = None if _loadable(path) or any(_loadable(path / r) for r in roles) else find_latest(path)
    if latest is not None:  # a checkpoint root (RUN/checkpoints, RUN/sft): its latest checkpoint
        path = latest
    cfg = run_config(path)
    style = train_style(cfg)
    source = "the run's config.yaml"
    if exported_config(path) is not None:
        # An exported model: its prompt and rollout caps are the run's; its task file and world
        # names are cut to their last part and would point nowhere here, so they are not taken.
        cfg = {k: v for k, v in (cfg or {}).items() if k in ("prompt", "rollout")}
        source = f"the export's {EXPORT_CONFIG}"
    if _loadable(path):
        return EvalModels(caller=str(path), simulator=str(path), style=style, run_config=cfg,
                          notes=[f"training prompt style from {source}: {style}"] if style else [])
    subdirs = {p.name: p for p in path.iterdir() if _loadable(p)}
    notes = []
    if style:
        notes.append(f"training prompt style from {source}: {style}")
    if "policy" in subdirs:
        notes.insert(0, f"{path} is a checkpoint with a shared policy: using {subdirs['policy']} for both roles")
        return EvalModels(caller=str(subdirs["policy"]), simulator=str(subdirs["policy"]), notes=notes, style=style,
                          run_config=cfg)
    if "caller" in subdirs:
        sim = subdirs.get("simulator", subdirs["caller"])
        why = ("its simulator model" if "simulator" in subdirs
               else "the caller (the checkpoint holds no trained simulator)")
        notes.insert(0, f"{path} is a two-model checkpoint: acting with {subdirs['caller']}, rehearsing with {why}")
        return EvalModels(caller=str(subdirs["caller"]), simulator=str(sim), notes=notes, style=style,
                          run_config=cfg)
    state = path / "trainer_state.json"
    held = ""
    if state.is_file():
        try:
            held = f" (trainer_state.json lists models {json.loads(state.read_text()).get('models')})"
        except (json.JSONDecodeError, OSError):
            pass
    entries = sorted(p.name for p in path.iterdir())[:12]
    raise ValueError(f"model {spec!r} is a directory without a model: no config.json or adapter_config.json "
                     f"at its top or in policy/ or caller/{held}; it holds {entries}")


def load_eval_backend(spec: str, max_batch: int = 16, device: str = "cpu", dtype: str = "float32",
                      kv_reuse_tokens: int = 0, llamacpp_quant: str | None = None) -> Any:
    """Load a backend, turning any loading failure (a checkpoint that does not match its base,
    a corrupt file) into a one-line ValueError. ``dtype``: what generation runs in (the weights
    load in fp32, as training saw them, and a copy is cast: the same path as rollout.dtype).
    ``llamacpp_quant``: generate on llama.cpp instead, the weights written in this encoding."""
    if llamacpp_quant is not None:
        import_binding()  # without the extra: an ImportError naming it, before any loading
    low = generation_dtype(dtype)
    try:
        model, tokenizer = load_model(spec)
        if llamacpp_quant is not None:
            return LlamaCppBackend(tokenizer, model, quant=llamacpp_quant, max_batch=max_batch)
        return TransformersBackend(model, tokenizer, max_batch=max_batch, device=device, dtype=low,
                                   kv_reuse_tokens=kv_reuse_tokens)
    except (ModelSpecError, FileNotFoundError):  # already name the spec and say what is accepted
        raise
    except Exception as e:  # noqa: BLE001 - peft/safetensors/torch raise many kinds
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot load model {spec!r}: {type(e).__name__}: {first[:300]}") from e
