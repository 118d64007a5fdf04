"""The summary's failure-class section names the eval it counts: a schema-only run's eval is
rehearsal-judged, not real."""

from __future__ import annotations

import json

from envace.experiments.failures import FAILURE_CLASSES
from envace.experiments.report import failure_markdown
from envace.experiments.rundir import RunDir


def _run(tmp_path, source: str) -> RunDir:
    path = tmp_path / source
    path.mkdir()
    rows = [{"step": s, "source": source, "task_id": f"t{i}", "trajectory_index": 0, "class": FAILURE_CLASSES[0]}
            for s in (0, 2) for i in range(3)]
    (path / "eval_failures.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return RunDir(path)


def test_the_failure_section_says_which_eval_it_counts(tmp_path):
    schema_only = "\n".join(failure_markdown(_run(tmp_path, "rehearsal")))
    assert "## Why episodes failed (rehearsal-judged eval)" in schema_only and "(real eval)" not in schema_only
    real = "\n".join(failure_markdown(_run(tmp_path, "real")))
    assert "## Why episodes failed (real eval)" in real
