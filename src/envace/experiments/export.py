"""``envace export model``: a training checkpoint as a plain transformers model directory.

LoRA is merged into the base weights (``--no-merge``: the adapter, with its base model in
``base/``), the tokenizer is written beside them with a chat template that renders ``tools=`` as
training did (experiments/chat_template.py), and a model card (README.md) states the base model,
licence, the run's config and its measured evals, so the directory loads with
``AutoModelForCausalLM`` / ``AutoPeftModelForCausalLM`` and ``AutoTokenizer`` alone and with
``envace eval --model DIR``. The directory is written in a temporary sibling and renamed into
place: an interrupted export leaves no half-written model.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envace.core.prompts import PromptStyle
from envace.experiments.chat_template import MARK, export_chat_template
from envace.experiments.eval_models import resolve_eval_models, run_config, run_dir_of, train_style
from envace.policy.loading import load_model
from envace.train.checkpoint import resolve_checkpoint

BASE_DIR = "base"  # --no-merge: the adapter's base model, inside the export
SMOLLM2_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class BaseModel:
    """What a model card says about the model training started from."""

    hub_id: str | None  # the card's base_model (None: no hub model, e.g. trained from scratch)
    license: str
    what: str  # one sentence for the card


def base_model_of(spec: str | None, seen: int = 0) -> BaseModel:
    """The real base of an envace model spec: ``smollm2`` is SmolLM2-135M-Instruct; ``tiny`` and
    ``llama:`` are randomly initialised (trained from scratch, SmolLM2's Apache-2.0 tokenizer); a
    local directory says so in its own card (an earlier export) or through its training run."""
    spec = (spec or "").strip()
    if spec == "smollm2" or Path(spec).name.startswith("SmolLM2-135M-Instruct"):
        return BaseModel(SMOLLM2_HUB, "apache-2.0", f"fine-tuned from [{SMOLLM2_HUB}](https://huggingface.co/"
                                                    f"{SMOLLM2_HUB})")
    if spec == "tiny" or spec.startswith(("tiny:", "llama:")):
        return BaseModel(None, "apache-2.0", f"trained from scratch (a randomly initialised Llama, `{spec}`, "
                                             "with SmolLM2's tokenizer)")
    path = Path(spec).expanduser()
    if path.is_dir() and seen < 4:
        meta = card_metadata(path / "README.md")
        if meta.get("base_model") or meta.get("license"):
            hub = meta.get("base_model")
            hub = hub if isinstance(hub, str) else None
            return BaseModel(hub, str(meta.get("license") or "other"),
                             f"fine-tuned from a local model that was itself based on {hub}" if hub
                             else f"fine-tuned from a local model (`{path.name}`)")
        adapter = path / "adapter_config.json"
        if adapter.is_file():
            return base_model_of(json.loads(adapter.read_text()).get("base_model_name_or_path"), seen + 1)
        cfg = run_config(path)
        if cfg and cfg.get("model"):
            return base_model_of(str(cfg["model"]), seen + 1)
    name = Path(spec).name if spec else "unknown"
    return BaseModel(None, "other", f"fine-tuned from a local model (`{name}`) whose origin envace cannot tell")


def card_metadata(readme: Path) -> dict[str, Any]:
    """The YAML front matter of a model card (empty when there is none)."""
    try:
        text = readme.read_text()
    except OSError:
        return {}
    if not text.startswith("---\n") or "\n---" not in text[4:]:
        return {}
    try:
        meta = yaml.safe_load(text[4:text.index("\n---", 4)])
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _checkpoint_of(path: Path) -> Path:
    """A run directory means its latest checkpoint; a checkpoint or model directory is itself."""
    if (path / "checkpoints").is_dir():
        return resolve_checkpoint(path / "checkpoints")
    return path


def _short(value: Any) -> Any:
    """Paths of the exporting machine shortened to their last part (a card travels; they do not),
    also inside a command line such as ``mcp:python /home/me/server.py``."""
    if isinstance(value, str):
        return " ".join(Path(w.replace("\\", "/")).name or w
                        if w.startswith(("/", "~")) or (len(w) > 2 and w[1:3] in (":\\", ":/")) else w
                        for w in value.split(" "))
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_short(v) for v in value]
    return value


def eval_rows(run: Path) -> list[dict[str, Any]]:
    """The run's eval rows of metrics.jsonl (``phase: eval``)."""
    rows = []
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            if isinstance(r, dict) and r.get("phase") == "eval":
                rows.append(r)
    return rows


def _results(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No eval rows in the run's metrics.jsonl."
    keys = list(dict.fromkeys(k for r in rows for k, v in r.items()
                              if k.startswith("eval/") and isinstance(v, (int, float))))
    head = "| step | eval | " + " | ".join(k.removeprefix("eval/") for k in keys) + " |"
    lines = [head, "|" + "---|" * (len(keys) + 2)]
    for r in rows:
        vals = [f"{r[k]:.3f}" if isinstance(r.get(k), (int, float)) else "" for k in keys]
        lines.append(f"| {r.get('step')} | {r.get('eval_kind', 'real')} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


_CARD_KEYS = ("model", "mode", "source", "worlds", "task_file", "world", "difficulties", "tool_distractors",
              "tasks_per_world", "steps", "tasks_per_step", "group_size", "seed")


def _front_matter(base: BaseModel, adapter: bool, lora: bool) -> str:
    meta: dict[str, Any] = {}
    if base.hub_id:
        meta["base_model"] = base.hub_id
    meta["license"] = base.license
    meta["pipeline_tag"] = "text-generation"
    meta["library_name"] = "peft" if adapter else "transformers"
    meta["tags"] = ["envace", "tool-use", "function-calling", "world-rehearsal", "grpo"] + (["lora"] if lora else [])
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _weights_line(lora: dict[str, Any] | None, merge: bool, cfg: dict[str, Any]) -> str:
    if lora is None:
        if not cfg:
            return "Weights: the source directory's full weights (it holds no LoRA adapter)."
        if (cfg.get("lora") or {}).get("enabled") is False:
            return "Weights: all weights trained (LoRA off in this run); nothing was merged."
        return "Weights: the checkpoint's full weights (it holds no LoRA adapter); nothing was merged."
    what = f"LoRA (r={lora.get('r')}, alpha={lora.get('lora_alpha')})"
    if merge:
        return f"Weights: the base weights with the trained {what} adapter merged into them."
    return (f"Weights: the trained {what} adapter, not merged (`adapter_config.json`, "
            f"`adapter_model.safetensors`), on its base model in `{BASE_DIR}/`.")


USE_MERGED = """```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("path/to/{name}")
tokenizer = AutoTokenizer.from_pretrained("path/to/{name}")
```"""

USE_ADAPTER = """```python
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer
model = AutoPeftModelForCausalLM.from_pretrained("path/to/{name}")  # the adapter on {base_dir}/
tokenizer = AutoTokenizer.from_pretrained("path/to/{name}")
```

`adapter_config.json` names `{base_dir}/` by the absolute path it had when exported (peft looks a base
up from the working directory, not from the adapter's). After moving the directory, load the two
parts yourself: `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("path/to/{name}/{base_dir}"),
"path/to/{name}")`, or export again."""

CARD = """# {name}

A tool-using agent trained with [envace](https://pypi.org/project/envace/) (world-rehearsal role-wise
GRPO: one policy acts and rehearses its tools' responses), {base}. Exported from run `{run}`,
checkpoint `{checkpoint}`, by `envace export model`.

{weights}

## Training

| setting | value |
|---|---|
{settings}

Paths of the exporting machine are shortened to their last part; the whole config is in
`envace_train_config.yaml`.

## Measured results

The run's own evals (from its metrics.jsonl): `real` rows ran the tasks in their real
environment, `rehearsal` rows were judged on what the trajectory shows.

{results}

## Use

{use}

Prompt it the way it was trained, with its tools:

```python
messages = [{{"role": "user", "content": "Cancel my last order."}}]
ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, domain="{domain}")
```

The chat template renders `tools` (OpenAI function schemas) into the system message the way
training did ({fmt} format) and structured `tool_calls` in assistant messages as the text the
model writes: `<tool_call>\\n{{"name": ..., "arguments": {{...}}}}\\n</tool_call>`. Without a system
message it puts envace's caller prompt first; `domain=` names the service in it (default
`{domain}`). `envace eval --model path/to/{name} ...` evaluates it.
"""


def _format_name(tok: Any, style: PromptStyle | None) -> str:
    fmt = style.tool_format if style else "compact"
    # native on a template that takes no tools (so it was wrapped): training fell back to the compact text
    return "compact" if fmt == "native" and tok.chat_template.startswith(MARK) else fmt


def _single_domain(cfg: dict[str, Any] | None) -> str:
    """The run's one task domain when it has one (the chat template's default), else customer."""
    worlds = cfg.get("worlds") if cfg else None
    if cfg and not cfg.get("task_file") and isinstance(worlds, list) and len(worlds) == 1:
        return str(worlds[0])  # the embedded worlds' tasks name their world as domain
    return "customer"


def export_model(source: str, to: str, role: str = "caller", merge: bool = True, force: bool = False,
                 log=print) -> Path:
    src = _checkpoint_of(Path(source).expanduser())
    if not src.exists():
        raise FileNotFoundError(f"export: {source}: no such run, checkpoint or model directory")
    if role not in ("caller", "simulator"):
        raise ValueError(f"export: --role must be caller or simulator, not {role!r}")
    models = resolve_eval_models(str(src))
    spec = models.caller if role == "caller" else models.simulator
    target = Path(to).expanduser().absolute()
    if target.exists() and any(target.iterdir()) and not force:
        raise FileExistsError(f"export: {target} exists and is not empty (--force replaces it)")
    adapter_cfg = Path(spec) / "adapter_config.json"
    lora = json.loads(adapter_cfg.read_text()) if adapter_cfg.is_file() else None
    if lora is None and not merge:
        log("export: the checkpoint holds no LoRA adapter (LoRA off): nothing to keep unmerged, "
            "exporting the full model")
        merge = True
    cfg: dict[str, Any] = run_config(src) or {}
    base = base_model_of(str(cfg.get("model") or (lora or {}).get("base_model_name_or_path") or spec))
    model, tok = load_model(spec, merge_lora=merge)
    domain = _single_domain(cfg)
    tok.chat_template = export_chat_template(tok, train_style(cfg), domain)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with warnings.catch_warnings():
        # peft looks for the base's config.json under its spec name ("tiny") to see whether the
        # vocabulary grew; it did not (the tokenizer is the base's), and base/ is written below
        warnings.filterwarnings("ignore", message="Could not find a config file")
        model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if not merge:
        # The base beside the adapter, and the adapter pointed at it: AutoPeftModelForCausalLM
        # then loads the directory with no hub and no envace.
        base_model = model.unload()
        base_model.save_pretrained(tmp / BASE_DIR, safe_serialization=True)
        tok.save_pretrained(tmp / BASE_DIR)
        ac = json.loads((tmp / "adapter_config.json").read_text())
        ac["base_model_name_or_path"] = str(target / BASE_DIR)
        (tmp / "adapter_config.json").write_text(json.dumps(ac, indent=2) + "\n")
    run = run_dir_of(src)
    settings = "\n".join(f"| {k} | `{json.dumps(_short(cfg[k]))}` |" for k in _CARD_KEYS if cfg.get(k) is not None)
    checkpoint = src.name if run is not None else "-"
    card = _front_matter(base, adapter=not merge, lora=lora is not None) + CARD.format(
        name=target.name, base=base.what, run=run.name if run is not None else src.name, checkpoint=checkpoint,
        weights=_weights_line(lora, merge, cfg), settings=settings or "| (no training config found) | |",
        results=_results(eval_rows(run)) if run is not None else "No training run found.",
        use=(USE_MERGED if merge else USE_ADAPTER).format(name=target.name, base_dir=BASE_DIR),
        domain=domain, fmt=_format_name(tok, train_style(cfg)))
    (tmp / "README.md").write_text(card)
    if cfg:
        (tmp / "envace_train_config.yaml").write_text(yaml.safe_dump(_short(cfg), sort_keys=False))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    log(f"exported {Path(spec).name if Path(spec).exists() else spec} ({role}, "
        f"{'LoRA merged' if merge and lora else 'LoRA adapter on base/' if lora else 'LoRA off'}) to {target}")
    return target
