"""JSONL load/save: errors name file, line and field; writes are atomic."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class DataFileError(ValueError):
    """A record in a data file is malformed; the message names file, line and field."""

    def __init__(self, path: Path | str, line: int, field: str | None, problem: str):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        where = f"{path}:{line}" + (f": field '{field}'" if field else "")
        super().__init__(f"{where}: {problem}")


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def iter_jsonl(path: Path | str, model: type[M]) -> Iterator[M]:
    """Yield validated records; raise DataFileError at the first bad one."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFileError(path, lineno, None, f"not UTF-8 text ({e.reason} at byte {e.start}); "
                                    "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFileError(path, lineno, None, f"not valid JSON ({e.msg} at column {e.colno})") from None
            try:
                yield model.model_validate(obj)
            except ValidationError as e:
                err = e.errors()[0]
                more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
                raise DataFileError(path, lineno, _field_path(err["loc"]), err["msg"] + more) from None


def load_jsonl(path: Path | str, model: type[M]) -> list[M]:
    return list(iter_jsonl(path, model))


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # even on Ctrl-C: no temp file left behind; re-raised
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dumps_record(record: BaseModel | dict[str, Any]) -> str:
    """One JSON line. Text that UTF-8 cannot carry (a lone surrogate from model output) is
    written as \\u escapes instead of failing the write, so a record always lands and reads back."""
    obj = record.model_dump(mode="json", exclude_none=True) if isinstance(record, BaseModel) else record
    line = json.dumps(obj, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(obj, ensure_ascii=True)
    return line


def save_jsonl(path: Path | str, records: Iterable[BaseModel | dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(dumps_record(r) + "\n" for r in records))


def append_jsonl(path: Path | str, records: Iterable[BaseModel | dict[str, Any]]) -> None:
    """Append whole lines in one write; a crash can at worst leave an incomplete last line,
    which ``iter_jsonl_tolerant`` skips."""
    data = "".join(dumps_record(r) + "\n" for r in records)
    if not data:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl_dicts(path: Path | str, tolerate_torn_tail: bool = True) -> list[dict[str, Any]]:
    """Read an append-only log (metrics, trajectories); a torn last line from a crash is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    # split("\n"), not splitlines(): U+2028, U+0085 ... inside a JSON string are not line ends
    lines = path.read_text(encoding="utf-8").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if tolerate_torn_tail and i == len(lines):
                break
            raise DataFileError(path, i, None, f"not valid JSON ({e.msg})") from None
    return out
