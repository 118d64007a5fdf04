"""BFCL-v4 (Berkeley Function-Calling Leaderboard) through the ``bfcl-eval`` package.

* Data: the package's own files (all v4 categories, possible answers, multi-turn function docs),
  loaded with its ``load_dataset_entry`` so that language hints and multi-turn function docs are
  exactly what its own pipeline uses.
* Tools: its function docs converted to our JSON-schema ToolSpec ("dict" -> object, "float" ->
  number, ...; names with "." become "_", as its FC models do).
* Real source: its executable multi-turn API classes behind a World-like adapter (``BFCLWorld``).
* Scoring: its own checkers, unchanged: ``ast_checker`` for the AST categories, the relevance rule
  of its eval runner for (ir)relevance, ``multi_turn_checker`` (state + response) for multi-turn.

Import path kept narrow: ``bfcl_eval.constants.model_config`` imports every vendor SDK handler,
and the AST checker needs it only for one flag (``underscore_to_dot``). We give the AST checker a
one-entry mapping for our model name while importing it and then remove that placeholder from
``sys.modules``, so a real ``model_config`` imported later is unaffected.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import os
import re
import sys
import tempfile
import types
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

from envace.benchmarks.base import BenchEpisode, BenchItem, BenchScore, Category, has_module, per_category_accuracy, tool_result
from envace.core.errors import TOOL_NOT_AVAILABLE, tool_error
from envace.core.types import FunctionSpec, Task, ToolCall, ToolSpec

PACKAGE = "bfcl_eval"
PIN = "bfcl-eval==2026.3.23"
MODEL_NAME = "envace"  # the model name handed to BFCL's checkers (instance names, name mapping)

NON_LIVE = ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple"]
LIVE = ["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"]
IRRELEVANCE = ["irrelevance", "live_irrelevance", "live_relevance"]
MULTI_TURN = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
AGENTIC = {
    "web_search_base": "needs a live web search API (SerpAPI key and internet)",
    "web_search_no_snippet": "needs a live web search API (SerpAPI key and internet)",
    "memory_kv": "needs its memory prerequisite conversations run first (and sentence-transformers/faiss)",
    "memory_vector": "needs a sentence-transformers embedding model from the hub and faiss",
    "memory_rec_sum": "needs its memory prerequisite conversations run first",
    "format_sensitivity": "prompting-mode format study; not part of the FC leaderboard score",
}
RUNNABLE = NON_LIVE + LIVE + IRRELEVANCE + MULTI_TURN

# The leaderboard's overall score: weights of its five groups (eval_runner_helper, v4).
GROUP_WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}

_TYPE_MAP = {  # BFCL ("gorilla") type names -> JSON schema, as its OpenAI-style converter maps them
    "integer": "integer", "number": "number", "float": "number", "string": "string", "boolean": "boolean",
    "bool": "boolean", "array": "array", "list": "array", "dict": "object", "object": "object",
    "tuple": "array", "any": "string", "byte": "integer", "short": "integer", "long": "integer",
    "double": "number", "char": "string", "ArrayList": "array", "Array": "array", "HashMap": "object",
    "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string", "String": "string",
    "Bigint": "integer",
}


def _ensure_project_root() -> None:
    # bfcl_eval's eval_config creates result/score/lock folders under BFCL_PROJECT_ROOT at import;
    # by default that is site-packages. Keep it out of the install (and out of our repo).
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "envace-bfcl"))


def require() -> None:
    if not has_module(PACKAGE):
        raise ValueError(f"BFCL needs the optional package: pip install --no-deps {PIN} mpmath")
    _ensure_project_root()


# -- tools ------------------------------------------------------------------------------------


def tool_name(name: str) -> str:
    return re.sub(r"\.", "_", name)


def _convert_schema(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k == "type":
            if isinstance(v, str):
                out["type"] = _TYPE_MAP.get(v, "string")
                if v == "float":
                    out["description"] = (schema.get("description", "") + " This is a float type value.").strip()
            continue
        if k == "properties" and isinstance(v, dict):
            out["properties"] = {p: _convert_schema(s) if isinstance(s, dict) else s for p, s in v.items()}
        elif k == "items" and isinstance(v, dict):
            out["items"] = _convert_schema(v)
        elif k in ("description",) and "description" in out:
            continue
        elif k in ("response", "optional"):
            continue
        else:
            out[k] = v
    if "type" not in out:
        out["type"] = "string"
    if out["type"] == "object" and "properties" in out and isinstance(out.get("required"), list):
        out["required"] = [r for r in out["required"] if r in out["properties"]]
    elif "required" in out and not isinstance(out["required"], list):
        out.pop("required")
    if "enum" in out and out["type"] in ("integer", "number", "boolean"):
        out.pop("enum")  # BFCL enums are sometimes strings of numbers; keep validation lenient
    return out


def to_tool_spec(func_doc: dict[str, Any]) -> ToolSpec:
    params = _convert_schema(copy.deepcopy(func_doc.get("parameters") or {"type": "dict", "properties": {}}))
    params["type"] = "object"
    params.setdefault("properties", {})
    return ToolSpec(function=FunctionSpec(name=tool_name(func_doc["name"]),
                                          description=func_doc.get("description", ""), parameters=params))


# -- data -------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _entries(category: str) -> tuple[list[dict], dict[str, dict], dict[str, dict]]:
    """Prompt entries (with BFCL's language hints: what the model sees), the same entries without
    them (what its eval runner hands the checker) and the possible answers, by id."""
    require()
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    entries = load_dataset_entry(category, include_prereq=False)
    plain = {e["id"]: e for e in load_dataset_entry(category, include_prereq=False,
                                                       include_language_specific_hint=False)}
    answers: dict[str, dict] = {}
    if "irrelevance" not in category and "relevance" not in category:
        answers = {a["id"]: a for a in load_ground_truth_entry(category)}
    return entries, plain, answers


def _turn_text(messages: list[dict]) -> tuple[str, str | None]:
    system = "\n".join(m["content"] for m in messages if m.get("role") == "system") or None
    user = "\n".join(m["content"] for m in messages if m.get("role") != "system")
    return user, system


def _item(category: str, entry: dict, plain: dict, answer: dict | None) -> BenchItem:
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC, MAXIMUM_STEP_LIMIT

    entry = copy.deepcopy(entry)
    tools = [to_tool_spec(f) for f in entry["function"]]
    first, system = _turn_text(entry["question"][0]) if entry["question"] and entry["question"][0] else ("", None)
    multi = category in MULTI_TURN
    later: list[str] = []
    added: dict[int, list[ToolSpec]] = {}
    if multi:
        for i, turn in enumerate(entry["question"][1:], start=1):
            if str(i) in entry.get("missed_function", {}):
                added[i] = [to_tool_spec(f) for f in entry["missed_function"][str(i)]]
                later.append(DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC)
            else:
                later.append(_turn_text(turn)[0])
    domain = ", ".join(entry.get("involved_classes", [])) if multi else "function calling"
    task = Task(id=entry["id"], domain=domain, instruction=first or "(no message)", tools=tools)
    raw = {"entry": copy.deepcopy(plain), "answer": answer}
    return BenchItem(benchmark="bfcl", category=category, task=task, user_turns=later, tools_added=added,
                     execute=multi, max_steps=MAXIMUM_STEP_LIMIT if multi else 1, system_prompt=system, raw=raw,
                     version=PIN)


# -- the executable multi-turn world ----------------------------------------------------------


class BFCLWorld:
    """BFCL's executable API classes of one multi-turn entry, as a World-like object.

    ``call`` never raises: unknown tools get TOOL_NOT_AVAILABLE, an exception inside BFCL's
    method an ``EXECUTION_ERROR`` (BFCL itself shows "Error during execution: ...").
    """

    def __init__(self, entry: dict, long_context: bool = False) -> None:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.entry = entry
        self.calls: list[tuple[ToolCall, dict]] = []
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for cls_name in entry.get("involved_classes", []):
            module = importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name])
            inst = getattr(module, cls_name)()
            if cls_name not in STATELESS_CLASSES:
                inst._load_scenario(copy.deepcopy(entry.get("initial_config", {}).get(cls_name, {})),
                                    long_context=long_context)
            self.instances[cls_name] = inst
            for name, method in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method
        self._specs = [to_tool_spec(f) for f in entry.get("function", [])]

    def tools(self) -> list[ToolSpec]:
        return [ToolSpec.model_validate(s.model_dump()) for s in self._specs]

    def call(self, name: str, arguments: dict) -> dict:
        args = dict(arguments) if isinstance(arguments, dict) else {}
        if not isinstance(name, str) or name not in self.methods:
            result = tool_error(TOOL_NOT_AVAILABLE, f"Tool {name!r} is not available")
        else:
            try:
                result = tool_result(self.methods[name](**args))
            except Exception as e:  # BFCL's classes raise on bad input; a real API answers
                result = tool_error("EXECUTION_ERROR", f"Error during execution: {e}")
        self.calls.append((ToolCall(name=str(name), arguments=copy.deepcopy(args)), result))
        return result

    def state(self) -> dict[str, dict[str, Any]]:
        return {c: {k: v for k, v in vars(i).items() if not k.startswith("_")} for c, i in self.instances.items()}

    def signature(self, name: str) -> inspect.Signature | None:
        m = self.methods.get(name)
        return inspect.signature(m) if m is not None else None


# -- call strings (BFCL's executable format) --------------------------------------------------


def call_string(call: ToolCall) -> str:
    """``name(a=1,b='x')``: how BFCL's FC handlers turn a decoded call into an executable string."""
    return f"{call.name}({','.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


def parse_call_string(text: str, signature: inspect.Signature | None = None) -> ToolCall:
    """A BFCL ground-truth call string as a ToolCall (positional arguments named by ``signature``)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a call: {text!r}")
    name = ast.unparse(node.func)
    args: dict[str, Any] = {}
    if node.args:
        if signature is None:
            raise ValueError(f"positional arguments need the signature of {name}")
        params = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for p, a in zip(params, node.args):
            args[p.name] = ast.literal_eval(a)
    for kw in node.keywords:
        args[kw.arg] = ast.literal_eval(kw.value)
    return ToolCall(name=name, arguments=args)


# -- scoring ----------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _ast_checker():
    require()
    key = "bfcl_eval.constants.model_config"
    placeholder = None
    if key not in sys.modules:
        placeholder = types.ModuleType(key)
        placeholder.MODEL_CONFIG_MAPPING = {}  # type: ignore[attr-defined]
        sys.modules[key] = placeholder
    try:
        from bfcl_eval.eval_checker.ast_eval import ast_checker as mod
    finally:
        if placeholder is not None and sys.modules.get(key) is placeholder:
            del sys.modules[key]
    # Our tool names replace "." with "_", as OpenAI-style FC models do: say so for our model name.
    mod.MODEL_CONFIG_MAPPING.setdefault(MODEL_NAME, types.SimpleNamespace(underscore_to_dot=True))
    return mod


def _language(category: str):
    from bfcl_eval.constants.enums import Language

    if category == "simple_java":
        return Language.JAVA
    if category == "simple_javascript":
        return Language.JAVASCRIPT
    return Language.PYTHON


def decoded_output(calls: list[ToolCall]) -> list[dict[str, dict[str, Any]]]:
    """The first response's calls in the shape BFCL's FC decoders return: ``[{name: {arg: value}}]``."""
    return [{c.name: dict(c.arguments)} for c in calls]


def score_ast(category: str, entry: dict, answer: dict | None, calls: list[ToolCall]) -> dict[str, Any]:
    """BFCL's verdict on one single-turn response (its calls, in order)."""
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    output = decoded_output(calls)
    if category in IRRELEVANCE:  # its relevance runner: did the response contain a function call?
        contains = not is_empty_output(output)
        ok = not contains if "irrelevance" in category else contains
        return {"valid": ok, "error_type": None if ok else ("irrelevance_error:decoder_success" if contains
                                                             else "relevance_error:decoder_failed")}
    if not is_function_calling_format_output(output):
        return {"valid": False, "error_type": "ast_decoder:decoder_wrong_output_format"}
    result = _ast_checker().ast_checker(entry["function"], output, answer["ground_truth"], _language(category),
                                        category, MODEL_NAME)
    return {"valid": bool(result["valid"]), "error": result.get("error"), "error_type": result.get("error_type")}


def score_multi_turn(entry: dict, answer: dict, turns: list[list[list[ToolCall]]],
                     force_terminated: bool = False) -> dict[str, Any]:
    """BFCL's multi-turn verdict: every turn's state and responses against its ground truth."""
    require()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    gt = answer["ground_truth"]
    if force_terminated or len(turns) != len(gt):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"model turns {len(turns)} vs ground-truth turns {len(gt)}"}
    decoded = [[[call_string(c) for c in step] for step in turn if step] for turn in turns]
    # BFCL keeps executed instances in a module-level dict keyed by model name and entry id (it
    # evaluates each entry once per process). A fresh name per scoring call keeps repeated
    # evaluations independent; the instances are dropped afterwards.
    model = f"{MODEL_NAME}_{uuid.uuid4().hex[:10]}"
    entry = copy.deepcopy(entry)
    category = entry["id"].rsplit("_", 1)[0]
    try:
        result = multi_turn_checker(decoded, gt, entry, category, model)
    except AssertionError as e:
        result = {"valid": False, "error_type": "multi_turn:checker_assertion", "error_message": str(e)}
    finally:
        g = vars(multi_turn_utils)
        for k in [k for k in g if k.startswith(model)]:
            del g[k]
    return {"valid": bool(result["valid"]), "error_type": result.get("error_type"),
            "error_message": result.get("error_message")}


def ground_truth_turns(item: BenchItem) -> list[list[list[ToolCall]]]:
    """The entry's ground truth as our calls: per turn one step per call (multi-turn), or one
    step with every call (single-turn; the first option of each argument)."""
    entry, answer = item.raw["entry"], item.raw["answer"]
    if item.category in MULTI_TURN:
        world = BFCLWorld(entry, long_context="long_context" in item.category)
        return [[[parse_call_string(s, world.signature(parse_call_string_name(s)))] for s in turn]
                for turn in answer["ground_truth"]]
    if answer is None:
        return [[[]]]
    lang = "java" if item.category == "simple_java" else "js" if item.category == "simple_javascript" else None
    docs = {f["name"]: f for f in entry["function"]}
    calls = []
    for fn in answer["ground_truth"]:
        ((name, params),) = fn.items()
        props = (docs.get(name, {}).get("parameters") or {}).get("properties", {})
        args = {}
        for k, opts in params.items():
            if not opts or opts[0] == "":
                continue
            value = _first_option(opts)
            if lang is not None:  # Java/JS values are passed as their source text (BFCL's FC format)
                value = _source_literal(value, props.get(k, {}), lang)
            args[k] = value
        calls.append(ToolCall(name=tool_name(name), arguments=args))
    return [[calls]]


def _first_option(options: Any) -> Any:
    """The first acceptable value of a possible-answer list (nested dicts hold option lists too)."""
    if not isinstance(options, list) or not options:
        return options
    return _unwrap(options[0])


def _unwrap(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _first_option(v) for k, v in value.items() if not (isinstance(v, list) and v and v[0] == "")}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _scalar_literal(value: Any, lang: str, typ: str = "") -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if lang == "java" and typ == "long" and isinstance(value, int):
        return f"{value}L"
    if lang == "java" and typ == "float":
        return f"{value}f"
    if lang == "js" and typ == "Bigint":
        return f"{value}n"
    return str(value)


def _source_literal(value: Any, doc: dict, lang: str) -> str:
    """A possible-answer value as the Java/JavaScript source text a model is asked to write, in the
    forms BFCL's type converters parse (``new ArrayList<>(Arrays.asList(..))``, ``new HashMap<..>()
    {{ put(..); }}``, ``[..]``, ``{k: v}``, ``42L``, ``1.5f``, ``10n``)."""
    if isinstance(value, str):
        return value  # already source text (strings, expressions, quoted literals)
    typ = doc.get("type", "")
    item_typ = (doc.get("items") or {}).get("type", "")
    if isinstance(value, list):
        inner = ", ".join(_scalar_literal(v, lang, item_typ) if not isinstance(v, (list, dict))
                          else _source_literal(v, {}, lang) for v in value)
        if lang == "js":
            return f"[{inner}]"
        if typ == "Array":
            java = {"integer": "int", "long": "long", "float": "float", "double": "double", "boolean": "boolean",
                    "String": "String", "char": "char"}.get(item_typ, "Object")
            return f"new {java}[]{{{inner}}}"
        return f"new ArrayList<>(Arrays.asList({inner}))"
    if isinstance(value, dict):
        def lit(v: Any) -> str:
            return _source_literal(v, {}, lang) if isinstance(v, (list, dict)) else _scalar_literal(v, lang)

        if lang == "js":
            return "{" + ", ".join(f"{k}: {lit(v)}" for k, v in value.items()) + "}"
        puts = " ".join(f'put("{k}", {lit(v)});' for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return _scalar_literal(value, lang, typ)


def parse_call_string_name(text: str) -> str:
    return text.split("(", 1)[0].strip()


# -- the adapter ------------------------------------------------------------------------------


def _group(category: str) -> str:
    if category in NON_LIVE:
        return "non_live"
    if category in LIVE:
        return "live"
    if category in IRRELEVANCE:
        return "irrelevance"
    if category in MULTI_TURN:
        return "multi_turn"
    return "agentic"


def overall(accuracy: dict[str, float], sizes: dict[str, int] | None = None) -> dict[str, Any]:
    """The leaderboard's aggregation (BFCL v4 eval_runner_helper) over the categories given.

    Returns the group scores, ``overall_leaderboard`` (missing categories count 0, as the
    leaderboard does) and ``overall_runnable`` (weights renormalised over the groups that ran).
    """
    acc = lambda c: accuracy.get(c, 0.0)  # noqa: E731
    simple = (acc("simple_python") + acc("simple_java") + acc("simple_javascript")) / 3
    non_live = (simple + acc("multiple") + acc("parallel") + acc("parallel_multiple")) / 4
    counts = sizes or {}  # live categories are weighted by their full sizes, as on the leaderboard
    live_total = sum(counts.get(c, 0) for c in LIVE)
    live = sum(acc(c) * counts.get(c, 0) for c in LIVE) / live_total if live_total else 0.0
    irrelevance = (acc("irrelevance") + acc("live_irrelevance")) / 2
    multi_turn = sum(acc(c) for c in MULTI_TURN) / 4
    groups = {"non_live": non_live, "live": live, "irrelevance": irrelevance, "multi_turn": multi_turn, "agentic": 0.0}
    ran = {_group(c) for c in accuracy}
    board = sum(groups[g] * w for g, w in GROUP_WEIGHTS.items()) / sum(GROUP_WEIGHTS.values())
    wsum = sum(w for g, w in GROUP_WEIGHTS.items() if g in ran)
    runnable = sum(groups[g] * w for g, w in GROUP_WEIGHTS.items() if g in ran) / wsum if wsum else 0.0
    return {"groups": {g: v for g, v in groups.items() if g in ran}, "overall_leaderboard": board,
            "overall_runnable": runnable, "groups_ran": sorted(ran),
            "note": "a group's score counts its missing categories as 0 (leaderboard rule)"}


class BFCLAdapter:
    name = "bfcl"
    title = "BFCL-v4 (Berkeley Function-Calling Leaderboard)"
    licence = "Apache-2.0"
    needs = f"pip install --no-deps {PIN} mpmath (data, checkers and API classes ship in the wheel)"

    def available(self, data_dir: Path | None = None) -> tuple[bool, str]:
        if has_module(PACKAGE):
            return True, "bfcl-eval installed"
        return False, f"optional package missing: pip install --no-deps {PIN} mpmath"

    def categories(self) -> list[Category]:
        cats = [Category(c, True, "", _group(c)) for c in RUNNABLE]
        cats += [Category(c, False, why, "agentic" if c != "format_sensitivity" else "other") for c, why in AGENTIC.items()]
        return cats

    def count(self, category: str, data_dir: Path | None = None, version: str | None = None) -> int | None:
        if not has_module(PACKAGE):
            return None
        _ensure_project_root()
        from bfcl_eval.constants.eval_config import PROMPT_PATH

        name = "web_search" if category.startswith("web_search") else "memory" if category.startswith("memory") else category
        path = Path(PROMPT_PATH) / f"BFCL_v4_{name}.json"
        if not path.exists():
            return None
        with path.open() as f:
            n = sum(1 for line in f if line.strip())
        return n

    def load(self, category: str, limit: int | None = None, data_dir: Path | None = None,
             version: str | None = None) -> list[BenchItem]:
        if category not in RUNNABLE:
            why = AGENTIC.get(category, f"unknown category; choose from {', '.join(RUNNABLE)}")
            raise ValueError(f"bfcl category {category!r} is not runnable here: {why}")
        entries, plain, answers = _entries(category)
        entries = entries[:limit] if limit else entries
        return [_item(category, e, plain[e["id"]], answers.get(e["id"])) for e in entries]

    def make_world(self, item: BenchItem) -> BFCLWorld | None:
        if not item.execute:
            return None
        return BFCLWorld(item.raw["entry"], long_context="long_context" in item.category)

    def score(self, item: BenchItem, episode: BenchEpisode, world: Any | None = None) -> BenchScore:
        entry, answer = item.raw["entry"], item.raw["answer"]
        if item.category in MULTI_TURN:
            res = score_multi_turn(entry, answer, episode.turns, episode.force_terminated)
        else:
            first = episode.turns[0][0] if episode.turns and episode.turns[0] else []
            res = score_ast(item.category, entry, answer, first)
        return BenchScore(item_id=item.id, category=item.category, valid=res["valid"], reward=float(res["valid"]),
                          detail=res)

    def aggregate(self, scores: list[BenchScore]) -> dict[str, Any]:
        per = per_category_accuracy(scores)
        acc = {c: r["accuracy"] for c, r in per.items()}
        sizes = {c: self.count(c) or 0 for c in LIVE}
        return {"per_category": per, **overall(acc, sizes)}
