"""FinMCP-Bench adapter: the replay metrics on a fixture written in its sample format."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.benchmarks import finmcp as fm
from envace.benchmarks.base import BenchEpisode
from envace.core.types import ToolCall

FIXTURE = Path(__file__).parent / "fixtures" / "finmcp_sample.jsonl"


def C(name: str, **args) -> ToolCall:
    return ToolCall(name=name, arguments=args)


def test_metrics_by_hand() -> None:
    gold = [C("a", x=1), C("b"), C("c")]
    m = fm.sample_metrics([C("a", x=1), C("b"), C("d")], gold)
    assert m["precision"] == pytest.approx(2 / 3) and m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(2 / 3) and m["exact"] == 0.0
    assert fm.sample_metrics(list(gold), gold)["exact"] == 1.0
    assert fm.sample_metrics([C("a", x=2), C("b"), C("c")], gold)["exact"] == 0.0  # arguments count for EMR
    assert fm.sample_metrics([C("b"), C("a", x=1), C("c")], gold)["exact"] == 0.0  # and order
    assert fm.sample_metrics([], [])["f1"] == 1.0
    assert fm.sample_metrics([], gold)["f1"] == 0.0


def test_loader_reads_the_sample_format() -> None:
    adapter = fm.FinMCPAdapter()
    items = adapter.load("all", path=FIXTURE)
    assert [i.category for i in items] == ["single_tool", "multi_tool", "multi_turn"]
    multi = items[1]
    assert [c.name for c in fm.gold_calls(multi.raw["sample"])] == ["search_stock", "get_stock_quote", "get_pe_ratio"]
    assert fm.gold_calls(items[0].raw["sample"])[0].arguments == {"fund_code": "000001"}  # JSON-string arguments
    assert items[2].user_turns == ["And what is it worth now?"]
    assert {e.tool for e in multi.task.examples} == {"search_stock", "get_stock_quote", "get_pe_ratio"}


def test_replay_scoring_and_aggregate() -> None:
    adapter = fm.FinMCPAdapter()
    items = adapter.load("all", path=FIXTURE)
    scores = []
    for i in items:
        gold = fm.gold_calls(i.raw["sample"])
        pred = gold if i.category != "multi_tool" else gold[:2]
        scores.append(adapter.score(i, BenchEpisode(item_id=i.id, turns=[[pred]])))
    agg = adapter.aggregate(scores)
    assert agg["per_category"]["single_tool"]["emr"] == 1.0
    assert agg["per_category"]["multi_tool"]["tool_recall"] == pytest.approx(2 / 3)
    assert agg["overall"]["emr"] == pytest.approx(2 / 3)
    preds = {str(s["id"]): fm.gold_calls(s) for s in fm.read_records(FIXTURE)}
    assert fm.evaluate_predictions(fm.read_records(FIXTURE), preds)["overall"]["emr"] == 1.0
