"""FinMCP-Bench adapter: the authors' metrics on a fixture written in their published sample format.

The fixture (``fixtures/finmcp_eval_sample.json``, written for these tests, no benchmark data) has
the fields of the authors' release (``DianJin-TIR``: ``scenery``, ``diff_level``, ``task``, gold
``messages``) plus ``messages_pred`` and one failed-inference record, as their inference script
writes them. The expected numbers below are what the authors' ``DianJin-TIR/eval/evaluation.py``
printed for this very file (run by hand, not vendored): macro P/R/F1 0.6667/0.625/0.6429, micro
0.8571/0.6667/0.75, N 4, consist 0.25, and the per-group rows checked in the test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envace.benchmarks import finmcp as fm
from envace.benchmarks.base import BenchEpisode
from envace.cli.main import main
from envace.core.types import ToolCall
from envace.experiments.bench_runner import ScriptedUser, run_scored_episodes

from .helpers import ReplayActor

FIXTURE = Path(__file__).parent / "fixtures" / "finmcp_eval_sample.json"
ADAPTER = fm.FinMCPAdapter()


def C(name: str, **args) -> ToolCall:
    return ToolCall(name=name, arguments=args)


def test_metrics_by_hand() -> None:
    gold = [C("a", x=1), C("b"), C("b"), C("c")]
    m = fm.sample_metrics([C("a", x=1), C("b"), C("d")], gold)  # TP 2, FP 1, FN 2
    assert (m["tp"], m["fp"], m["fn"]) == (2, 1, 2)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(0.5)
    assert m["f1"] == pytest.approx(4 / 7) and m["exact"] == 0.0
    assert fm.sample_metrics(list(gold), gold)["exact"] == 1.0
    # EMR compares the name sequence only (the authors' code leaves arguments as a TODO) ...
    other_args = fm.sample_metrics([C("a", x=2), C("b"), C("b"), C("c")], gold)
    assert other_args["exact"] == 1.0 and other_args["exact_args"] == 0.0
    # ... in order
    assert fm.sample_metrics([C("b"), C("a", x=1), C("b"), C("c")], gold)["exact"] == 0.0
    # no gold and no predicted call: P = R = F1 = 0 (their safe_div), but the sequences are equal
    empty = fm.sample_metrics([], [])
    assert (empty["precision"], empty["recall"], empty["f1"], empty["exact"]) == (0.0, 0.0, 0.0, 1.0)
    assert fm.sample_metrics([], gold)["f1"] == 0.0


def test_scoring_a_prediction_file_matches_the_authors_evaluation() -> None:
    res = fm.evaluate_file(FIXTURE)
    assert res["dropped_error_samples"] == 1
    o = res["overall"]
    assert o["samples"] == 4
    got = [round(o[k], 4) for k in ("tool_precision", "tool_recall", "tool_f1", "micro_precision", "micro_recall",
                                    "micro_f1", "emr")]
    assert got == [0.6667, 0.625, 0.6429, 0.8571, 0.6667, 0.75, 0.25]
    r4 = lambda d: {k: round(d[k], 4) for k in ("tool_precision", "tool_recall", "tool_f1", "emr")}  # noqa: E731
    assert r4(res["task"]["single_tool"]) == {"tool_precision": 0.5, "tool_recall": 0.5, "tool_f1": 0.5, "emr": 0.5}
    assert r4(res["task"]["multi_tool"]) == {"tool_precision": 0.6667, "tool_recall": 0.5, "tool_f1": 0.5714, "emr": 0.0}
    assert r4(res["task"]["multi_turn"]) == {"tool_precision": 1.0, "tool_recall": 1.0, "tool_f1": 1.0, "emr": 0.0}
    assert round(res["difficulty"]["easy"]["micro_f1"], 4) == 0.6667
    assert set(res["scenario"]) == {"基金投资", "市场分析与研究", "资产配置"}
    assert res["scenario"]["基金投资"]["samples"] == 2 and res["scenario"]["基金投资"]["emr"] == 0.5


def test_bench_score_command(capsys) -> None:
    assert main(["bench", "score", "--bench", "finmcp", "--predictions", str(FIXTURE), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert round(out["overall"]["tool_f1"], 4) == 0.6429
    assert main(["bench", "score", "--bench", "bfcl", "--predictions", str(FIXTURE)]) == 2
    assert "finmcp only" in capsys.readouterr().err


def test_loader_reads_the_published_format() -> None:
    items = ADAPTER.load("all", path=FIXTURE)  # the failed-inference record is skipped
    assert [(i.id, i.category) for i in items] == [("finmcp-1", "single_tool"), ("finmcp-2", "single_tool"),
                                                     ("finmcp-201", "multi_tool"), ("finmcp-601", "multi_turn")]
    multi = items[2]
    assert [c.name for c in fm.gold_calls(multi.raw["sample"])] == [
        "GetUserAssetView", "GetStrategyAssetClassAnalysis", "GetStrategyAssetClassAnalysis", "GetFundLatestProfit"]
    assert fm.gold_calls(items[0].raw["sample"])[0].arguments == {"keyword": "华夏成长混合"}  # JSON-string arguments
    assert [e.tool for e in multi.task.examples].count("GetStrategyAssetClassAnalysis") == 2  # recorded results
    # no tools.json: every tool seen in the recorded calls, with the argument keys seen
    tools = {t.name: t for t in multi.task.tools}
    assert "BatchGetFundNavHistory" in tools and "inferred from recorded calls" in tools["SearchFunds"].function.description
    assert tools["BatchGetFundsDetail"].function.parameters["properties"]["fundCodes"] == {"type": "array"}
    turn = items[3]
    assert turn.user_turns == ["易方达蓝筹精选，看看它的详情和最近公告。", "再看一下近一个月的净值走势。"]
    # turn 2 is shown the gold conversation: greeting reply, user turn 1, its two calls, results and answer
    ctx = turn.turn_context[2]
    assert [m.role for m in ctx] == ["assistant", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert ctx[2].tool_calls[0].name == "BatchGetFundsDetail"


def test_gold_calls_through_the_episode_loop_score_one() -> None:
    """Gold calls replayed per user turn through our loop (turn contexts applied) score EMR 1;
    the same run without its last call scores below 1 with the recall the authors' code gives."""
    items = ADAPTER.load("all", path=FIXTURE)
    plans = {}
    for i in items:
        msgs = i.raw["sample"]["messages"]
        per_turn: list[list[list[ToolCall]]] = []
        for m in msgs:
            if m["role"] == "user":
                per_turn.append([])
            elif m.get("tool_calls"):
                per_turn[-1].append([fm._call(tc) for tc in m["tool_calls"]])
        plans[i.id] = per_turn
    results = run_scored_episodes(ADAPTER, items, ReplayActor(plans), None, ScriptedUser())
    for run, item in zip(results, items):
        episode = run.episode
        score = ADAPTER.score(item, episode)
        assert score.valid and score.reward == 1.0, (item.id, score.detail)
        assert len(episode.turns) == len(fm.user_turns(item.raw["sample"]))
    # the multi-turn trajectory keeps the caller's own turns and the gold context it was shown
    traj, episode = results[3].trajectory, results[3].episode
    assert sum(1 for m in traj.messages if m.role == "user") == 3
    short = BenchEpisode(item_id=items[2].id, turns=[[[c] for c in fm.gold_calls(items[2].raw["sample"])[:-1]]])
    s = ADAPTER.score(items[2], short)
    assert not s.valid and s.detail["recall"] == pytest.approx(0.75) and s.detail["precision"] == 1.0


def test_eval_runs_with_rehearsal_and_refuses_real(tmp_path, capsys) -> None:
    data = tmp_path / "data"
    (data / "finmcp").mkdir(parents=True)
    shutil.copy(FIXTURE, data / "finmcp" / "benchmark_final.json")
    rows = {r["name"]: r for r in json.loads(_list_json(capsys, data))}
    counts = {c["name"]: c["tasks"] for c in rows["finmcp"]["categories"]}
    assert counts == {"single_tool": 2, "multi_tool": 1, "multi_turn": 1}
    assert main(["eval", "--bench", "finmcp", "--category", "single_tool", "--data-dir", str(data), "--model", "tiny",
                 "--source", "real", "--out", str(tmp_path)]) == 2
    assert "not executable offline" in capsys.readouterr().err
    assert main(["eval", "--bench", "finmcp", "--category", "multi_turn", "--data-dir", str(data), "--model", "tiny",
                 "--limit", "1", "--max-new-tokens", "8", "--max-steps", "2", "--out", str(tmp_path),
                 "--name", "fin"]) == 0
    scores = [json.loads(line) for line in (tmp_path / "fin" / "scores.jsonl").read_text().splitlines()]
    assert len(scores) == 1 and scores[0]["category"] == "multi_turn" and "f1" in scores[0]["detail"]
    assert "acc/multi_turn" in (tmp_path / "fin" / "summary.md").read_text()


def _list_json(capsys, data: Path) -> str:
    capsys.readouterr()
    assert main(["bench", "list", "--json", "--data-dir", str(data)]) == 0
    return capsys.readouterr().out
