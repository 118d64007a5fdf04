"""``envace export model``: a training checkpoint as a plain transformers model directory.

LoRA is merged into the base weights, the tokenizer and its chat template are written beside
them, and a model card (README.md) states the run's config, data and measured results, so the
directory loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer`` alone and with
``envace eval --model DIR``. The directory is written in a temporary sibling and renamed into
place: an interrupted export leaves no half-written model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from envace.experiments.eval_models import resolve_eval_models, run_config, run_dir_of

CARD = """---
library_name: transformers
tags: [envace, tool-use, world-rehearsal, grpo]
---

# {name}

A tool-using agent trained with envace (world-rehearsal role-wise GRPO: one
policy acts and rehearses its tools' responses). Exported from `{source}` by `envace export model`
(LoRA merged: {merged}).

## Training

| setting | value |
|---|---|
{settings}

## Measured results (the run's own real-world evals)

{results}

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("{name}")
tokenizer = AutoTokenizer.from_pretrained("{name}")
```

or `envace eval --model {name} ...`. Tool calls are written as `<tool_call>{{"name": ..., "arguments": ...}}</tool_call>`.
"""

_CARD_KEYS = ("model", "mode", "source", "worlds", "task_file", "world", "difficulties", "tool_distractors",
              "tasks_per_world", "steps", "tasks_per_step", "group_size", "seed")


def _checkpoint_of(path: Path) -> Path:
    """A run directory means its latest checkpoint; a checkpoint or model directory is itself."""
    if (path / "checkpoints").is_dir():
        from envace.train.checkpoint import resolve_checkpoint

        return resolve_checkpoint(path / "checkpoints")
    return path


def _results(run: Path) -> str:
    rows = []
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            if isinstance(r, dict) and r.get("phase") == "eval":
                vals = ", ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in r.items()
                                 if k.startswith("eval/") and isinstance(v, (int, float)))
                rows.append(f"| {r.get('step')} | {r.get('eval_kind', 'real')} | {vals} |")
    if not rows:
        return "No eval rows in the run's metrics.jsonl."
    return "| step | eval | metrics |\n|---|---|---|\n" + "\n".join(rows)


def export_model(source: str, to: str, role: str = "caller", merge: bool = True, force: bool = False,
                 log=print) -> Path:
    from envace.policy.loading import load_model

    src = _checkpoint_of(Path(source).expanduser())
    if not src.exists():
        raise FileNotFoundError(f"export: {source}: no such run, checkpoint or model directory")
    if role not in ("caller", "simulator"):
        raise ValueError(f"export: --role must be caller or simulator, not {role!r}")
    models = resolve_eval_models(str(src))
    spec = models.caller if role == "caller" else models.simulator
    target = Path(to).expanduser()
    if target.exists() and any(target.iterdir()) and not force:
        raise FileExistsError(f"export: {target} exists and is not empty (--force replaces it)")
    model, tok = load_model(spec, merge_lora=merge)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    cfg: dict[str, Any] = run_config(src) or {}
    run = run_dir_of(src)
    settings = "\n".join(f"| {k} | `{json.dumps(cfg[k])}` |" for k in _CARD_KEYS if cfg.get(k) is not None)
    card = CARD.format(name=target.name, source=src, merged="yes" if merge else "no (an adapter)",
                       settings=settings or "| (no training config found) | |",
                       results=_results(run) if run is not None else "No training run found.")
    (tmp / "README.md").write_text(card)
    if cfg:
        (tmp / "envace_train_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    log(f"exported {spec} ({role}{', LoRA merged' if merge else ''}) to {target}")
    return target
