"""Tasks and trajectories as Hugging Face datasets (Parquet), in and out.

* ``envace export trajectories RUN --to DIR``: a run's trajectories (train rollouts and evals) as
  a conversational tool-calling dataset in the OpenAI / TRL shape: a ``messages`` column of
  ``{role, content, tool_calls, tool_call_id, name, rehearsed}`` (an assistant's calls as
  ``[{"id", "type": "function", "function": {"name", "arguments"}}]``, arguments as JSON text, as
  the OpenAI API writes them) and a ``tools`` column, so ``trl.SFTTrainer`` trains on it as it is.
* ``envace export tasks FILE|--world W --to DIR``: tasks as the HF splits ``train`` and ``test``
  (``data/train-*.parquet``, ``data/test-*.parquet``).
* ``--tasks-file`` (train, eval, rollout) takes such a directory or a ``.parquet`` file besides JSONL.

JSON text where a value's shape differs row to row: Parquet columns have one type, so nested
dicts with differing keys (tool schemas, call arguments, checklist items) would be merged into one
struct of every key seen, ``None`` where a row lacks one, which changes what they say. So a
task's nested fields, the ``tools`` column (TRL's SFTTrainer ``json.loads`` it) and a call's
``arguments`` are JSON text. Reading accepts both JSON text and native nested values.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from envace.core.jsonl import read_jsonl_dicts
from envace.core.prompts import CALLER_SYSTEM
from envace.core.toolcall import parse_tool_calls
from envace.core.types import Task

# envace.experiments.tasks is imported where used: it imports the task checker, which reads Parquet
# rows with this module (an import cycle at module level).

TASK_NESTED = ("tools", "checklist", "examples", "env", "reference")
SPLITS = ("train", "test")


def data_file(split: str) -> str:
    return f"data/{split}-00000-of-00001.parquet"


def is_dataset_path(path: str | Path) -> bool:
    p = Path(path)
    return p.suffix == ".parquet" or p.is_dir()


def _parquet_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.rglob("*.parquet"))
    if not files:
        raise ValueError(f"{path}: a directory without .parquet files (not an exported dataset)")
    # HF split files in split order (train, then test), so a split's rows keep their order
    rank = {s: i for i, s in enumerate(SPLITS)}
    return sorted(files, key=lambda f: (rank.get(f.name.split("-", 1)[0], len(SPLITS)), str(f)))


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(``file:row N`` for error messages, row) for every row of a Parquet file or dataset dir."""
    import pyarrow.parquet as pq  # the datasets extra brings pyarrow

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    out = []
    for f in _parquet_files(p):
        try:
            rows = pq.read_table(f).to_pylist()
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
            raise ValueError(f"{f}: not a readable Parquet file ({type(e).__name__}: {e})") from None
        out += [(f"{f}:row {i + 1}", r) for i, r in enumerate(rows)]
    return out


def load_task_dataset(path: str | Path) -> list[Task]:
    tasks = []
    for where, row in read_rows(path):
        row = {k: v for k, v in row.items() if v is not None}
        for key in TASK_NESTED:
            if isinstance(row.get(key), str):
                try:
                    row[key] = json.loads(row[key])
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: field '{key}': not JSON ({e.msg})") from None
        try:
            tasks.append(Task.model_validate(row))
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise ValueError(f"{where}: field '{loc}': {err['msg']}") from None
    return tasks


def task_rows(tasks: list[Task]) -> list[dict[str, Any]]:
    rows = []
    for t in tasks:
        d = t.model_dump(mode="json")
        for key in TASK_NESTED:
            d[key] = json.dumps(d[key], ensure_ascii=False) if d.get(key) is not None else None
        rows.append(d)
    return rows


def _openai_messages(msgs: list[dict[str, Any]], task: Task | None) -> list[dict[str, Any]]:
    """envace's trajectory messages in the OpenAI / TRL shape. Every message has every key (None
    where it does not apply) so the rows share one Parquet type. With the task known, its caller
    system prompt comes first (the ``tools`` column is rendered into it by the exported chat
    template, as training did)."""
    def msg(role: str, content: str, tool_calls: list | None = None, tool_call_id: str | None = None,
            name: str | None = None, rehearsed: bool | None = None) -> dict[str, Any]:
        return {"role": role, "content": content, "tool_calls": tool_calls, "tool_call_id": tool_call_id,
                "name": name, "rehearsed": rehearsed}

    out = [msg("system", CALLER_SYSTEM.format(domain=task.domain or "customer"))] if task is not None else []
    pending: list[tuple[str, str]] = []  # (id, name) of the last assistant turn's calls, answered in order
    for i, m in enumerate(msgs):
        role, content = m.get("role"), m.get("content") or ""
        calls = m.get("tool_calls") or []
        if role == "assistant" and calls:
            ids = [f"call_{i}_{k}" for k in range(len(calls))]
            pending = [(cid, c.get("name")) for cid, c in zip(ids, calls)]
            # the text outside the <tool_call> tags; the calls themselves go structured
            out.append(msg("assistant", parse_tool_calls(content).content, tool_calls=[
                {"id": cid, "type": "function", "function": {
                    "name": c.get("name"), "arguments": json.dumps(c.get("arguments") or {}, ensure_ascii=False)}}
                for cid, c in zip(ids, calls)]))
        elif role == "tool":
            cid, name = pending.pop(0) if pending else (None, None)
            out.append(msg("tool", content, tool_call_id=cid, name=m.get("name") or name,
                           rehearsed=m.get("rehearsed")))
        else:
            if role == "assistant":
                pending = []
            out.append(msg(role, content))
    return out


def trajectory_rows(records: list[dict[str, Any]], phase: str,
                    tasks: dict[str, Task] | None = None) -> list[dict[str, Any]]:
    tasks = tasks or {}
    rows = []
    for r in records:
        msgs = r.get("messages") or []
        task = tasks.get(r.get("task_id"))
        rows.append({
            "task_id": r.get("task_id"), "phase": r.get("phase", phase), "step": r.get("step"),
            "source": r.get("source"), "trajectory_index": r.get("trajectory_index", 0),
            "reward": float(r.get("reward", 0.0)), "stop_reason": r.get("stop_reason"),
            "tool_calls": r.get("tool_calls", 0), "parse_failures": r.get("parse_failures", 0),
            "rehearsed_responses": sum(1 for m in msgs if m.get("role") == "tool" and m.get("rehearsed")),
            "real_responses": sum(1 for m in msgs if m.get("role") == "tool" and m.get("rehearsed") is False),
            "messages": _openai_messages(msgs, task),
            "tools": (json.dumps([t.model_dump(mode="json") for t in task.tools], ensure_ascii=False)
                      if task is not None else None),
            "verdicts": [{"kind": (v.get("item") or {}).get("kind"), "met": v.get("met"), "detail": v.get("detail", ""),
                          "item": json.dumps(v.get("item") or {}, ensure_ascii=False)}
                         for v in r.get("verdicts") or []],
        })
    return rows


def _front_matter(kind: str, splits: list[str]) -> str:
    files = "".join(f"  - split: {s}\n    path: data/{s}-*\n" for s in splits)
    return (f"---\nconfigs:\n- config_name: default\n  data_files:\n{files}"
            f"tags: [envace, {kind}, tool-use]\n---\n")


def write_dataset(split_rows: dict[str, list[dict[str, Any]]], to: str | Path, kind: str, card_body: str,
                  force: bool = False) -> Path:
    """Rows of each split as ``DIR/data/SPLIT-*.parquet`` plus a dataset card, written in a
    temporary sibling and renamed into place (an interrupted export leaves nothing half-written)."""
    try:
        from datasets import Dataset
    except ImportError:
        raise ValueError("export needs the `datasets` package: pip install 'envace[datasets]'") from None
    target = Path(to).expanduser()
    if target.exists() and any(target.iterdir()) and not force:
        raise FileExistsError(f"export: {target} exists and is not empty (--force replaces it)")
    split_rows = {s: r for s, r in split_rows.items() if r}
    if not split_rows:
        raise ValueError(f"export: nothing to export to {target}")
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    for split, rows in split_rows.items():
        Dataset.from_list(rows).to_parquet(str(tmp / data_file(split)))
    (tmp / "README.md").write_text(_front_matter(kind, list(split_rows)) + card_body)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def run_tasks(run: Path) -> dict[str, Task]:
    """The tasks a run drew from, by id, rebuilt from its config.yaml (a run records task ids
    only); empty when they cannot be rebuilt."""
    from envace.experiments.tasks import select_tasks

    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    try:
        if "worlds" in cfg:  # a training run
            from envace.experiments.config import TrainConfig  # pulls in torch: only for a training run

            c = TrainConfig.model_validate(cfg)
            world, task_file, real_world = ",".join(c.worlds), c.task_file, c.world
            gen = dict(difficulties=c.difficulties, tool_distractors=c.tool_distractors, n_examples=c.n_examples,
                       grounding=c.grounding, tasks_per_world=c.tasks_per_world)
        else:  # an eval or rollout job: the same generator fields where it has them
            task_file = cfg.get("task_file")
            world = None if task_file else cfg.get("world")
            real_world = cfg.get("real_world") or (cfg.get("world") if task_file else None)
            gen = {k: cfg[k] for k in ("difficulties", "tool_distractors", "n_examples", "grounding",
                                       "tasks_per_world") if cfg.get(k) is not None}
        tasks = select_tasks(world, "all", None, task_file, real_world=real_world,
                             trust_task_worlds=bool(cfg.get("trust_task_worlds")), **gen)
    except Exception:  # noqa: BLE001 - a moved task file, an MCP server that is gone: export without tools
        return {}
    return {t.id: t for t in tasks}


TRAJ_CARD = """
# {title}

Trajectories exported by `envace export trajectories` from run `{source}`: {n} rows (every caller turn,
every rehearsed or real tool response, reward and checklist verdicts; `phase` says train or eval).

A conversational tool-calling dataset in the OpenAI / TRL shape: `messages` (role, content, `tool_calls`
as `[{{"id", "type": "function", "function": {{"name", "arguments"}}}}]` with arguments as JSON text,
tool messages with `tool_call_id` and `name`; `rehearsed` says whether a tool response was imagined by
the policy or real) and `tools` (the task's tool schemas as JSON text, which TRL's `SFTTrainer` parses).
{tools_note}
```python
from datasets import load_dataset
ds = load_dataset("path/to/{title}")["train"]
from trl import SFTConfig, SFTTrainer  # trains on it as it is
SFTTrainer(model=..., train_dataset=ds.select_columns(["messages", "tools"]), args=SFTConfig(...)).train()
```

With an envace-exported model, its chat template renders `tools` into the system message exactly
as training did; other models' templates render them their own way.
"""


def export_trajectories(run: str | Path, to: str | Path, force: bool = False, log=print) -> Path:
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"export: {run}: no such run directory")
    records: list[tuple[dict[str, Any], str]] = []
    for name, phase in (("trajectories.jsonl", "train"), ("evals.jsonl", "eval"), ("committed.jsonl", "commit")):
        f = run / name
        if f.is_file():
            recs = list(read_jsonl_dicts(f))
            if name == "committed.jsonl":  # an eval run: the trajectory sits inside each row
                recs = [{**r["trajectory"], "phase": r.get("condition", "commit")} for r in recs if "trajectory" in r]
            records += [(r, phase) for r in recs]
    if not records:
        raise ValueError(f"export: {run} holds no trajectories (trajectories.jsonl, evals.jsonl, committed.jsonl)")
    tasks = run_tasks(run)
    rows = [row for r, phase in records for row in trajectory_rows([r], phase, tasks)]
    missing = sum(1 for r in rows if r["tools"] is None)
    note = (f"\n{missing} of {len(rows)} rows have no `tools` and no system message: their tasks could not "
            "be rebuilt from the run's config.yaml.\n" if missing else "")
    if missing:
        log(f"export: {missing} of {len(rows)} trajectories without tools or system prompt (their tasks could not "
            f"be rebuilt from {run / 'config.yaml'})")
    return write_dataset({"train": rows}, to, "trajectories", TRAJ_CARD.format(
        title=Path(to).name, source=run.resolve().name, n=len(rows), tools_note=note), force)


TASK_CARD = """
# {title}

Tool-use tasks (instruction, tool schemas, checklist, grounding examples, world) exported by
`envace export tasks` from `{source}`: {counts}. Nested values ({nested}) are JSON text (their
shapes differ row to row).

```python
from datasets import load_dataset
ds = load_dataset("path/to/{title}")  # DatasetDict: {splits}
```

`envace train|eval|rollout --tasks-file path/to/{title}` reads it back (both splits; each task
keeps its `split`).
"""


def export_tasks(tasks: list[Task], to: str | Path, source: str, force: bool = False) -> Path:
    from envace.experiments.tasks import file_split

    has_splits = any(t.split is not None for t in tasks)
    split_rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for t, row in zip(tasks, task_rows(tasks)):
        # an unsplit task of a split file is used by both: it goes to train
        split_rows[file_split(t, has_splits) or "train"].append(row)
    counts = ", ".join(f"{len(r)} {s}" for s, r in split_rows.items() if r)
    return write_dataset(split_rows, to, "tasks", TASK_CARD.format(
        title=Path(to).name, source=Path(source).name if source else "tasks", counts=counts,
        nested=", ".join(TASK_NESTED), splits=", ".join(s for s, r in split_rows.items() if r)), force)
