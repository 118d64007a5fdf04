"""HTTPBackend against real loopback servers: ``envace serve`` around the tiny model, and small
scripted servers for failures, timeouts and concurrency."""

from __future__ import annotations

import logging
import math
import socket
import threading
import time

import pytest
from conftest import completion, scripted_server, url_of

from envace.policy.backend import GenerationBackend
from envace.policy.http_backend import (
    HTTPBackend,
    HTTPBackendError,
    ServerTimeoutError,
    ServerUnavailableError,
    normalise_base_url,
    row_seed,
)
from envace.policy.http_server import OpenAIServer
from envace.core.sampling import Generation, SamplingParams

FAST = {"backoff": 0.01, "max_backoff": 0.05}


def _prompts(tok) -> list[list[int]]:
    chats = [[{"role": "user", "content": "Cancel my last order."}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
             [{"role": "user", "content": "hi"}]]
    return [list(tok(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]) for c in chats]


def _same(a: Generation, b: Generation) -> None:
    assert a.token_ids == b.token_ids
    assert a.text == b.text
    assert a.finish == b.finish
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


# ---------------------------------------------------------------------------- round trips


def test_completions_round_trip_equals_in_process_greedy(tiny_backend, tiny_server):
    http = HTTPBackend(tiny_server.url, tokenizer=tiny_backend.tokenizer)
    assert isinstance(http, GenerationBackend)
    assert http.model == "tiny"  # discovered through /v1/models
    prompts = _prompts(tiny_backend.tokenizer)
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    want = tiny_backend.generate(prompts, params)
    got = http.generate(prompts, params)
    for a, b in zip(got, want):
        _same(a, b)
    # A stop string taken from the greedy text ends the rows at the same place, kept in the text.
    stop = want[0].text[3:5]
    params = SamplingParams(max_new_tokens=12, temperature=0.0, stop=[stop])
    want = tiny_backend.generate(prompts, params)
    got = http.generate(prompts, params)
    assert want[0].finish == "stop" and want[0].text.endswith(stop)
    for a, b in zip(got, want):
        _same(a, b)


def test_batched_request_reproduces_in_process_seeded_sampling(tiny_backend, tiny_server):
    """batch_prompts: one request, one seed, rows seeded by index exactly as in process."""
    http = HTTPBackend(tiny_server.url, tokenizer=tiny_backend.tokenizer, batch_prompts=True, max_concurrency=1)
    prompts = _prompts(tiny_backend.tokenizer)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7)
    for a, b in zip(http.generate(prompts, params), tiny_backend.generate(prompts, params)):
        _same(a, b)


def test_request_body_token_prompts_seeds_and_extras():
    bodies = []

    def respond(path, body):
        bodies.append(body)
        return 200, completion([5, 6]), {}

    with scripted_server(respond) as srv:
        http = HTTPBackend(url_of(srv), tokenizer=_FakeTok(), model="m", **FAST)
        http.generate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=5, temperature=1.0, seed=3, stop=["</x>"]))
        plain = HTTPBackend(url_of(srv), tokenizer=_FakeTok(), model="m", server_extras=False, **FAST)
        plain.generate([[1, 2, 3]], SamplingParams(max_new_tokens=5))
    first = bodies[:4]
    assert all(b["prompt"] == [1, 2, 3] and b["max_tokens"] == 5 and b["stop"] == ["</x>"] for b in first)
    # G copies of one prompt get G different seeds (vLLM would repeat one sample under one seed).
    assert sorted(b["seed"] for b in first) == sorted(row_seed(3, i) for i in range(4))
    assert all(b["return_tokens_as_token_ids"] and b["include_stop_str_in_output"] for b in first)
    assert "return_tokens_as_token_ids" not in bodies[4] and "seed" not in bodies[4]


def test_server_without_token_ids_is_retokenised(tiny_backend):
    tok = tiny_backend.tokenizer

    def respond(path, body):
        # An OpenAI-style server: text only, the stop string cut off, string tokens.
        return 200, {"choices": [{"index": 0, "text": "Hello world", "finish_reason": "stop", "stop_reason": "</e>",
                                  "logprobs": {"tokens": ["Hello", " world"], "token_logprobs": [-1.0, -2.0]}}]}, {}

    with scripted_server(respond) as srv:
        http = HTTPBackend(url_of(srv), tokenizer=tok, model="m", **FAST)
        gen = http.generate([[1, 2]], SamplingParams(max_new_tokens=8, stop=["</e>"]))[0]
    assert gen.text == "Hello world</e>"  # our convention keeps the stop string
    assert gen.token_ids == list(tok("Hello world</e>", add_special_tokens=False)["input_ids"])
    assert len(gen.logprobs) == len(gen.token_ids)
    assert all(math.isnan(v) for v in gen.logprobs)  # 2 logprobs cannot align with the re-tokenised ids


def test_chat_with_tools_round_trip(tiny_backend):
    tok = tiny_backend.tokenizer
    scripted = _ScriptedBackend(tok, '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    history = [{"role": "user", "content": "Weather in Rome, then Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'}]
    with OpenAIServer(scripted, model_name="scripted") as server:
        http = HTTPBackend(server.url, tokenizer=tok, **FAST)
        result = http.chat(history, tools=tools, temperature=0.0, max_new_tokens=32)
        plain = http.chat([{"role": "user", "content": "hi"}], temperature=0.0)
    assert result.finish == "tool_calls"
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert result.content is None
    prompt_text = tok.decode(scripted.prompts[0])
    assert "get_weather" in prompt_text and '"city": "Rome"' in prompt_text and '{"temp": 21}' in prompt_text
    assert plain.tool_calls and plain.finish == "stop"  # no tools sent: text parsed client-side
    assert "get_weather" not in tok.decode(scripted.prompts[1])


def test_chat_on_tiny_model_is_the_greedy_completion(tiny_backend, tiny_server):
    messages = [{"role": "user", "content": "Name a colour."}]
    http = HTTPBackend(tiny_server.url, tokenizer=tiny_backend.tokenizer)
    result = http.chat(messages, temperature=0.0, max_tokens=8)
    want = tiny_backend.generate([tiny_server.render_chat(messages, None)], SamplingParams(max_new_tokens=8,
                                                                                          temperature=0.0))[0]
    assert result.content == want.text and result.raw["usage"]["completion_tokens"] == len(want.token_ids)


def test_model_judge_over_http(tiny_backend, tiny_server):
    from envace.core.types import Message, Task, Trajectory
    from envace.reward.judge import ModelJudge

    task = Task(id="t", domain="shop", instruction="Say hi.", tools=[], checklist=[])
    traj = Trajectory(task_id="t", source="real", messages=[Message(role="user", content="Say hi."),
                                                            Message(role="assistant", content="hi")])
    judge = ModelJudge(HTTPBackend(tiny_server.url, tokenizer=tiny_backend.tokenizer), max_new_tokens=4)
    via_http = judge.judge("The assistant greeted the user.", task, traj)
    in_process = ModelJudge(tiny_backend, max_new_tokens=4).judge("The assistant greeted the user.", task, traj)
    assert via_http == in_process


# ---------------------------------------------------------------------------- failures


def test_retries_on_5xx_and_429_then_succeeds():
    calls = []
    script = [(503, {"error": {"message": "warming up"}}, {}), (429, {"error": {"message": "slow down"}},
                                                                {"Retry-After": "0"})]

    def respond(path, body):
        calls.append(time.monotonic())
        if len(calls) <= len(script):
            return script[len(calls) - 1]
        return 200, completion([7, 8, 9]), {}

    with scripted_server(respond) as srv:
        http = HTTPBackend(url_of(srv), tokenizer=_FakeTok(), model="m", max_retries=3, **FAST)
        gen = http.generate([[1]], SamplingParams(max_new_tokens=3))[0]
    assert gen.token_ids == [7, 8, 9] and gen.logprobs == [-0.5] * 3
    assert len(calls) == 3


def test_gives_up_after_max_retries_naming_the_url():
    calls = []

    def respond(path, body):
        calls.append(path)
        return 500, {"error": {"message": "CUDA out of memory"}}, {}

    with scripted_server(respond) as srv:
        http = HTTPBackend(url_of(srv), tokenizer=_FakeTok(), model="m", max_retries=2, **FAST)
        with pytest.raises(HTTPBackendError) as err:
            http.generate([[1]], SamplingParams(max_new_tokens=3))
    assert len(calls) == 3
    assert err.value.status == 500 and url_of(srv) + "/completions" in str(err.value)
    assert "CUDA out of memory" in str(err.value)


def test_client_errors_are_not_retried():
    calls = []

    def respond(path, body):
        calls.append(path)
        return 400, {"error": {"message": "max_tokens is too large"}}, {}

    with scripted_server(respond) as srv:
        http = HTTPBackend(url_of(srv), tokenizer=_FakeTok(), model="m", max_retries=3, **FAST)
        with pytest.raises(HTTPBackendError, match="HTTP 400: max_tokens is too large") as err:
            http.generate([[1]], SamplingParams(max_new_tokens=3))
    assert len(calls) == 1 and err.value.status == 400


def test_timeout_is_bounded_and_retried():
    release = threading.Event()
    calls = []

    def respond(path, body):
        calls.append(path)
        release.wait(3.0)  # far longer than the client waits
        return 200, completion([1]), {}

    with scripted_server(respond) as srv:
        http = HTTPBackend(url_of(srv), tokenizer=_FakeTok(), model="m", timeout=0.2, max_retries=1, **FAST)
        t0 = time.monotonic()
        with pytest.raises(ServerTimeoutError, match="0.2 s timeout"):
            http.generate([[1]], SamplingParams(max_new_tokens=3))
        elapsed = time.monotonic() - t0
        release.set()
    assert len(calls) == 2 and elapsed < 2.0


def test_server_down_gives_a_clear_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    http = HTTPBackend(f"http://127.0.0.1:{port}", tokenizer=_FakeTok(), model="m", max_retries=1, **FAST)
    with pytest.raises(ServerUnavailableError) as err:
        http.generate([[1]], SamplingParams(max_new_tokens=3))
    message = str(err.value)
    assert f"http://127.0.0.1:{port}/v1/completions" in message
    assert "Is it running?" in message and "2 attempts" in message


def test_concurrency_limit_is_respected_and_order_kept():
    lock = threading.Lock()
    state = {"now": 0, "max": 0}

    def respond(path, body):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.15)
        with lock:
            state["now"] -= 1
        return 200, completion([body["prompt"][0] * 10]), {}

    with scripted_server(respond) as srv:
        http = HTTPBackend(url_of(srv), tokenizer=_FakeTok(), model="m", max_concurrency=2, **FAST)
        gens = http.generate([[i] for i in range(1, 7)], SamplingParams(max_new_tokens=1))
    assert [g.token_ids for g in gens] == [[i * 10] for i in range(1, 7)]
    assert state["max"] == 2  # parallel, and never more than the limit


def test_a_busy_envace_serve_is_waited_for(tiny_backend, caplog):
    """A full queue answers 503 + Retry-After; the client backs off and gets every answer."""
    caplog.set_level(logging.INFO, logger="envace.serve")
    with OpenAIServer(_ScriptedBackend(tiny_backend.tokenizer, "ok", delay=0.1), model_name="tiny",
                      max_queue=1) as server:
        with HTTPBackend(server.url, tokenizer=tiny_backend.tokenizer, max_concurrency=8, max_retries=50,
                         **FAST) as http:
            gens = http.generate([[1, 2]] * 8, SamplingParams(max_new_tokens=2))
    assert [g.text for g in gens] == ["ok"] * 8
    assert len(server.backend.prompts) == 8  # each generated once: the refused ones never reached the model
    assert any(r.getMessage().startswith("POST /v1/completions 503") for r in caplog.records)


def test_api_key_from_environment(monkeypatch, tiny_backend):
    seen = []

    def respond(path, body):
        seen.append(body["_auth"])
        return 200, completion([1]), {}

    monkeypatch.setenv("MY_JUDGE_KEY", "s3cret")
    with scripted_server(respond) as srv:
        HTTPBackend(url_of(srv), tokenizer=_FakeTok(), model="m", api_key_env="MY_JUDGE_KEY").generate(
            [[1]], SamplingParams(max_new_tokens=1))
    assert seen == ["Bearer s3cret"]
    with OpenAIServer(tiny_backend, model_name="tiny", api_key="s3cret") as server:
        with pytest.raises(HTTPBackendError) as err:
            HTTPBackend(server.url, tokenizer=tiny_backend.tokenizer, model="tiny", **FAST).generate(
                [[1, 2]], SamplingParams(max_new_tokens=1))
        assert err.value.status == 401
        ok = HTTPBackend(server.url, tokenizer=tiny_backend.tokenizer, api_key_env="MY_JUDGE_KEY")
        assert len(ok.generate([[1, 2]], SamplingParams(max_new_tokens=2))[0].token_ids) == 2


def test_server_rejects_bad_requests(tiny_server):
    http = HTTPBackend(tiny_server.url, model="tiny", max_retries=0)
    with pytest.raises(HTTPBackendError, match="HTTP 400"):
        http._request("POST", "/completions", {"model": "tiny", "prompt": [], "max_tokens": 2})
    with pytest.raises(HTTPBackendError, match="HTTP 400.*max_new_tokens"):
        http._request("POST", "/completions", {"model": "tiny", "prompt": [1, 2], "max_tokens": 0})
    with pytest.raises(HTTPBackendError, match="HTTP 404"):
        http._request("POST", "/embeddings", {})
    with pytest.raises(HTTPBackendError, match="HTTP 405: GET is not allowed"):
        http._request("GET", "/completions")
    with pytest.raises(HTTPBackendError, match="HTTP 400: tools must be"):
        http._request("POST", "/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                    "tools": [{"type": "function", "function": "get"}]})
    with pytest.raises(HTTPBackendError, match="HTTP 400: messages must be"):
        http._request("POST", "/chat/completions", {"messages": "hi"})


def test_base_url_forms_and_cli_registration():
    assert normalise_base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalise_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert normalise_base_url("https://example.invalid/openai/v1") == "https://example.invalid/openai/v1"
    with pytest.raises(ValueError):
        normalise_base_url("127.0.0.1:8000")
    from envace.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--model", "tiny", "--port", "0"])
    assert args.command == "serve" and args.model == "tiny" and args.port == 0 and args.host == "127.0.0.1"


# ---------------------------------------------------------------------------- stand-ins


class _FakeTok:
    """Just enough tokenizer for servers that send token ids."""

    eos_token_id = 0
    all_special_ids = [0]

    def decode(self, ids, **_kw):
        return " ".join(str(i) for i in ids)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) for t in text.split()]}


class _ScriptedBackend:
    """A GenerationBackend that always writes ``text`` (then EOS) and records its prompts."""

    def __init__(self, tokenizer, text: str, delay: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.text = text
        self.delay = delay
        self.prompts: list[list[int]] = []

    def generate(self, prompts, params):
        time.sleep(self.delay)
        self.prompts.extend(prompts)
        ids = list(self.tokenizer(self.text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
        return [Generation(token_ids=ids, logprobs=[-0.1] * len(ids), text=self.text, finish="stop") for _ in prompts]
