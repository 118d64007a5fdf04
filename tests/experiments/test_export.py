"""`envace export model`: a trained LoRA checkpoint becomes a plain transformers directory that
loads without envace or peft, computes what the checkpoint computes, scores the same, prompts
with `tools=` exactly as training did, and carries an honest model card; `--no-merge` gives an
adapter plain peft loads offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pathlib import Path
from typing import Literal

import pytest
import torch
import yaml
from hypothesis import given, settings, strategies as st
from pydantic import TypeAdapter
from typing_extensions import NotRequired, TypedDict

from envace.cli.main import main
from envace.core.prompts import CALLER_SYSTEM, PromptStyle, caller_chat, render_caller_prompt
from envace.core.toolcall import format_tool_call
from envace.core.types import FunctionSpec, Message, Task, ToolCall, ToolSpec
from envace.experiments.chat_template import export_chat_template
from envace.experiments.export import card_metadata
from envace.experiments.tasks import select_tasks
from envace.policy.loading import load_model

EVAL = ["--world", "calendar", "--tasks", "4", "--max-turns", "2", "--max-new-tokens", "8",
        "--difficulties", "1", "--tool-distractors", "0", "--tasks-per-world", "120", "--threads", "1"]


def _train(root, **over):
    cfg = {"model": "tiny", "worlds": ["calendar"], "difficulties": [1], "tool_distractors": 0,
           "tasks_per_world": 60, "steps": 2, "tasks_per_step": 2, "group_size": 2, "threads": 1,
           "rollout": {"max_turns": 2, "caller_max_new_tokens": 8, "simulator_max_new_tokens": 8},
           "grpo": {"lr": 0.05}, "lora": {"enabled": True, "r": 2, "alpha": 4},
           "sft": {"enabled": False}, "eval": {"every": 2, "tasks": 2}, "out": str(root / "runs"), **over}
    root.mkdir(parents=True, exist_ok=True)
    (root / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(root / "cfg.yaml")]) == 0
    return next((root / "runs").iterdir())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("export"))


def _success(path):
    # success and reward (a tiny model succeeds rarely; its partial checklist rewards still differ by task)
    return {r["task_id"]: (r["success"], r["reward"])
            for r in map(json.loads, (path / "committed.jsonl").read_text().splitlines())}


def _no_machine_paths(out, *paths):
    for f in out.rglob("*"):
        if f.suffix in (".md", ".yaml"):
            text = f.read_text()
            for p in paths:
                assert str(p) not in text, f"{f.name} names {p}"


def test_export_loads_with_plain_transformers_and_scores_the_same(run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = run / "checkpoints" / "step-00000002"
    out = tmp_path / "exported"
    assert main(["export", "model", str(run), "--to", str(out)]) == 0  # the run: its latest checkpoint
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    card = (out / "README.md").read_text()
    meta = card_metadata(out / "README.md")
    # a from-scratch model has no base_model to name; the rest of the hub metadata is there
    assert "base_model" not in meta and meta["license"] == "apache-2.0"
    assert meta["pipeline_tag"] == "text-generation" and meta["library_name"] == "transformers"
    assert "envace" in meta["tags"] and "lora" in meta["tags"]
    assert "calendar" in card and "| 2 | real |" in card  # its config and its measured eval
    assert "LoRA (r=2, alpha=4) adapter merged" in card and "trained from scratch" in card
    assert "train-" in card and "step-00000002" in card  # the run and checkpoint by name ...
    _no_machine_paths(out, run.parent, tmp_path)  # ... and no path of this machine
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    peft_model, _ = load_model(str(ckpt / "policy"))
    ids = torch.tensor([tok("Add a meeting on Monday.")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, peft_model.eval()(ids).logits, rtol=1e-4, atol=1e-5)
    assert main(["eval", "--model", str(out), *EVAL, "--out", str(tmp_path / "ev"), "--name", "exp"]) == 0
    assert main(["eval", "--model", str(ckpt), *EVAL, "--out", str(tmp_path / "ev"), "--name", "ckpt"]) == 0
    a, b = _success(tmp_path / "ev" / "exp"), _success(tmp_path / "ev" / "ckpt")
    assert len(a) == 4 and a == b
    capsys.readouterr()
    # An existing, non-empty target is refused (nothing overwritten) unless --force.
    assert main(["export", "model", str(ckpt), "--to", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["export", "model", str(ckpt), "--to", str(out), "--force"]) == 0


def _openai_chat(task, call, result, system: bool):
    """What a transformers / OpenAI user writes: structured tool calls, arguments as JSON text."""
    msgs = [{"role": "user", "content": task.instruction},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}]},
            {"role": "tool", "tool_call_id": "c1", "name": call.name, "content": result}]
    if system:
        msgs.insert(0, {"role": "system", "content": CALLER_SYSTEM.format(domain=task.domain)})
    return msgs


def _assert_template_matches_training(tok, exported_tok, style, tasks):
    for task in tasks:
        call = ToolCall(name=task.tools[-1].name, arguments={"date": "2025-06-12", "note": "café", "n": [1, 2]})
        result = '{"ok": true}'
        tools = [t.model_dump(mode="json") for t in task.tools]
        for history in ([], [Message(role="assistant", content=format_tool_call(call), tool_calls=[call]),
                             Message(role="tool", name=call.name, content=result)]):
            want = render_caller_prompt(tok, task, history, style)  # what training feeds the policy
            chat = _openai_chat(task, call, result, system=True)[: 2 + len(history)]
            got = exported_tok.apply_chat_template(chat, tools=tools, add_generation_prompt=True)["input_ids"]
            assert got == want, (exported_tok.decode(got), tok.decode(want))
            # no system message: envace's caller prompt is put first, its domain named
            chat = _openai_chat(task, call, result, system=False)[: 1 + len(history)]
            got = exported_tok.apply_chat_template(chat, tools=tools, add_generation_prompt=True,
                                                   domain=task.domain)["input_ids"]
            assert got == want
            # arguments as a dict (the transformers convention) render the same
            if history:
                chat[1]["tool_calls"][0]["function"]["arguments"] = call.arguments
                assert exported_tok.apply_chat_template(chat, tools=tools, add_generation_prompt=True,
                                                        domain=task.domain)["input_ids"] == want


def test_exported_chat_template_renders_tools_as_training_did(run, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "exported"
    assert main(["export", "model", str(run), "--to", str(out)]) == 0
    exported = AutoTokenizer.from_pretrained(out)
    # `envace eval --model` on the export reads the run's prompt section from the config it carries
    # (the slow test below does it with a json-format run)
    from envace.experiments.eval_models import resolve_eval_models

    assert resolve_eval_models(str(out)).style == PromptStyle()
    _, tok = load_model("tiny")
    calendar = select_tasks("calendar", "all", 6, tool_distractors=0, tasks_per_world=60)
    _assert_template_matches_training(tok, exported, PromptStyle(), calendar)
    # the run's domain is the template's default
    chat = _openai_chat(calendar[0], ToolCall(name="x"), "{}", system=False)[:1]
    assert exported.apply_chat_template(chat, tools=[t.model_dump(mode="json") for t in calendar[0].tools],
                                        add_generation_prompt=True)["input_ids"] == \
        render_caller_prompt(tok, calendar[0], [], PromptStyle())
    # without tools the model's own template is untouched (the simulator's prompts, plain chats)
    plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert exported.apply_chat_template(plain, tokenize=False) == tok.apply_chat_template(plain, tokenize=False)
    # every tool format, every embedded world's schemas (enums, arrays, optional arguments), and
    # nested ones: the helpdesk's (TypedDict arguments, read-only annotations) as its class derives
    # them and as pydantic (an MCP server's SDK) lists them, with $ref and anyOf
    tasks = select_tasks(None, "all", 6, tasks_per_world=60) + _helpdesk_tasks()
    for fmt in ("compact", "json", "native"):
        style = PromptStyle(tool_format=fmt)
        other = load_model("tiny")[1]
        other.chat_template = export_chat_template(tok, style)
        _assert_template_matches_training(tok, other, style, tasks)
    # any domain name survives the trip through a Jinja string literal
    odd = load_model("tiny")[1]
    odd.chat_template = export_chat_template(tok, PromptStyle(), 'caf\u00e9 \U0001f600 "q" \\ x')
    text = odd.apply_chat_template([{"role": "user", "content": "hi"}], tools=[], add_generation_prompt=True,
                                   tokenize=False)
    assert CALLER_SYSTEM.format(domain='caf\u00e9 \U0001f600 "q" \\ x') + "\nTools:\n<|im_end|>" in text
    # exporting an export wraps the model's template once, not twice
    again = load_model("tiny")[1]
    again.chat_template = export_chat_template(exported, PromptStyle(), "calendar")
    assert again.chat_template == exported.chat_template


HELPDESK = Path(__file__).resolve().parents[2] / "examples" / "helpdesk" / "tasks.jsonl"


class _Filters(TypedDict):
    status: NotRequired[Literal["open", "in_progress", "closed"]]
    labels: NotRequired[list[str]]
    assignee: NotRequired[str]


def _helpdesk_tasks() -> list[Task]:
    lines = HELPDESK.read_text().splitlines()
    tasks = [Task.model_validate_json(line) for line in (lines[0], lines[6])]
    assert any("properties" in p for t in tasks for tool in t.tools for p in
               tool.function.parameters["properties"].values())  # nested arguments are there
    schema = TypeAdapter(_Filters | None).json_schema()  # {"anyOf": [{"$ref": ...}, {"type": "null"}], "$defs"}
    mcp_form = ToolSpec(function=FunctionSpec(name="search_tickets", description="Find tickets.", parameters={
        "type": "object", "properties": {"filters": {"anyOf": schema["anyOf"], "default": None},
                                         "limit": {"type": "integer", "default": 10}}, "$defs": schema["$defs"]}))
    return tasks + [tasks[0].model_copy(update={"tools": [mcp_form, *tasks[0].tools[:2]]})]


def test_the_helpdesk_tools_render_their_nested_keys_in_the_exported_template():
    _, tok = load_model("tiny")
    exported = load_model("tiny")[1]
    exported.chat_template = export_chat_template(tok, PromptStyle())
    task = _helpdesk_tasks()[-1]
    text = exported.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                        tools=[t.model_dump(mode="json") for t in task.tools], domain="helpdesk")
    assert 'search_tickets(filters?: {status?: "open"|"in_progress"|"closed", labels?: list[string], ' \
           'assignee?: string}|null, limit?: integer) - Find tickets.' in text


# Schemas as tool files and MCP servers write them: objects (required or not), arrays, enums,
# consts, unions, type lists, maps, $refs that resolve, loop or lead nowhere.
_leaf = st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": ["string", "null"]}, {"type": "null"},
                         {"enum": ["a", "b\u00e9", 3, None]}, {"const": "x"}, {}, {"type": "object"},
                         {"$ref": "#/$defs/Node"}, {"$ref": "#/$defs/Nope"}, {"$ref": "#/properties"}])
_keys = st.sampled_from(["status", "labels", "q", "x y", "\u00e9"])


def _compound(child):
    return st.one_of(
        st.builds(lambda i: {"type": "array", "items": i}, child),
        st.builds(lambda p, r: {"type": "object", "properties": p, "required": r},
                  st.dictionaries(_keys, child, max_size=3), st.lists(_keys, max_size=2)),
        st.builds(lambda p: {"properties": p}, st.dictionaries(_keys, child, max_size=2)),
        st.builds(lambda a: {"anyOf": a}, st.lists(child, min_size=1, max_size=3)),
        st.builds(lambda a: {"oneOf": a}, st.lists(child, min_size=1, max_size=2)),
        st.builds(lambda a: {"allOf": [a]}, child),
        st.builds(lambda v: {"type": ["object", "null"], "additionalProperties": v}, child))


_schemas = st.recursive(_leaf, _compound, max_leaves=12)


def test_the_exported_template_renders_any_nested_schema_as_training_does():
    _, tok = load_model("tiny")
    exported = load_model("tiny")[1]
    exported.chat_template = export_chat_template(tok, PromptStyle())
    json_tok = load_model("tiny")[1]
    json_tok.chat_template = export_chat_template(tok, PromptStyle(tool_format="json"))

    @settings(max_examples=150, deadline=None)
    @given(st.dictionaries(_keys, _schemas, min_size=1, max_size=3), _schemas, st.lists(_keys, max_size=2))
    def check(props, node, required):
        tool = ToolSpec(function=FunctionSpec(name="t", parameters={
            "type": "object", "properties": props, "required": required, "$defs": {"Node": node}}))
        task = Task(id="x", domain="d", instruction="hi", tools=[tool])
        msgs = [{"role": "user", "content": "hi"}]
        for style, other in ((PromptStyle(), exported), (PromptStyle(tool_format="json"), json_tok)):
            want = tok.apply_chat_template(caller_chat(task, [], style, False), tokenize=False,
                                           add_generation_prompt=True)
            got = other.apply_chat_template(msgs, tools=[tool.model_dump(mode="json")], domain="d", tokenize=False,
                                            add_generation_prompt=True)
            assert got == want

    check()


_PEFT_LOAD = """
import sys, torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer
model = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = torch.tensor([tok("Add a meeting on Monday.")["input_ids"]])
with torch.no_grad():
    torch.save(model(ids).logits, sys.argv[2])
"""


def _logits(model, tok):
    ids = torch.tensor([tok("Add a meeting on Monday.")["input_ids"]])
    with torch.no_grad():
        return model.eval()(ids).logits


@pytest.fixture(scope="module")
def adapter_export(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapter") / "adapter"
    assert main(["export", "model", str(run), "--to", str(out), "--no-merge"]) == 0
    return out


def test_no_merge_exports_an_adapter_plain_peft_loads_offline(run, adapter_export, tmp_path, monkeypatch):
    import huggingface_hub.constants
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    out = adapter_export
    assert (out / "adapter_config.json").is_file() and (out / "base" / "config.json").is_file()
    meta = card_metadata(out / "README.md")
    assert meta["library_name"] == "peft" and meta["pipeline_tag"] == "text-generation"
    assert "adapter, not merged" in (out / "README.md").read_text()
    _no_machine_paths(out, run.parent, tmp_path)
    want = _logits(*load_model(str(run / "checkpoints" / "step-00000002" / "policy")))
    # plain peft, no hub, from another working directory
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    model = AutoPeftModelForCausalLM.from_pretrained(str(out))
    torch.testing.assert_close(_logits(model, AutoTokenizer.from_pretrained(out)), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(_logits(*load_model(str(out))), want, rtol=1e-4, atol=1e-5)  # and envace


_PEFT_LOAD = """
import sys, torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer
model = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = torch.tensor([tok("Add a meeting on Monday.")["input_ids"]])
with torch.no_grad():
    torch.save(model(ids).logits, sys.argv[2])
"""


@pytest.mark.slow
def test_no_merge_adapter_loads_in_a_fresh_offline_interpreter(run, adapter_export, tmp_path):
    """The same in a fresh interpreter started with HF_HUB_OFFLINE=1 (read at import time)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    logits = tmp_path / "logits.pt"
    proc = subprocess.run([sys.executable, "-c", _PEFT_LOAD, str(adapter_export), str(logits)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = _logits(*load_model(str(run / "checkpoints" / "step-00000002" / "policy")))
    torch.testing.assert_close(torch.load(logits), want, rtol=1e-4, atol=1e-5)


def test_a_run_with_lora_off_says_so(tmp_path, capsys):
    run = _train(tmp_path, steps=1, lora={"enabled": False}, eval={"every": 0, "tasks": 2})
    out = tmp_path / "full"
    assert main(["export", "model", str(run), "--to", str(out), "--no-merge"]) == 0
    assert "nothing to keep unmerged" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert "LoRA off" in card and "merged into" not in card and "lora" not in card_metadata(out / "README.md")["tags"]
    assert not (out / "adapter_config.json").exists() and (out / "config.json").is_file()


@pytest.mark.slow
def test_eval_of_an_export_prompts_as_its_training_run_did(tmp_path, capsys):
    """A run trained with the json tool format: `envace eval --model EXPORTED` reads the export's
    envace_train_config.yaml and prompts with json tools, as evaluating its checkpoint does."""
    from envace.experiments.eval_models import resolve_eval_models

    run = _train(tmp_path, steps=1, eval={"every": 0, "tasks": 2}, prompt={"tool_format": "json"})
    out = tmp_path / "exported"
    assert main(["export", "model", str(run), "--to", str(out)]) == 0
    models = resolve_eval_models(str(out))
    assert models.style == PromptStyle(tool_format="json")
    # the turn and token caps come along; the task file and world (paths cut to a name) do not
    assert set(models.run_config) == {"prompt", "rollout"}
    capsys.readouterr()
    few = [*EVAL[:EVAL.index("--tasks")], "--tasks", "1", *EVAL[EVAL.index("--tasks") + 2:]]
    assert main(["eval", "--model", str(out), *few, "--out", str(tmp_path / "ev"), "--name", "exp"]) == 0
    assert "training prompt style from the export's envace_train_config.yaml" in capsys.readouterr().out
    cfg = yaml.safe_load((tmp_path / "ev" / "exp" / "config.yaml").read_text())
    assert cfg["resolved"]["prompt_style"]["tool_format"] == "json"
    # exporting the export keeps the run's config, so its template renders json tools too
    again = tmp_path / "again"
    assert main(["export", "model", str(out), "--to", str(again)]) == 0
    assert yaml.safe_load((again / "envace_train_config.yaml").read_text())["prompt"]["tool_format"] == "json"


def test_export_of_nothing_says_so(tmp_path, capsys):
    assert main(["export", "model", str(tmp_path / "nope"), "--to", str(tmp_path / "x")]) == 2
    assert "no such run" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_export_names_its_base_and_renders_tools_as_training_did(tmp_path):
    """The real SmolLM2: its card names the hub base model, and its exported template is exact."""
    from transformers import AutoTokenizer

    run = _train(tmp_path, model="smollm2", steps=1, tasks_per_step=1, eval={"every": 0, "tasks": 1},
                 worlds=["shop"], difficulties=None, tool_distractors=None)
    out = tmp_path / "exported"
    assert main(["export", "model", str(run), "--to", str(out)]) == 0
    meta = card_metadata(out / "README.md")
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and meta["license"] == "apache-2.0"
    _no_machine_paths(out, run.parent, tmp_path)
    _, tok = load_model("smollm2")
    tasks = select_tasks("shop", "all", 4, tasks_per_world=60)
    _assert_template_matches_training(tok, AutoTokenizer.from_pretrained(out), PromptStyle(), tasks)
