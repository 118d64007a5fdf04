"""Tasks and trajectories as Hugging Face datasets (Parquet), in and out.

* ``envace export trajectories RUN --to DIR``: a run's trajectories (train rollouts and evals) as
  a Parquet dataset with a dataset card; ``datasets.load_dataset(DIR)`` reads it back.
* ``envace export tasks FILE|--world W --to DIR``: tasks likewise.
* ``--tasks-file`` (train, eval, rollout) takes such a directory or a ``.parquet`` file besides JSONL.

A task's nested fields (tools, checklist, examples, env, reference) are stored as JSON text: their
shapes differ from task to task (tool schemas, call arguments), which Parquet's fixed column
types cannot hold; a trajectory's messages and verdicts likewise. Reading accepts both JSON text
and native nested values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envace.core.types import Task

TASK_NESTED = ("tools", "checklist", "examples", "env", "reference")
DATA_FILE = "data/train-00000-of-00001.parquet"


def is_dataset_path(path: str | Path) -> bool:
    p = Path(path)
    return p.suffix == ".parquet" or p.is_dir()


def _parquet_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.rglob("*.parquet"))
    if not files:
        raise ValueError(f"{path}: a directory without .parquet files (not an exported dataset)")
    return files


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(``file:row N`` for error messages, row) for every row of a Parquet file or dataset dir."""
    import pyarrow.parquet as pq

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


def trajectory_rows(records: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        msgs = r.get("messages") or []
        rows.append({
            "task_id": r.get("task_id"), "phase": r.get("phase", phase), "step": r.get("step"),
            "source": r.get("source"), "trajectory_index": r.get("trajectory_index", 0),
            "reward": float(r.get("reward", 0.0)), "stop_reason": r.get("stop_reason"),
            "tool_calls": r.get("tool_calls", 0), "parse_failures": r.get("parse_failures", 0),
            "rehearsed_responses": sum(1 for m in msgs if m.get("role") == "tool" and m.get("rehearsed")),
            "real_responses": sum(1 for m in msgs if m.get("role") == "tool" and m.get("rehearsed") is False),
            "messages": json.dumps(msgs, ensure_ascii=False),
            "verdicts": json.dumps(r.get("verdicts") or [], ensure_ascii=False),
        })
    return rows


CARD = """---
configs:
- config_name: default
  data_files: {data_file}
tags: [envace, {kind}]
---

# {title}

{what} exported by `envace export {kind}` from `{source}`: {n} rows.

Columns: {columns}. Nested values ({nested}) are JSON text (their shapes differ row to row).

```python
from datasets import load_dataset
ds = load_dataset("{name}")["train"]
```
"""


def write_dataset(rows: list[dict[str, Any]], to: str | Path, kind: str, source: str, what: str, nested: tuple,
                  force: bool = False) -> Path:
    """Rows as ``DIR/data/*.parquet`` plus a dataset card, written in a temporary sibling and
    renamed into place (an interrupted export leaves nothing half-written)."""
    import shutil

    try:
        from datasets import Dataset
    except ImportError:
        raise ValueError("export needs the `datasets` package: pip install 'envace[datasets]'") from None
    target = Path(to).expanduser()
    if target.exists() and any(target.iterdir()) and not force:
        raise FileExistsError(f"export: {target} exists and is not empty (--force replaces it)")
    if not rows:
        raise ValueError(f"export: {source} has no rows to export")
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    Dataset.from_list(rows).to_parquet(str(tmp / DATA_FILE))
    (tmp / "README.md").write_text(CARD.format(
        data_file=DATA_FILE, kind=kind, title=target.name, what=what, source=source, n=len(rows),
        columns=", ".join(f"`{c}`" for c in rows[0]), nested=", ".join(nested), name=str(target)))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def export_trajectories(run: str | Path, to: str | Path, force: bool = False) -> Path:
    from envace.core.jsonl import read_jsonl_dicts

    run = Path(run)
    rows = []
    for name, phase in (("trajectories.jsonl", "train"), ("evals.jsonl", "eval"), ("committed.jsonl", "commit")):
        f = run / name
        if f.is_file():
            recs = list(read_jsonl_dicts(f))
            if name == "committed.jsonl":  # an eval run: the trajectory sits inside each row
                recs = [{**r["trajectory"], "phase": r.get("condition", "commit")} for r in recs if "trajectory" in r]
            rows += trajectory_rows(recs, phase)
    if not run.is_dir():
        raise FileNotFoundError(f"export: {run}: no such run directory")
    return write_dataset(rows, to, "trajectories", str(run), "Trajectories (every caller turn, every rehearsed "
                         "or real tool response, reward and verdicts)", ("messages", "verdicts"), force)


def export_tasks(tasks: list[Task], to: str | Path, source: str, force: bool = False) -> Path:
    return write_dataset(task_rows(tasks), to, "tasks", source, "Tool-use tasks (instruction, tool schemas, "
                         "checklist, grounding examples, world)", TASK_NESTED, force)
