"""FinMCP-Bench (arXiv 2603.24943): replay-only evaluation with the paper's tool-call metrics.

FinMCP-Bench's 613 samples (single-tool 145, multi-tool 249, multi-turn 219) call 65 real
financial MCP servers that are not reachable here, and no copy of its tasks is in this store, so
this adapter does *replay*: a model's recorded tool calls (or a policy run with rehearsed tool
responses) are scored against each sample's gold calls.

Metrics, as the paper names them (Tool Precision / Recall / F1 and Exact Match Rate). Our reading
of the definitions, stated so the numbers can be checked:

* per sample, match predicted and gold calls as multisets of tool names: ``TP = |pred ∩ gold|``;
  ``precision = TP / |pred|``, ``recall = TP / |gold|``, ``F1 = 2PR / (P + R)`` (0 when P+R = 0;
  a sample with no gold and no predicted calls has P = R = F1 = 1);
* ``EMR``: the fraction of samples whose predicted call sequence equals the gold sequence exactly,
  in order, names *and* arguments;
* reported macro-averaged over samples (and micro, from summed counts), per sample type.

Sample format read here (one JSON object per line, or a JSON list): ``id``, ``type``
(``single_tool`` | ``multi_tool`` | ``multi_turn``), ``scenario``, ``tools`` (OpenAI/MCP function
schemas), ``messages`` (OpenAI-style chat: user turns, assistant turns with ``tool_calls``
``{"function": {"name", "arguments"}}``, tool results) and optionally ``ground_truth``
(``[{"name", "arguments"}]``; default: every assistant tool call in ``messages``). A prediction
file holds ``{"id", "calls": [{"name", "arguments"}]}`` per line.

A user with the data (``DianJin/FinMCP-Bench`` on the Hugging Face hub, or the authors' release)
converts it to that format if needed, saves it as ``<data>/finmcp/samples.jsonl`` (or passes
``--data-dir``), and runs ``envace bench eval --bench finmcp --category multi_tool``; the
rehearsal source answers tool calls (no MCP server needed), and the scores are the replay metrics.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from envace.benchmarks.base import BenchEpisode, BenchItem, BenchScore, Category
from envace.benchmarks.data import bench_dir
from envace.core.types import Example, FunctionSpec, Task, ToolCall, ToolSpec

TYPES = ["single_tool", "multi_tool", "multi_turn"]
PAPER_COUNTS = {"single_tool": 145, "multi_tool": 249, "multi_turn": 219}


def _args(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {"_raw": value}
    return dict(value) if isinstance(value, dict) else {}


def _call(obj: dict[str, Any]) -> ToolCall:
    fn = obj.get("function", obj)
    return ToolCall(name=str(fn.get("name", "")), arguments=_args(fn.get("arguments", {})))


def read_records(path: str | Path) -> list[dict[str, Any]]:
    text = Path(path).read_text(encoding="utf-8").strip()
    if not text:
        return []
    if text.startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def gold_calls(sample: dict[str, Any]) -> list[ToolCall]:
    if sample.get("ground_truth") is not None:
        return [_call(c) for c in sample["ground_truth"]]
    return [_call(tc) for m in sample.get("messages", []) if m.get("role") == "assistant"
            for tc in m.get("tool_calls") or []]


def user_turns(sample: dict[str, Any]) -> list[str]:
    return [str(m.get("content") or "") for m in sample.get("messages", []) if m.get("role") == "user"]


def _tool_spec(t: dict[str, Any]) -> ToolSpec:
    fn = t.get("function", t)
    params = fn.get("parameters") or fn.get("inputSchema") or fn.get("input_schema") or {"type": "object", "properties": {}}
    return ToolSpec(function=FunctionSpec(name=fn["name"], description=fn.get("description", ""), parameters=params))


def _examples(sample: dict[str, Any]) -> list[Example]:
    """The recorded tool results, as grounding for the rehearsal source (replay of real responses)."""
    out, pending = [], {}
    for m in sample.get("messages", []):
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                pending[tc.get("id", len(pending))] = _call(tc)
        elif m.get("role") == "tool":
            call = pending.pop(m.get("tool_call_id"), None) or (pending.pop(next(iter(pending))) if pending else None)
            if call is not None:
                try:
                    result = json.loads(m.get("content") or "null")
                except json.JSONDecodeError:
                    result = m.get("content")
                out.append(Example(tool=call.name, arguments=call.arguments, result=result))
    return out


def sample_metrics(pred: list[ToolCall], gold: list[ToolCall]) -> dict[str, float]:
    p, g = Counter(c.name for c in pred), Counter(c.name for c in gold)
    tp = sum((p & g).values())
    if not pred and not gold:
        precision = recall = f1 = 1.0
    else:
        precision = tp / len(pred) if pred else 0.0
        recall = tp / len(gold) if gold else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    exact = len(pred) == len(gold) and all(a.name == b.name and a.arguments == b.arguments for a, b in zip(pred, gold))
    return {"precision": precision, "recall": recall, "f1": f1, "exact": float(exact), "tp": tp,
            "n_pred": len(pred), "n_gold": len(gold)}


def aggregate_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    n = len(rows)
    if n == 0:
        return {"samples": 0}
    tp, npred, ngold = (sum(r[k] for r in rows) for k in ("tp", "n_pred", "n_gold"))
    mp = tp / npred if npred else 0.0
    mr = tp / ngold if ngold else 0.0
    return {"samples": n, "tool_precision": sum(r["precision"] for r in rows) / n,
            "tool_recall": sum(r["recall"] for r in rows) / n, "tool_f1": sum(r["f1"] for r in rows) / n,
            "emr": sum(r["exact"] for r in rows) / n, "micro_precision": mp, "micro_recall": mr,
            "micro_f1": 2 * mp * mr / (mp + mr) if mp + mr else 0.0}


def evaluate_predictions(samples: list[dict[str, Any]], predictions: dict[str, list[ToolCall]]) -> dict[str, Any]:
    """Replay scoring of a prediction set: per type and overall."""
    by_type: dict[str, list[dict[str, float]]] = {}
    for s in samples:
        row = sample_metrics(predictions.get(str(s["id"]), []), gold_calls(s))
        by_type.setdefault(s.get("type", "unknown"), []).append(row)
    out = {t: aggregate_metrics(rows) for t, rows in by_type.items()}
    out["overall"] = aggregate_metrics([r for rows in by_type.values() for r in rows])
    return out


def samples_path(data_dir: str | Path | None = None) -> Path | None:
    d = bench_dir("finmcp", data_dir)
    for name in ("samples.jsonl", "samples.json", "finmcp_bench.jsonl"):
        if (d / name).exists():
            return d / name
    return None


class FinMCPAdapter:
    name = "finmcp"
    title = "FinMCP-Bench (financial MCP tool use; replay-only)"
    licence = "see the authors' release"
    needs = "its samples in <data>/finmcp/samples.jsonl (not public here); no package"

    def available(self, data_dir: Path | None = None) -> tuple[bool, str]:
        if samples_path(data_dir) is not None:
            return True, f"samples at {samples_path(data_dir)}"
        return False, ("no samples: put the benchmark's samples at <data>/finmcp/samples.jsonl "
                       "(its 65 MCP servers are not reachable; evaluation is replay-only)")

    def categories(self) -> list[Category]:
        return [Category(t, True, "replay-only: rehearsed or recorded tool responses, no MCP servers", "type")
                for t in TYPES]

    def count(self, category: str, data_dir: Path | None = None, version: str | None = None) -> int | None:
        path = samples_path(data_dir)
        if path is None:
            return None
        return sum(1 for s in read_records(path) if s.get("type") == category)

    def load(self, category: str, limit: int | None = None, data_dir: Path | str | None = None,
             version: str | None = None, path: str | Path | None = None) -> list[BenchItem]:
        path = path or samples_path(data_dir)
        if path is None:
            raise ValueError(self.available(None)[1])
        items = []
        for s in read_records(path):
            if category not in ("all", s.get("type")):
                continue
            turns = user_turns(s) or [s.get("query", "")]
            task = Task(id=f"finmcp-{s['id']}", domain=s.get("scenario") or "finance", instruction=turns[0] or "(empty)",
                        tools=[_tool_spec(t) for t in s.get("tools", [])], examples=_examples(s))
            items.append(BenchItem(benchmark="finmcp", category=s.get("type", "unknown"), task=task,
                                   user_turns=turns[1:], execute=True, max_steps=8, raw={"sample": s},
                                   version=str(path)))
            if limit and len(items) >= limit:
                break
        return items

    def make_world(self, item: BenchItem) -> None:
        return None  # replay-only: run it with --source rehearsal (or score recorded calls)

    def score(self, item: BenchItem, episode: BenchEpisode, world: Any | None = None) -> BenchScore:
        m = sample_metrics(episode.all_calls, gold_calls(item.raw["sample"]))
        return BenchScore(item_id=item.id, category=item.category, valid=bool(m["exact"]), reward=m["f1"], detail=m)

    def aggregate(self, scores: list[BenchScore]) -> dict[str, Any]:
        per: dict[str, Any] = {}
        for cat in sorted({s.category for s in scores}):
            rows = [s.detail for s in scores if s.category == cat]
            agg = aggregate_metrics(rows)
            per[cat] = {**agg, "accuracy": agg["emr"], "total": agg["samples"],
                        "correct": int(sum(r["exact"] for r in rows))}
        overall = aggregate_metrics([s.detail for s in scores])
        return {"per_category": per, "overall": overall, "note": "accuracy = EMR; see finmcp.py for the metric definitions"}
