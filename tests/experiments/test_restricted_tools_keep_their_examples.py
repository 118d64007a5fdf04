"""Tasks shown only some of their world's tools (``--tool-distractors``) keep only the recorded
examples of the tools they still show, so an exported file loads back as a task file."""

from __future__ import annotations

from envace.cli.main import main
from envace.experiments.tasks import restrict_tools, select_tasks


def test_exported_restricted_tasks_load_back_and_keep_the_examples_of_their_tools(tmp_path):
    out = tmp_path / "shop_tasks"
    assert main(["export", "tasks", "--world", "shop", "--tool-distractors", "1", "--to", str(out)]) == 0
    tasks = select_tasks(None, "all", task_file=out)  # the task check refused examples of removed tools
    assert len(tasks) > 0
    for t in tasks:
        shown = {x.name for x in t.tools}
        assert all(e.tool in shown for e in t.examples), t.id
        assert all(c.name in shown for c in t.reference.calls), t.id  # the reference's tools are kept
    full = select_tasks("shop", "all", tool_distractors=None)
    dropped = sum(len(t.examples) - len(restrict_tools(t, 1).examples) for t in full)
    kept = sum(len(restrict_tools(t, 1).examples) for t in full)
    assert dropped > 0 and kept > 0  # some examples were of removed tools, the others stay
