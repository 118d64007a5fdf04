"""docs/method.md's reading list says how long the method is: the line count of each file and the
total are checked against the files here, so the page cannot go stale. After a change to one of
those files, `python tests/test_method_doc.py` rewrites the numbers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from envace.core.jsonl import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "method.md"
ROW = re.compile(r"^\| `(src/[^`]+)` \| (\d+) \|", re.M)
TOTAL = re.compile(r"\((\d+) files, ([\d,]+) lines in all")


def lines(path: str) -> int:
    return len((ROOT / path).read_text(encoding="utf-8").splitlines())


def counted(text: str) -> str:
    """``text`` with every row's and the total's numbers as the files have them now."""
    rows = ROW.findall(text)
    text = ROW.sub(lambda m: f"| `{m.group(1)}` | {lines(m.group(1))} |", text)
    total = sum(lines(path) for path, _ in rows)
    return TOTAL.sub(f"({len(rows)} files, {total:,} lines in all", text, count=1)


def test_the_method_page_counts_the_files_it_lists():
    text = DOC.read_text(encoding="utf-8")
    rows = ROW.findall(text)
    assert rows and TOTAL.search(text), "docs/method.md: no reading list (| `src/...` | N | ...) or total line"
    for path, _ in rows:
        assert (ROOT / path).is_file(), f"docs/method.md lists {path}, which does not exist"
    stale = [f"{path}: {n} in the page, {lines(path)} in the file" for path, n in rows if int(n) != lines(path)]
    assert not stale, "docs/method.md is stale (python tests/test_method_doc.py rewrites it): " + "; ".join(stale)
    assert counted(text) == text, "docs/method.md: the total is stale (python tests/test_method_doc.py rewrites it)"


if __name__ == "__main__":
    atomic_write_text(DOC, counted(DOC.read_text(encoding="utf-8")))
    print(TOTAL.search(DOC.read_text(encoding="utf-8")).group(0), file=sys.stderr)
