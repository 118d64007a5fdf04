"""FinMCP-Bench (arXiv 2603.24943; Qwen DianJin team): replay-only evaluation with its tool-call metrics.

FinMCP-Bench's 613 samples (145 single-tool, 249 multi-tool, 219 multi-turn) call 65 real financial
MCP tools behind a live service (qieman.com) that is not reachable here, and its data (CC-BY-NC-SA,
``DianJin/FinMCP-Bench`` on the Hugging Face hub) is not in this store. So this adapter *replays*:
the caller runs against rehearsed tool responses (grounded by the sample's recorded results) and
its calls are scored against the sample's gold calls; a file of model outputs made elsewhere
(``messages_pred``, the authors' inference output) is scored directly by :func:`evaluate_file`.

Sample format: the authors' release (github.com/aliyun/qwen-dianjin, ``DianJin-TIR``;
``benchmark_final.json`` = all three types, or ``benchmark_stss.json`` single-turn single-step,
``benchmark_stms.json`` single-turn multi-step, ``benchmark_multi_turn.json``): a JSON list of
objects with ``id``, ``scenery`` ("level1-level2-..."), ``diff_level`` (``turns``, ``tool_number``,
``level``), ``tool_list``, ``question``, ``answer``, ``task`` ("single step" | "multi step" |
"multi turn") and ``messages``, the expert-checked gold conversation in OpenAI chat form (user turns,
assistant turns with ``tool_calls: [{"id", "function": {"name", "arguments": JSON string}}]``, tool
results with ``tool_call_id``). Inference output adds ``messages_pred`` (and ``error: true`` on a
failed sample). The samples carry no tool schemas: the authors give the model all MCP tool schemas
of the service; put them (OpenAI ``tools`` list or MCP ``{name, description, inputSchema}`` list)
at ``<data>/finmcp/tools.json``; without that file the schemas are inferred from the recorded calls
(names and argument keys only - say so when reporting).

Metrics, exactly as the authors' ``DianJin-TIR/eval/evaluation.py`` computes them:

* per sample, the tool *names* of every assistant tool call, in order, gold (``messages``) and
  predicted (``messages_pred``); ``TP = |pred ∩ gold|`` as multisets, ``FP = |pred - gold|``,
  ``FN = |gold - pred|``; ``P = TP/(TP+FP)``, ``R = TP/(TP+FN)``, ``F1 = 2PR/(P+R)``, each 0 when its
  denominator is 0 (so a sample with no gold and no predicted call has P = R = F1 = 0);
* ``EMR`` (their ``consist``): 1 when the predicted name sequence equals the gold one exactly;
  arguments are not compared (their code leaves that as a TODO; we add ``emr_args``, names and
  arguments, as an extra column that the paper does not report);
* macro averages over samples and micro from summed TP/FP/FN, overall and per group: task type,
  first-level scenario (``scenery`` up to the first "-") and difficulty (``diff_level.level``);
  samples flagged ``error`` are dropped first.

Evaluation protocol (theirs, kept): for every user turn the model is given the *gold* conversation
up to that user message, then runs its own tool-calling turn; the prediction is the concatenation of
its turns. ``BenchItem.turn_context`` carries those gold prefixes to the episode loop.

A user with the data: download it (``huggingface-cli download DianJin/FinMCP-Bench --repo-type
dataset`` or the authors' release), save ``benchmark_final.json`` (and the MCP tool schemas as
``tools.json``) in ``<data>/finmcp/``, then ``envace eval --bench finmcp --category multi_tool
--source rehearsal``; or score outputs made with the live tools by
``envace bench score --bench finmcp --predictions their_eval_file.json``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from envace.benchmarks.base import BenchEpisode, BenchItem, BenchScore, Category
from envace.benchmarks.data import bench_dir
from envace.core.types import Example, FunctionSpec, Message, Task, ToolCall, ToolSpec

TYPES = ["single_tool", "multi_tool", "multi_turn"]
# the authors' ``task`` values (and their underscore forms in the eval output) -> our category names
_TASK_TYPES = {"single step": "single_tool", "single_step": "single_tool", "single_tool": "single_tool",
               "multi step": "multi_tool", "multi_step": "multi_tool", "multi_tool": "multi_tool",
               "multi turn": "multi_turn", "multi_turn": "multi_turn"}
SAMPLE_FILES = ("benchmark_final.json", "benchmark_stss.json", "benchmark_stms.json", "benchmark_multi_turn.json")
TOOLS_FILE = "tools.json"


# -- reading ----------------------------------------------------------------------------------


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """A JSON list (the authors' files) or JSON lines."""
    text = Path(path).read_text(encoding="utf-8").strip()
    if not text:
        return []
    if text.startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sample_type(sample: dict[str, Any]) -> str:
    raw = str(sample.get("task") or sample.get("type") or "")
    if raw in _TASK_TYPES:
        return _TASK_TYPES[raw]
    turns = (sample.get("diff_level") or {}).get("turns")
    return "multi_turn" if isinstance(turns, int) and turns > 1 else raw.replace(" ", "_") or "unknown"


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


def message_calls(messages: list[dict[str, Any]]) -> list[ToolCall]:
    """Every tool call of every assistant message, in order (their ``extract_toolcall_from_meg``)."""
    return [_call(tc) for m in messages or [] if m.get("tool_calls") for tc in m["tool_calls"]]


def gold_calls(sample: dict[str, Any]) -> list[ToolCall]:
    if sample.get("ground_truth") is not None:
        return [_call(c) for c in sample["ground_truth"]]
    return message_calls(sample.get("messages", []))


def user_turns(sample: dict[str, Any]) -> list[str]:
    return [str(m.get("content") or "") for m in sample.get("messages", []) if m.get("role") == "user"]


def _to_messages(raw: list[dict[str, Any]]) -> list[Message]:
    """Gold chat messages as ours (tool calls parsed; tool results keep their text)."""
    out = []
    for m in raw:
        role = m.get("role")
        if role == "assistant":
            out.append(Message(role="assistant", content=str(m.get("content") or ""),
                               tool_calls=[_call(tc) for tc in m.get("tool_calls") or []]))
        elif role == "tool":
            out.append(Message(role="tool", content=str(m.get("content") or "")))
        elif role in ("user", "system"):
            out.append(Message(role=role, content=str(m.get("content") or "")))
    return out


def turn_contexts(sample: dict[str, Any]) -> dict[int, list[Message]]:
    """For user turn k >= 1: the gold conversation after the first user message and before the k-th
    (the authors condition every turn on the gold history, not on the model's earlier turns)."""
    raw = [m for m in sample.get("messages", []) if m.get("role") != "system"]
    users = [i for i, m in enumerate(raw) if m.get("role") == "user"]
    return {k: _to_messages(raw[users[0] + 1:users[k]]) for k in range(1, len(users))}


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


# -- tool schemas -----------------------------------------------------------------------------


def _tool_spec(t: dict[str, Any]) -> ToolSpec:
    fn = t.get("function", t)
    params = fn.get("parameters") or fn.get("inputSchema") or fn.get("input_schema") or {"type": "object", "properties": {}}
    return ToolSpec(function=FunctionSpec(name=fn["name"], description=fn.get("description", ""), parameters=params))


def _json_type(v: Any) -> str:
    return ("boolean" if isinstance(v, bool) else "integer" if isinstance(v, int) else "number"
            if isinstance(v, float) else "array" if isinstance(v, list) else "object" if isinstance(v, dict) else "string")


def inferred_tools(samples: list[dict[str, Any]]) -> list[ToolSpec]:
    """Schemas from the recorded calls: every tool name seen, the argument keys seen with it (typed
    by their values), none required. A stand-in for the service's MCP schemas."""
    props: dict[str, dict[str, str]] = {}
    for s in samples:
        for c in gold_calls(s):
            p = props.setdefault(c.name, {})
            for k, v in c.arguments.items():
                p.setdefault(k, _json_type(v))
    return [ToolSpec(function=FunctionSpec(
        name=name, description="(schema inferred from recorded calls)",
        parameters={"type": "object", "properties": {k: {"type": t} for k, t in p.items()}}))
        for name, p in sorted(props.items())]


def load_tools(samples: list[dict[str, Any]], data_dir: str | Path | None = None) -> tuple[list[ToolSpec], str]:
    path = bench_dir("finmcp", data_dir) / TOOLS_FILE
    if path.exists():
        raw = json.loads(path.read_text(encoding="utf-8"))
        raw = raw.get("tools", raw) if isinstance(raw, dict) else raw
        return [_tool_spec(t) for t in raw], str(path)
    if any(s.get("tools") for s in samples):
        seen: dict[str, ToolSpec] = {}
        for s in samples:
            for t in s.get("tools") or []:
                spec = _tool_spec(t)
                seen.setdefault(spec.name, spec)
        return list(seen.values()), "sample tools"
    return inferred_tools(samples), "inferred from recorded calls"


# -- metrics (the authors' evaluation.py) -----------------------------------------------------


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def sample_metrics(pred: list[ToolCall], gold: list[ToolCall]) -> dict[str, float]:
    p, g = Counter(c.name for c in pred), Counter(c.name for c in gold)
    tp, fp, fn = sum((p & g).values()), sum((p - g).values()), sum((g - p).values())
    precision, recall = _div(tp, tp + fp), _div(tp, tp + fn)
    f1 = _div(2 * precision * recall, precision + recall)
    names_equal = [c.name for c in pred] == [c.name for c in gold]
    args_equal = names_equal and all(a.arguments == b.arguments for a, b in zip(pred, gold))
    return {"precision": precision, "recall": recall, "f1": f1, "exact": float(names_equal),
            "exact_args": float(args_equal), "tp": tp, "fp": fp, "fn": fn, "n_pred": len(pred), "n_gold": len(gold)}


def aggregate_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    n = len(rows)
    if n == 0:
        return {"samples": 0}
    tp, fp, fn = (sum(r[k] for r in rows) for k in ("tp", "fp", "fn"))
    mp, mr = _div(tp, tp + fp), _div(tp, tp + fn)
    return {"samples": n, "tool_precision": sum(r["precision"] for r in rows) / n,
            "tool_recall": sum(r["recall"] for r in rows) / n, "tool_f1": sum(r["f1"] for r in rows) / n,
            "emr": sum(r["exact"] for r in rows) / n, "micro_precision": mp, "micro_recall": mr,
            "micro_f1": _div(2 * mp * mr, mp + mr), "emr_args": sum(r.get("exact_args", 0.0) for r in rows) / n}


def _groups(sample: dict[str, Any]) -> dict[str, str]:
    return {"task": sample_type(sample),
            "scenario": str(sample.get("scenery") or sample.get("scenario") or "unknown").split("-")[0].strip(),
            "difficulty": str((sample.get("diff_level") or {}).get("level", "unknown"))}


def evaluate_predictions(samples: list[dict[str, Any]], predictions: dict[str, list[ToolCall]]) -> dict[str, Any]:
    """The paper's metrics for a prediction set (id -> calls): overall and per task type,
    first-level scenario and difficulty."""
    rows = []
    for s in samples:
        if s.get("error"):
            continue
        rows.append((_groups(s), sample_metrics(predictions.get(str(s["id"]), []), gold_calls(s))))
    out: dict[str, Any] = {"overall": aggregate_metrics([r for _, r in rows])}
    for key in ("task", "scenario", "difficulty"):
        names = sorted({g[key] for g, _ in rows})
        out[key] = {n: aggregate_metrics([r for g, r in rows if g[key] == n]) for n in names}
    return out


def evaluate_file(path: str | Path, pred_key: str = "messages_pred") -> dict[str, Any]:
    """Score an inference output file of the authors' pipeline (samples with ``messages_pred``)."""
    samples = read_records(path)
    preds = {str(s["id"]): message_calls(s.get(pred_key) or []) for s in samples if "id" in s}
    dropped = sum(1 for s in samples if s.get("error"))
    return {**evaluate_predictions(samples, preds), "dropped_error_samples": dropped}


# -- the adapter ------------------------------------------------------------------------------


def samples_path(data_dir: str | Path | None = None) -> list[Path]:
    d = bench_dir("finmcp", data_dir)
    if (d / SAMPLE_FILES[0]).exists():
        return [d / SAMPLE_FILES[0]]
    return [d / n for n in SAMPLE_FILES[1:] if (d / n).exists()]


class FinMCPAdapter:
    name = "finmcp"
    title = "FinMCP-Bench (financial MCP tool use; replay-only)"
    licence = "data CC-BY-NC-SA (DianJin/FinMCP-Bench)"
    needs = ("its samples in <data>/finmcp/benchmark_final.json (+ tools.json, the MCP tool schemas); not in this "
             "store; no package")
    default_source = "rehearsal"
    sources = ("rehearsal", "simulator")
    sources_note = "its 65 MCP tools are a live service, not executable offline; tool responses are rehearsed"

    def available(self, data_dir: Path | None = None) -> tuple[bool, str]:
        paths = samples_path(data_dir)
        if paths:
            return True, f"samples at {', '.join(map(str, paths))}"
        return False, (f"no samples under {bench_dir('finmcp', data_dir)}: download DianJin/FinMCP-Bench and save "
                       "benchmark_final.json there (its MCP servers are not reachable; evaluation is replay-only)")

    def categories(self) -> list[Category]:
        return [Category(t, True, "replay-only: rehearsed tool responses, no MCP servers", "type") for t in TYPES]

    def _samples(self, data_dir: Path | str | None, path: str | Path | None = None) -> list[dict[str, Any]]:
        paths = [Path(path)] if path else samples_path(data_dir)
        if not paths:
            raise ValueError(self.available(Path(data_dir) if data_dir else None)[1])
        return [s for p in paths for s in read_records(p)]

    def count(self, category: str, data_dir: Path | None = None, version: str | None = None) -> int | None:
        if not samples_path(data_dir):
            return None
        return sum(1 for s in self._samples(data_dir) if sample_type(s) == category)

    def load(self, category: str, limit: int | None = None, data_dir: Path | str | None = None,
             version: str | None = None, path: str | Path | None = None) -> list[BenchItem]:
        if category not in (*TYPES, "all"):
            raise ValueError(f"finmcp category must be one of {', '.join(TYPES)} (or all)")
        samples = self._samples(data_dir, path)
        tools, tools_from = load_tools(samples, data_dir)
        label = f"{path or ', '.join(map(str, samples_path(data_dir)))} (tools: {tools_from})"
        items = []
        for s in samples:
            kind = sample_type(s)
            if category not in ("all", kind) or s.get("error"):
                continue
            turns = user_turns(s) or [str(s.get("question", ""))]
            task = Task(id=f"finmcp-{s['id']}", domain=s.get("scenery") or "finance", instruction=turns[0] or "(empty)",
                        tools=tools, examples=_examples(s))
            items.append(BenchItem(benchmark="finmcp", category=kind, task=task, user_turns=turns[1:], execute=True,
                                   max_steps=20, turn_context=turn_contexts(s), raw={"sample": s}, version=label))
            if limit and len(items) >= limit:
                break
        return items

    def score_file(self, path: str | Path) -> dict[str, Any]:
        return evaluate_file(path)

    def make_world(self, item: BenchItem) -> None:
        return None  # replay-only: run it with --source rehearsal (or score recorded calls)

    def score(self, item: BenchItem, episode: BenchEpisode, world: Any | None = None) -> BenchScore:
        m = sample_metrics(episode.all_calls, gold_calls(item.raw["sample"]))
        return BenchScore(item_id=item.id, category=item.category, valid=bool(m["exact"]), reward=m["f1"],
                          detail={**m, **_groups(item.raw["sample"])})

    def aggregate(self, scores: list[BenchScore]) -> dict[str, Any]:
        per: dict[str, Any] = {}
        for cat in sorted({s.category for s in scores}):
            rows = [s.detail for s in scores if s.category == cat]
            agg = aggregate_metrics(rows)
            per[cat] = {**agg, "accuracy": agg["emr"], "total": agg["samples"],
                        "correct": int(sum(r["exact"] for r in rows))}
        overall = aggregate_metrics([s.detail for s in scores])
        return {"per_category": per, "overall": overall,
                "note": "accuracy = EMR (tool-name sequence equal to the gold one), the authors' evaluation.py"}
