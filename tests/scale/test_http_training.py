"""Training with rollouts on a serving engine (``rollout.backend: http``) against ``envace serve``
started here on 127.0.0.1, and that server checked with the official ``openai`` client (streaming included).

A 2-step run through HTTP is compared with the same run generating in process: the server gets
the trainer's warm-started weights before the first rollout and the updated ones after every step,
so it samples the same tokens with the same log-probs, and it ends holding the final weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from test_train_distributed import _task_file

from envace.cli.main import main
from envace.core.jsonl import read_jsonl_dicts
from envace.experiments.rundir import RunDir
from envace.policy.http_server import OpenAIServer
from envace.policy.loading import load_model
from envace.core.sampling import Generation
from envace.policy.transformers_backend import TransformersBackend
from envace.policy.vllm_backend import vllm_state_dict

LOGPROB_TOL = 1e-4  # same weights, same batches, fp32 on one CPU: float rounding only


def _config(tmp: Path, mode: str = "share") -> Path:
    cfg = {
        "model": "tiny", "task_file": str(_task_file(tmp / "tasks.jsonl")), "tool_distractors": 0, "steps": 2,
        "tasks_per_step": 2, "group_size": 2, "threads": 1, "mode": mode, "seed": 3,
        # fp32 in process as on the (fp32) server: a task-file run would otherwise take bf16 where the
        # machine computes it natively (experiments/data_defaults.py), and sample other tokens
        "rollout": {"max_turns": 2, "caller_max_new_tokens": 8, "simulator_max_new_tokens": 8, "max_batch": 8,
                    "dtype": "float32"},
        "mixed_precision": "no",
        "prompt": {"max_examples": 1},
        "grpo": {"lr": 1e-2},
        "lora": {"enabled": True, "r": 2, "alpha": 4},
        "sft": {"trajectories": 2, "epochs": 1},
        "eval": {"every": 0, "tasks": 2},
        "checkpoint": {"every": 1, "keep_last": 2},
        "out": str(tmp / "runs"),
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train_rows(run: Path) -> list[dict]:
    return [r for r in read_jsonl_dicts(run / "trajectories.jsonl") if r.get("phase", "train") == "train"]


def test_two_steps_through_http_match_in_process_and_the_server_ends_with_the_new_weights(tmp_path):
    cfg = _config(tmp_path)
    model, tok = load_model("tiny")  # the server starts from the base model, not the run's warm start
    with OpenAIServer(TransformersBackend(model, tok, max_batch=8), model_name="tiny",
                      allow_weight_updates=True) as server:
        assert main(["train", "--config", str(cfg), "--set", f"out={tmp_path / 'http'}", "--set", "rollout.backend=http",
                     "--set", f"rollout.server_url={server.url}"]) == 0
        assert server.weight_version == 3  # the warm start, then after each of the 2 updates
        served = {k: v.clone() for k, v in server.backend.model.state_dict().items()}
    assert main(["train", "--config", str(cfg), "--set", f"out={tmp_path / 'local'}"]) == 0
    http_run, local_run = (next(p for p in (tmp_path / d).iterdir() if p.is_dir()) for d in ("http", "local"))
    http_rows, local_rows = _train_rows(http_run), _train_rows(local_run)
    assert len(http_rows) == len(local_rows) > 0
    compared = 0
    for h, loc in zip(http_rows, local_rows):
        for a, b in zip(h["samples"], loc["samples"]):
            assert a["gen_ids"] == b["gen_ids"]  # same tokens sampled on the server and in process
            assert a["logprobs"] == pytest.approx(b["logprobs"], abs=LOGPROB_TOL)
            compared += len(a["gen_ids"])
    assert compared > 20
    metrics = [r for r in RunDir(http_run).metrics() if r.get("phase") == "train"]
    assert [r["step"] for r in metrics] == [1, 2]
    assert all(r["logprob_gap_max"] < LOGPROB_TOL for r in metrics)  # engine vs trainer, recomputed
    # The server holds the final weights: the run's last checkpoint, LoRA merged.
    final, _ = load_model(str(http_run / "checkpoints" / "step-00000002" / "policy"))
    want = vllm_state_dict(final)
    assert want.keys() <= served.keys()
    for k, v in want.items():
        torch.testing.assert_close(served[k], v, rtol=0, atol=1e-6, msg=k)
    base, _ = load_model("tiny")
    assert any(not torch.allclose(served[k], base.state_dict()[k]) for k in want)  # it did change


def test_http_backend_needs_a_server_url(tmp_path, capsys):
    assert main(["train", "--config", str(_config(tmp_path)), "--set", "rollout.backend=http"]) != 0
    assert "rollout.server_url" in capsys.readouterr().err


def test_weight_updates_are_refused_unless_allowed(tmp_path):
    from envace.policy.http_backend import HTTPBackend, HTTPBackendError

    model, tok = load_model("tiny")
    with OpenAIServer(TransformersBackend(model, tok), model_name="tiny") as server:
        with pytest.raises(HTTPBackendError, match="allow-weight-updates"):
            HTTPBackend(server.url, tok).post("/load_weights", {"path": str(tmp_path / "w.safetensors")})
    with OpenAIServer(TransformersBackend(model, tok), model_name="tiny", allow_weight_updates=True) as server:
        client = HTTPBackend(server.url, tok, max_retries=0)
        with pytest.raises(HTTPBackendError, match="cannot load weights"):
            client.post("/load_weights", {"path": str(tmp_path / "missing.safetensors")})
        from safetensors.torch import save_file

        save_file({"no.such.weight": torch.zeros(2)}, str(tmp_path / "bad.safetensors"))
        with pytest.raises(HTTPBackendError, match="does not have"):
            client.post("/load_weights", {"path": str(tmp_path / "bad.safetensors")})


class _ToolCaller:
    """A backend whose model always calls ``get_order`` (a tiny random model never writes a
    well-formed call, and the server's parsing is what is under test)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def generate(self, prompts, params):
        text = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "o-%d"}}\n</tool_call>'
        out = []
        for i, _ in enumerate(prompts):
            ids = list(self.tokenizer(text % i, add_special_tokens=False)["input_ids"])
            out.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), text=text % i, finish="stop"))
        return out


def test_the_official_openai_client_gets_n_choices_and_parsed_tool_calls(tiny_backend):
    openai = pytest.importorskip("openai")
    tools = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
                                               "parameters": {"type": "object",
                                                              "properties": {"order_id": {"type": "string"}},
                                                              "required": ["order_id"]}}}]
    with OpenAIServer(_ToolCaller(tiny_backend.tokenizer), model_name="tiny") as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Where is o-1?"}],
                                             tools=tools, n=3)
        assert len(out.choices) == 3 and [c.index for c in out.choices] == [0, 1, 2]
        for i, choice in enumerate(out.choices):
            assert choice.finish_reason == "tool_calls"
            call = choice.message.tool_calls[0]
            assert call.function.name == "get_order"
            assert json.loads(call.function.arguments) == {"order_id": f"o-{i}"}
        streamed = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                       tools=tools, stream=True))
        calls = [tc for c in streamed for ch in c.choices for tc in (ch.delta.tool_calls or [])]
        assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
            ("get_order", {"order_id": "o-0"})]
        assert streamed[-1].choices[0].finish_reason == "tool_calls"
    with OpenAIServer(tiny_backend, model_name="tiny") as server:  # a real model: n sampled rows
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        out = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, n=2, seed=1, logprobs=1)
        assert len(out.choices) == 2 and all(len(c.logprobs.token_logprobs) >= 1 for c in out.choices)


@pytest.mark.parametrize("mode", ["share", "noshare", "caller_only", "frozen_caller"])
def test_every_mode_trains_two_steps_from_the_cli(tmp_path, mode):
    assert main(["train", "--config", str(_config(tmp_path, mode))]) == 0
    run = next(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    rows = [r for r in RunDir(run).metrics() if r.get("phase") == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    trained = {k.split("/")[0] for r in rows for k in r if k.endswith("/optimizer_steps")}
    assert trained == {"share": {"policy"}, "noshare": {"caller", "simulator"}, "caller_only": {"caller"},
                       "frozen_caller": {"policy"}}[mode]


def test_caller_only_with_an_external_simulator_endpoint(tmp_path):
    """The reference's setting: the caller trains, a frozen simulator answers over HTTP; the run
    pushes nothing to it, and that endpoint is what writes the rehearsed responses."""
    from envace.core.types import ToolCall
    from envace.experiments.config import parse_config
    from envace.experiments.rollout_backends import rollout_backends
    from envace.experiments.tasks import select_tasks
    from envace.policy.http_backend import HTTPBackend
    from envace.rollout.rehearse import ModelSource
    from envace.rollout.sources import ToolRequest

    model, tok = load_model("tiny")
    with OpenAIServer(TransformersBackend(model, tok), model_name="sim", allow_weight_updates=True) as server:
        args = ["--set", f"rollout.simulator_url={server.url}"]
        cfg_path = _config(tmp_path, "caller_only")
        assert main(["train", "--config", str(cfg_path), *args]) == 0
        assert server.weight_version == 0  # frozen: nothing pushed to it
        cfg = parse_config(yaml.safe_load(cfg_path.read_text()) | {"rollout": {"simulator_url": server.url}})
        caller, _ = load_model("tiny")
        frozen, _ = load_model("tiny")
        models = type("Models", (), {"trained": {"caller": caller}, "for_role": lambda self, r: caller})()
        backends = rollout_backends(cfg, models, frozen, tok, "cpu", tmp_path)
        assert isinstance(backends.simulator, HTTPBackend) and not backends.pushers
        task = select_tasks("shop", "all", None, difficulties=[1], tool_distractors=0, tasks_per_world=60)[0]
        call = ToolCall(name=task.tools[0].name, arguments={})
        source = ModelSource(backend=backends.simulator, name="simulator", record_samples=False, max_new_tokens=4)
        [resp] = source.respond([ToolRequest(task=task, call=call, earlier=[], state=None, trajectory_index=0,
                                             turn=0)])
        assert resp.rehearsed and resp.extra["gen_tokens"] >= 1
