"""The rehearsal gap beside a real eval: a tiny random model rehearses for a scripted caller on real
shop tasks; and a training run writes eval/success and eval/rehearsal_success side by side."""

import json

from envace.core.prompts import PromptStyle
from envace.core.toolcall import format_tool_call
from envace.core.types import ToolCall
from envace.envs.tasks import load_tasks
from envace.experiments.gap import gap_metrics, gap_sources, run_gap
from envace.rollout.actors import ActorTurn
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource


class CallFirstExample:
    """Calls each task's first recorded example (arguments reordered), then answers."""

    def act(self, views, turn):
        out = []
        for v in views:
            ex = v.task.examples[0]
            call = ToolCall(name=ex.tool, arguments=dict(reversed(list(ex.arguments.items()))))
            out.append(ActorTurn(text=format_tool_call(call) if turn == 0 else "done"))
        return out


def test_the_gap_compares_real_and_rehearsal_judged_and_measures_fidelity(tiny_backend):
    tasks = [t for t in load_tasks("shop", "test", limit=30) if t.examples][:2]
    source = RealSource()
    try:
        real, _ = run_episodes(tasks, CallFirstExample(), source, RolloutConfig(max_turns=2))
    finally:
        source.close()
    for recorded in (True, False):
        sources = gap_sources(tiny_backend, PromptStyle(), 6, 0.0, 0, examples_as_recorded=recorded)
        parts = run_gap(tasks, real, CallFirstExample(), sources, max_turns=2)
        assert [t.task_id for t in parts.rehearsal] == [t.id for t in tasks]
        assert all(t.source == "rehearsal" for t in parts.rehearsal)
        policy = [p for p in parts.pairs if p.origin == "policy"]
        examples = [p for p in parts.pairs if p.origin == "example"]
        assert len(policy) == 2 and len(examples) == sum(len(t.examples) for t in tasks)
        assert all(p.as_recorded == recorded for p in policy)
        assert all(p.recorded_exact is True for p in policy)  # the examples record the initial state
        m = gap_metrics(tasks, real, parts)
        assert m["eval/fidelity_n"] == 2 and m["eval/example_n"] == len(examples)
        assert m["eval/fidelity_as_recorded"] == float(recorded)
        assert m["eval/rehearsal_as_recorded"] == 1.0  # one recorded call per rehearsal-judged episode
        if recorded:  # answered from the record, which equals what the real tool returned
            assert m["eval/fidelity_exact"] == 1.0
            reh_tool = [msg for msg in parts.rehearsal[0].messages if msg.role == "tool"]
            assert json.loads(reh_tool[0].content) == tasks[0].examples[0].result
        assert m["eval/rehearsal_gap"] == m["eval/rehearsal_success"] - sum(t.solved for t in real) / 2


def test_a_training_run_logs_both_eval_columns_and_the_failure_classes(tmp_path):
    import yaml

    from envace.experiments.config import load_config
    from envace.experiments.train_job import train

    cfg = {"model": "tiny", "worlds": ["shop"], "difficulties": [1], "tool_distractors": 0, "steps": 1,
           "tasks_per_step": 1, "group_size": 2, "threads": 1,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 6, "simulator_max_new_tokens": 6},
           "sft": {"enabled": False}, "eval": {"every": 0, "tasks": 2}, "out": str(tmp_path / "runs")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    lines: list[str] = []
    run = train(load_config(tmp_path / "cfg.yaml"), log=lambda *a: lines.append(" ".join(map(str, a))))
    # the rehearsal-judged part says how far it is, as the real part does (minutes on a CPU)
    assert sum(x.startswith("  eval, rehearsal-judged: turn 1/2:") for x in lines) == 2
    evals = [r for r in run.metrics() if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 1]
    for r in evals:
        assert {"eval/success", "eval/rehearsal_success", "eval/rehearsal_gap", "eval/example_n",
                "eval/fail/no_call"} <= set(r)
    fails = [json.loads(x) for x in (run.path / "eval_failures.jsonl").read_text().splitlines()]
    assert sorted({(f["step"], f["source"]) for f in fails}) == [(0, "real"), (0, "rehearsal_judged"),
                                                                 (1, "real"), (1, "rehearsal_judged")]
    assert (run.path / "evals_rehearsal.jsonl").read_text().strip()
    summary = (run.path / "summary.md").read_text()
    assert "## Rehearsal gap and fidelity" in summary and "## Why episodes failed (real eval)" in summary
    # eval.rehearsal_gap: false: the real eval alone
    off = train(load_config(tmp_path / "cfg.yaml", ["eval.rehearsal_gap=false", "out=" + str(tmp_path / "off")]),
                log=lambda *_: None)
    assert not any("eval/rehearsal_success" in r for r in off.metrics())
