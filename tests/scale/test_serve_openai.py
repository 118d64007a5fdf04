"""``envace serve`` through the official ``openai`` client and raw httpx2: streaming, refused fields,
the model name, ``tool_choice``, chat logprobs, the request log, and a burst of 200 requests."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.core.sampling import Generation, SamplingParams
from envace.policy.http_server import OpenAIServer, RequestError
from envace.policy.transformers_backend import TransformersBackend

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
                                           "parameters": {"type": "object",
                                                          "properties": {"order_id": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "cancel_order", "description": "Cancel an order.",
                                           "parameters": {"type": "object",
                                                          "properties": {"order_id": {"type": "string"}}}}}]
HI = [{"role": "user", "content": "Name a colour."}]


def _client(server: OpenAIServer) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


class _Writes:
    """A backend whose model writes ``text`` after whatever prompt it gets (EOS-free, finish stop),
    recording the prompts: what the server does with a given output is under test."""

    def __init__(self, tokenizer, text: str, delay: float = 0.005) -> None:
        self.tokenizer, self.text, self.prompts, self.delay = tokenizer, text, [], delay
        self.running = self.most_running = 0
        self._lock = threading.Lock()

    def generate(self, prompts, params):
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        time.sleep(self.delay)
        self.prompts.extend(prompts)
        ids = list(self.tokenizer(self.text, add_special_tokens=False)["input_ids"])
        with self._lock:
            self.running -= 1
        return [Generation(token_ids=ids, logprobs=[-0.25] * len(ids), text=self.text, finish="stop")
                for _ in prompts]


class _Streams(_Writes):
    """``_Writes`` with the per-token hook: each row's tokens go to ``on_tokens`` one at a time,
    rows interleaved, as a decode loop hands them out."""

    def generate(self, prompts, params, on_tokens=None):
        gens = super().generate(prompts, params)
        for k in range(max(len(g.token_ids) for g in gens)):
            for row, gen in enumerate(gens):
                if on_tokens is not None and k < len(gen.token_ids):
                    on_tokens(row, gen.token_ids[k:k + 1], gen.logprobs[k:k + 1])
        return gens


class _Gated:
    """The tiny model, pausing its generation after ``after`` tokens until ``read`` is set (by a
    client that has read a chunk): a stream sent only once generation ends would never set it."""

    def __init__(self, backend, after: int = 6) -> None:
        self.backend, self.tokenizer, self.eos_ids, self.after = backend, backend.tokenizer, backend.eos_ids, after
        self.read, self.waited, self.tokens = threading.Event(), None, 0

    def generate(self, prompts, params, on_tokens=None):
        def hook(row, token_ids, logprobs):
            if on_tokens is not None:
                on_tokens(row, token_ids, logprobs)
            self.tokens += len(token_ids)
            if self.tokens == self.after:
                self.waited = self.read.wait(timeout=60)

        return self.backend.generate(prompts, params, on_tokens=hook)


# ---------------------------------------------------------------------------- streaming


def test_streamed_chat_and_completions_equal_the_whole_answers(tiny_server):
    client = _client(tiny_server)
    whole = client.chat.completions.create(model="tiny", messages=HI, temperature=0, max_tokens=12, logprobs=True)
    chunks = list(client.chat.completions.create(model="tiny", messages=HI, temperature=0, max_tokens=12,
                                                 logprobs=True, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(text) > 0
    streamed_lp = [t.logprob for c in chunks if c.choices and c.choices[0].logprobs
                   for t in c.choices[0].logprobs.content]
    assert streamed_lp == [t.logprob for t in whole.choices[0].logprobs.content]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    whole = client.completions.create(model="tiny", prompt="Hello", max_tokens=10, temperature=0, n=2, logprobs=1)
    chunks = list(client.completions.create(model="tiny", prompt="Hello", max_tokens=10, temperature=0, n=2,
                                            logprobs=1, stream=True))
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        assert "".join(c.text for c in mine) == whole.choices[i].text
        assert [v for c in mine if c.logprobs for v in c.logprobs.token_logprobs] == \
            whole.choices[i].logprobs.token_logprobs
        assert mine[-1].finish_reason == whole.choices[i].finish_reason


@pytest.mark.parametrize("kind", [_Writes, _Streams])
def test_streamed_tool_calls_with_n(tiny_backend, kind):
    writes = kind(tiny_backend.tokenizer, 'Looking. <tool_call>\n{"name": "get_order", "arguments": '
                                          '{"order_id": "o-7"}}\n</tool_call>')
    with OpenAIServer(writes, model_name="tiny") as server:
        chunks = list(_client(server).chat.completions.create(model="tiny", messages=HI, tools=TOOLS, n=2,
                                                              stream=True))
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        assert all("<" not in (c.delta.content or "") for c in mine)  # no part of the call as content
        assert "".join(c.delta.content or "" for c in mine) == "Looking."
        calls = [tc for c in mine for tc in (c.delta.tool_calls or [])]
        assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
            ("get_order", {"order_id": "o-7"})]
        assert calls[0].id.startswith("call_") and mine[-1].finish_reason == "tool_calls"


_PARTS = ["Sure", " ", "\n", "<tool_call>", "</tool_call>", "<tool", "STOP", "ST", "é", "🙂", '{"name": "get_order"}',
          "<", "call", "x"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(_PARTS), max_size=14), tools=st.booleans())
def test_what_a_stream_sends_is_always_a_prefix_of_the_answer(tiny_backend, parts, tools):
    from envace.core.toolcall import CALL_CLOSE, parse_tool_calls
    from envace.policy.http_server import _RowStream

    tok = tiny_backend.tokenizer
    text = "".join(parts)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    decode = lambda t: tok.decode(t, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa: E731
    full = decode(ids)
    final = full[: full.find("STOP")] if "STOP" in full else full  # the answer: the stop string cut off
    if tools:
        parsed = parse_tool_calls(final)
        final = parsed.content if parsed.calls else final
    row = _RowStream("", ["STOP"] + (["<tool_call", CALL_CLOSE] if tools else []), frozenset(), strip=tools)
    sent = ""
    for t in ids:
        sent += row.add([t], [0.0], decode)
        assert final.startswith(sent) or final.startswith(sent.lstrip())
        if tools:
            assert "<tool_call" not in sent and sent == sent.rstrip()
    assert sent + row.rest_of(final) in (final, sent[: len(sent) - len(sent.lstrip())] + final)


def test_a_stream_sends_tokens_while_the_model_still_generates(tiny_backend):
    gated = _Gated(tiny_backend)
    with OpenAIServer(gated, model_name="tiny") as server:
        client = _client(server)
        content = []
        for chunk in client.chat.completions.create(model="tiny", messages=HI, temperature=0, max_tokens=24,
                                                    stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                content.append(chunk.choices[0].delta.content)
                gated.read.set()  # the generation, paused after a few tokens, goes on only now
        assert gated.waited is True  # a chunk reached the client before the generation ended
        assert len(content) > 1
        gated.after = 0
        whole = client.chat.completions.create(model="tiny", messages=HI, temperature=0, max_tokens=24)
    assert "".join(content) == whole.choices[0].message.content


def test_the_first_chunk_comes_long_before_the_last(tiny_server):
    started = time.monotonic()
    arrived = []
    for chunk in _client(tiny_server).completions.create(model="tiny", prompt="Once upon a time", max_tokens=160,
                                                         temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].text:
            arrived.append(time.monotonic() - started)
    assert len(arrived) > 20
    assert arrived[0] < 0.5 * arrived[-1], (arrived[0], arrived[-1])
    assert arrived == sorted(arrived)


def test_a_stream_never_shows_a_stop_string_and_ends_as_the_whole_answer(tiny_backend, tiny_server):
    client = _client(tiny_server)
    free = client.completions.create(model="tiny", prompt="Hello", max_tokens=16, temperature=0)
    ids = tiny_backend.tokenizer(free.choices[0].text, add_special_tokens=False)["input_ids"]
    stop = tiny_backend.tokenizer.decode(ids[4:7])  # over three tokens: its start arrives two tokens early
    for include in (False, True):
        kwargs = {"model": "tiny", "prompt": "Hello", "max_tokens": 16, "temperature": 0, "stop": [stop],
                  "extra_body": {"include_stop_str_in_output": include}}
        whole = client.completions.create(**kwargs).choices[0]
        pieces = [c.choices[0].text for c in client.completions.create(stream=True, **kwargs)]
        assert whole.finish_reason == "stop" and "".join(pieces) == whole.text
        cut = whole.text[: len(whole.text) - len(stop)] if include else whole.text  # the text before the stop
        sent = ""
        for piece in pieces:
            sent += piece
            assert cut.startswith(sent) or sent == whole.text  # no part of the stop before the end
        assert len([p for p in pieces if p]) > 1


def test_a_failure_mid_stream_ends_it_with_an_error(tiny_backend):
    class Fails(_Streams):
        def generate(self, prompts, params, on_tokens=None):
            if on_tokens is None:  # not streamed: fine
                return super().generate(prompts, params)
            on_tokens(0, [42], [-1.0])
            raise RuntimeError("the model fell over")

    with OpenAIServer(Fails(tiny_backend.tokenizer, "x"), model_name="tiny") as server:
        got = []
        with pytest.raises(openai.APIError, match="fell over"):
            for chunk in _client(server).completions.create(model="tiny", prompt="Hi", stream=True):
                got.append(chunk.choices[0].text)
        assert got  # what was sampled before the failure went out
        assert _client(server).completions.create(model="tiny", prompt="Hi").choices[0].text == "x"


def test_a_client_that_leaves_mid_stream_stops_its_generation(tiny_backend):
    endless = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer)
    endless.eos_ids = frozenset()  # only max_tokens would end it
    gated = _Gated(endless, after=0)
    with OpenAIServer(gated, model_name="tiny") as server:
        body = {"model": "tiny", "prompt": "Once", "max_tokens": 3000, "temperature": 0, "stream": True}
        with httpx2.stream("POST", server.url + "/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break  # the first chunk: leave
        started = time.monotonic()
        short = _client(server).completions.create(model="tiny", prompt="Hi", max_tokens=2)  # waits for the worker
        assert short.choices[0].finish_reason == "length" and time.monotonic() - started < 60
    assert gated.tokens < 3000


# ---------------------------------------------------------------------------- refused, honoured


@pytest.mark.parametrize("kwargs,field", [
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools to call
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "refund"}}}, "tool_choice"),
    ({"n": 0}, "n"),
    ({"temperature": "hot"}, "temperature"),
])
def test_unsupported_or_bad_chat_fields_are_a_400_naming_the_field(tiny_server, kwargs, field):
    with pytest.raises(openai.BadRequestError, match=field) as err:
        _client(tiny_server).chat.completions.create(model="tiny", messages=HI, max_tokens=2, **kwargs)
    assert err.value.body["param"] == field and err.value.body["type"] == "invalid_request_error"


def test_unsupported_completion_fields_and_neutral_values(tiny_server):
    client = _client(tiny_server)
    for kwargs, field in [({"echo": True}, "echo"), ({"logprobs": 3}, "logprobs"), ({"best_of": 2}, "best_of"),
                          ({"suffix": "!"}, "suffix")]:
        with pytest.raises(openai.BadRequestError, match=field):
            client.completions.create(model="tiny", prompt="Hi", max_tokens=2, **kwargs)
    # The neutral values of what sampling does not implement are fine (clients send defaults).
    out = client.completions.create(model="tiny", prompt="Hi", max_tokens=2, presence_penalty=0, echo=False,
                                    best_of=1, user="u1")
    assert len(out.choices) == 1


def test_an_unknown_model_is_a_404_and_response_format_text_is_fine(tiny_server):
    client = _client(tiny_server)
    with pytest.raises(openai.NotFoundError, match="gpt-4o") as err:
        client.chat.completions.create(model="gpt-4o", messages=HI, max_tokens=2)
    assert err.value.body["code"] == "model_not_found" and "tiny" in err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="tiny-2", prompt="Hi", max_tokens=2)
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    out = client.chat.completions.create(model="tiny", messages=HI, max_tokens=2, response_format={"type": "text"})
    assert out.choices[0].message.role == "assistant"


def test_tool_choice_none_required_and_named(tiny_backend):
    tok = tiny_backend.tokenizer
    with OpenAIServer(_Writes(tok, '{"order_id": "o-1"}}\n</tool_call>'), model_name="tiny") as server:
        client = _client(server)
        named = client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "cancel_order"}})
        # The call is forced by starting the answer with its opening, the named function's included.
        assert tok.decode(server.backend.prompts[-1]).endswith('<tool_call>\n{"name": "cancel_order", "arguments": ')
        call = named.choices[0].message.tool_calls[0]
        assert named.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("cancel_order", {"order_id": "o-1"})
    with OpenAIServer(_Writes(tok, '{"name": "get_order", "arguments": {}}\n</tool_call>'),
                      model_name="tiny") as server:
        client = _client(server)
        required = client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS, tool_choice="required")
        assert tok.decode(server.backend.prompts[-1]).endswith("<tool_call>\n")
        assert required.choices[0].message.tool_calls[0].function.name == "get_order"
        none = client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS, tool_choice="none")
        assert "get_order" not in tok.decode(server.backend.prompts[-1])  # no tools offered
        assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason == "stop"


def test_parallel_tool_calls_false_keeps_the_first_call(tiny_backend):
    two = "".join(f'<tool_call>\n{{"name": "get_order", "arguments": {{"order_id": "o-{i}"}}}}\n</tool_call>'
                  for i in (1, 2))
    with OpenAIServer(_Writes(tiny_backend.tokenizer, two), model_name="tiny") as server:
        client = _client(server)
        both = client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS)
        one = client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS, parallel_tool_calls=False)
    assert len(both.choices[0].message.tool_calls) == 2 and len(one.choices[0].message.tool_calls) == 1


def test_chat_logprobs_are_the_sampled_tokens(tiny_backend, tiny_server):
    out = _client(tiny_server).chat.completions.create(model="tiny", messages=HI, temperature=0, max_tokens=8,
                                                       logprobs=True)
    want = tiny_backend.generate([tiny_server.render_chat(HI, None)], SamplingParams(max_new_tokens=8,
                                                                                    temperature=0.0))[0]
    content = out.choices[0].logprobs.content
    assert [t.logprob for t in content] == pytest.approx(want.logprobs, abs=1e-4)
    assert len(content) == out.usage.completion_tokens and all(t.top_logprobs == [] for t in content)
    assert _client(tiny_server).chat.completions.create(model="tiny", messages=HI, max_tokens=2).choices[0].logprobs \
        is None


# ---------------------------------------------------------------------------- log, load


def test_every_request_is_logged_on_one_line(tiny_server, caplog):
    client = _client(tiny_server)
    with caplog.at_level(logging.INFO, logger="envace.serve"):
        client.models.list()
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=2)
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="tiny", input="x")
        deadline = time.monotonic() + 5
        while len(caplog.records) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # the line is written once the last byte is sent
    lines = [r.getMessage() for r in caplog.records if r.name == "envace.serve"]
    assert [line.rsplit(" ", 2)[0] for line in lines] == [
        "GET /v1/models 200", "POST /v1/chat/completions 200", "POST /v1/embeddings 404"]
    assert all(line.endswith(" ms") and float(line.split()[-2]) >= 0 for line in lines)


async def _burst(url: str, n: int, body: dict) -> list[httpx2.Response]:
    limits = httpx2.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(client.post(url + "/completions", json=body) for _ in range(n)))


def test_200_concurrent_requests_are_all_answered_one_generation_at_a_time(tiny_backend):
    writes = _Writes(tiny_backend.tokenizer, "ok")
    with OpenAIServer(writes, model_name="tiny") as server:
        answers = asyncio.run(_burst(server.url, 200, {"model": "tiny", "prompt": "Hi", "max_tokens": 2}))
    assert [r.status_code for r in answers] == [200] * 200  # queued, none reset
    assert writes.most_running == 1 and len(writes.prompts) == 200  # never two generations at once


def test_a_full_queue_answers_503_with_retry_after(tiny_backend):
    with OpenAIServer(_Writes(tiny_backend.tokenizer, "ok", delay=0.05), model_name="tiny", max_queue=4) as server:
        answers = asyncio.run(_burst(server.url, 200, {"model": "tiny", "prompt": "Hi", "max_tokens": 2}))
        again = httpx2.post(server.url + "/completions", json={"prompt": "Hi", "max_tokens": 2})
    codes = [r.status_code for r in answers]
    assert set(codes) == {200, 503} and codes.count(200) >= 4
    busy = [r for r in answers if r.status_code == 503]
    assert all(int(r.headers["retry-after"]) >= 1 and r.json()["error"]["type"] == "server_busy" for r in busy)
    assert again.status_code == 200  # the queue drained


def test_200_concurrent_requests_on_the_tiny_model(tiny_server):
    """The real model behind the queue: every request gets its greedy completion."""
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0}
    answers = asyncio.run(_burst(tiny_server.url, 200, body))
    assert [r.status_code for r in answers] == [200] * 200
    assert len({r.json()["choices"][0]["text"] for r in answers}) == 1


def test_a_request_whose_client_left_while_queued_is_not_generated(tiny_backend, caplog):
    caplog.set_level(logging.INFO, logger="envace.serve")
    writes = _Writes(tiny_backend.tokenizer, "ok", delay=0.8)
    body = {"prompt": "Hi", "max_tokens": 2}
    with OpenAIServer(writes, model_name="tiny") as server:
        first = threading.Thread(target=httpx2.post, args=(server.url + "/completions",), kwargs={"json": body})
        first.start()
        while writes.running == 0:  # until the first one is generating: the next one waits
            time.sleep(0.01)
        with pytest.raises(httpx2.TimeoutException):
            httpx2.post(server.url + "/completions", json=body | {"prompt": "left"}, timeout=0.2)
        first.join()
        assert httpx2.post(server.url + "/completions", json=body).status_code == 200
    said = [tiny_backend.tokenizer.decode(p) for p in writes.prompts]
    assert said == ["Hi", "Hi"]  # the abandoned request never reached the model
    assert any(r.getMessage().startswith("POST /v1/completions 499") for r in caplog.records)


_leaf = st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=False) | st.text(max_size=8)
_json = st.recursive(_leaf,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                   max_size=3), max_leaves=8)
_CHOICES = ["none", "auto", "required", "bogus", {"type": "function", "function": {"name": "get_order"}},
            {"type": "function", "function": "get_order"}, {"type": "function"}, {"function": {"name": "x"}}]
_TOOLSETS = [TOOLS, [], [{"type": "function", "function": "x"}], [{"type": "function", "function": {"name": 5}}],
             [{"type": "retrieval"}]]
_FIELDS = {  # mostly plausible values, so that a body often gets past the first check
    "model": st.sampled_from(["tiny", "other"]), "n": st.integers(-1, 3),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, {}]),
    "logprobs": st.booleans() | _json, "top_logprobs": st.integers(-1, 2), "stream": st.booleans(),
    "stream_options": st.sampled_from([{"include_usage": True}, {"x": 1}]),
    "stop": st.sampled_from(["</x>", ["a", ""], 5]),
    "max_tokens": st.integers(-1, 4), "temperature": st.floats(0, 2) | st.text(max_size=3),
    "parallel_tool_calls": st.booleans(), "presence_penalty": st.sampled_from([0, 0.5]), "metadata": _json}
_body = st.tuples(st.fixed_dictionaries({"tools": st.sampled_from(_TOOLSETS) | _json,
                                         "tool_choice": st.sampled_from(_CHOICES) | _json}),
                  st.sets(st.sampled_from(sorted(_FIELDS)), max_size=3).flatmap(
                      lambda keys: st.fixed_dictionaries({k: _FIELDS[k] for k in keys}))).map(lambda d: d[0] | d[1])
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool", "system", "bot"])},
                                 optional={"content": st.text(max_size=20) | _json, "tool_calls": st.sampled_from([
                                     [{"function": {"name": "get_order", "arguments": '{"order_id": "o-1"}'}}],
                                     [{"function": {"name": "get_order", "arguments": "{not json"}}],
                                     [{"function": "get_order"}], [5], "call"]) | _json})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_body, messages=st.lists(_message, max_size=3))
def test_any_body_is_an_answer_or_a_request_error(hostile_server, body, messages):
    """Whatever a client sends, the server answers or refuses with a RequestError (a 400/404),
    never another exception (a 500)."""
    body = {"messages": messages, **body} if messages else body
    try:
        hostile_server.chat_completions(body)
    except RequestError:
        pass


@pytest.fixture(scope="module")
def hostile_server(tiny_backend):
    server = OpenAIServer(_Writes(tiny_backend.tokenizer, "<tool_call>{}", 0), model_name="tiny")
    yield server
    server.close()


_COMPLETION_FIELDS = {
    "prompt": st.sampled_from(["Hi", [1, 2], [[1], [2, 3]], ["a", "b"], [], [-1], [10 ** 9], [True], [[]]]) | _json,
    "n": st.integers(-1, 3), "logprobs": st.integers(-1, 3) | _json, "echo": st.booleans(),
    "return_tokens_as_token_ids": st.booleans(), "include_stop_str_in_output": st.booleans(),
    "stop": st.sampled_from(["ok", ["o", ""], 5]), "max_tokens": st.integers(-1, 4), "best_of": st.integers(0, 2),
    "stream": st.booleans(), "suffix": st.sampled_from(["", "!"]), "logit_bias": st.sampled_from([{}, {"1": 5}])}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.sets(st.sampled_from(sorted(_COMPLETION_FIELDS)), max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({"prompt": _COMPLETION_FIELDS["prompt"]} | {
        k: _COMPLETION_FIELDS[k] for k in keys})))
def test_any_completion_body_is_an_answer_or_a_request_error(hostile_server, body):
    try:
        out = hostile_server.completions(body)
    except RequestError:
        return
    assert len(out["choices"]) >= 1
