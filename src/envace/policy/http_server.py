"""An OpenAI-compatible server around any GenerationBackend (``envace serve``), on starlette + uvicorn.

Routes: ``GET /v1/models``, ``GET /health``, ``POST /v1/completions`` (text or token-id prompts,
per-token logprobs, vLLM's ``return_tokens_as_token_ids`` / ``include_stop_str_in_output`` /
``stop_reason``), ``POST /v1/chat/completions`` (the tokenizer's chat template; ``tools`` rendered
natively when the template takes them, else as a Hermes-style system note; ``<tool_call>`` output
returned as OpenAI ``tool_calls``; ``tool_choice``; ``logprobs``), both with ``n`` and
``stream: true`` (server-sent events), and ``POST /v1/load_weights`` (a trainer's weight push).

A field the server does not implement is refused with a 400 that names it, in OpenAI's error
shape, never silently ignored; an unknown ``model`` is a 404. Generation is serialised: one worker
thread runs every backend call (and every weight load), so the weights never see two generations
at once; requests wait in its queue, and past ``max_queue`` waiting requests the answer is 503 with
``Retry-After``; a request whose client left while it waited is dropped unserved. A stream is
sent as the tokens are sampled when the backend's ``generate`` takes an ``on_tokens`` hook (the
transformers backend does), else once the generation is done. A stream holds back text that could
be the start of a stop string or of a ``<tool_call>``, so streamed content is always a prefix of
the whole answer and never shows part of a tool call; tool calls come whole, as one
``tool_calls`` delta, when the row ends. Every request is logged on one line (``envace.serve``:
method, path, status, milliseconds).

It exists so that a CPU model can act as a judge, user simulator or external simulator for
another process, and so that the HTTP backend is tested against a real server. For throughput on
GPUs, serve the model with vLLM or SGLang instead: same API.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from envace.core.prompts import template_supports_tools
from envace.core.sampling import Generation, SamplingParams
from envace.core.toolcall import CALL_CLOSE, CALL_OPEN, parse_tool_calls

log = logging.getLogger(__name__)
request_log = logging.getLogger("envace.serve")

MAX_BODY_BYTES = 32 * 1024 * 1024
BODY_TIMEOUT_S = 10.0  # a body shorter than its Content-Length cannot hold a connection longer
DEFAULT_MAX_QUEUE = 256

TOOL_SYSTEM_NOTE = (
    "You can call these tools. To call one, write "
    '<tool_call>{{"name": "tool_name", "arguments": {{...}}}}</tool_call> and stop; the result comes '
    "back in the next message. Without a tool call, your reply goes to the user.\nTools:\n{tools}"
)


class RequestError(ValueError):
    """A client error, answered in OpenAI's error shape (400 unless ``status`` says otherwise)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


# ---------------------------------------------------------------------------- request bodies


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool | None = None


class _Body(BaseModel):
    """Fields both generation endpoints take. ``extra="forbid"``: an unknown field is a 400."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = Field(None, ge=1, le=128)  # OpenAI's limit; more would hold the one worker
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    user: str | None = None  # an end-user id: informational only
    # Accepted only at their neutral value (_NEUTRAL): sampling does not implement them.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None


class CompletionRequest(_Body):
    prompt: Any = None  # checked by OpenAIServer._prompts, which knows the vocabulary
    logprobs: int | None = Field(None, ge=0, le=1)  # only the sampled token's logprob exists
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    return_tokens_as_token_ids: bool | None = None  # vLLM extensions
    include_stop_str_in_output: bool | None = None


class ChatRequest(_Body):
    messages: Any = None  # checked by OpenAIServer.render_chat
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=0)  # no alternatives: only the sampled token
    response_format: dict[str, Any] | None = None


_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},), "echo": (False,),
    "suffix": ("",), "best_of": (1,),
}


def parse_request(kind: type[BaseModel], body: Any) -> Any:
    """``body`` as ``kind``, or a RequestError naming the first bad field."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        req = kind.model_validate(body)
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            raise RequestError(f"unsupported field '{where}': envace serve does not implement it",
                               param=where) from None
        raise RequestError(f"{where}: {e['msg']}", param=where) from None
    for name, neutral in _NEUTRAL.items():
        value = getattr(req, name, None)
        if value is not None and value not in neutral:
            raise RequestError(f"{name}={value!r} is not supported by envace serve (only {neutral[0]!r})",
                               param=name)
    return req


# ---------------------------------------------------------------------------- results


@dataclass
class _Row:
    """One choice: the generation and what the response says about it."""

    gen: Generation
    text: str
    finish: str
    stop_reason: str | None = None
    logprobs: dict[str, Any] | None = None  # completions' logprobs object
    message: dict[str, Any] = field(default_factory=dict)  # chat only
    chat_logprobs: list[dict[str, Any]] | None = None  # chat only


@dataclass
class _Result:
    rows: list[_Row]
    prompt_tokens: int
    include_usage: bool = False

    @property
    def usage(self) -> dict[str, int]:
        done = sum(len(r.gen.token_ids) for r in self.rows)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done}


@dataclass
class _Plan:
    """A request made ready on the worker: what to generate, how a finished row is answered, and
    what a stream of it must hold back."""

    kind: str  # "chat" or "completion"
    prompts: list[list[int]]
    params: SamplingParams
    answer: Callable[[Generation], _Row]
    prompt_tokens: int
    include_usage: bool = False
    prefix: str = ""  # text every row starts with (a tool_choice prefill), part of the answer
    tools: bool = False  # rows may hold tool calls
    logprobs: bool = False  # stream chunks carry logprobs
    token_ids_as_text: bool = False  # completions' return_tokens_as_token_ids


class OpenAIServer:
    """Serve ``backend`` on ``host:port`` (port 0: any free port, bound at once; see :attr:`url`).

    ``api_key``: when set, requests need ``Authorization: Bearer <api_key>``. ``max_queue``: how
    many generation requests may wait or run at once before the next gets 503 + Retry-After.
    Use as a context manager, or ``start()``/``stop()``, or ``serve_forever()`` (blocking).
    """

    def __init__(self, backend: Any, model_name: str = "envace", host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, default_max_tokens: int = 256,
                 allow_weight_updates: bool = False, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.backend = backend
        self.model_name = model_name
        self.api_key = api_key
        self.default_max_tokens = default_max_tokens
        self.allow_weight_updates = allow_weight_updates
        self.max_queue = max_queue
        self.weight_version = 0
        # Streams go out token by token where generate() takes the per-token hook.
        self._hooked = "on_tokens" in _parameters(backend.generate)
        self._generate_lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envace-generate")
        self._pending = 0  # generation requests admitted and not yet answered (event-loop thread only)
        self._seconds = 1.0  # running mean of one generation request, for Retry-After
        # Bound (and listening) now: the port is known before start(), and a client that connects
        # while the server starts waits in the backlog instead of being refused.
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(2048)
        self._address = self._sock.getsockname()[:2]
        self.app = self._app()
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._address[0])

    @property
    def port(self) -> int:
        return int(self._address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    # ------------------------------------------------------------------ lifecycle

    def _make_uvicorn(self) -> uvicorn.Server:
        # Idle connections are kept longer than clients keep theirs (httpx2: 5 s), so a client never
        # reuses one the server has just closed.
        config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off", ws="none",
                                backlog=2048, timeout_graceful_shutdown=3, timeout_keep_alive=30)
        self._uvicorn = uvicorn.Server(config)
        return self._uvicorn

    def start(self) -> "OpenAIServer":
        if self._thread is None:
            server = self._make_uvicorn()
            self._thread = threading.Thread(target=server.run, kwargs={"sockets": [self._sock]},
                                            name=f"envace-serve-{self.port}", daemon=True)
            self._thread.start()
            deadline = time.monotonic() + 30
            while not server.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"envace serve did not start on {self.url}")
                time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until Ctrl-C / SIGTERM."""
        try:
            self._make_uvicorn().run(sockets=[self._sock])
        finally:
            self.close()

    def stop(self) -> None:
        if self._thread is not None and self._uvicorn is not None:
            self._uvicorn.should_exit = True
            self._thread.join(timeout=10)
            self._thread = None
        self.close()

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._sock.close()

    def __enter__(self) -> "OpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_tokens: Callable[[int, list[int], list[float]], None] | None = None) -> list[Generation]:
        with self._generate_lock:
            if on_tokens is None:
                return self.backend.generate(prompts, params)
            if self._hooked:
                return self.backend.generate(prompts, params, on_tokens=on_tokens)
            gens = self.backend.generate(prompts, params)
            for row, gen in enumerate(gens):  # no hook: the whole rows, replayed token by token
                for token, logprob in zip(gen.token_ids, gen.logprobs):
                    on_tokens(row, [token], [logprob])
            return gens

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer

    # ------------------------------------------------------------------ endpoints (sync, on the worker)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "envace"}]}

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """A /v1/completions answer for ``body`` (non-streamed), generated on this thread."""
        return _completion_json(self._run(self._complete(parse_request(CompletionRequest, body))), self.model_name)

    def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """A /v1/chat/completions answer for ``body`` (non-streamed), generated on this thread."""
        return _chat_json(self._run(self._chat(parse_request(ChatRequest, body))), self.model_name)

    def _run(self, plan: _Plan) -> _Result:
        gens = self.generate(plan.prompts, plan.params)
        return _Result([plan.answer(g) for g in gens], plan.prompt_tokens, plan.include_usage)

    def _complete(self, req: CompletionRequest) -> _Plan:
        prompts = self._prompts(req.prompt)
        params = self._sampling(req, req.max_tokens)
        expanded = [p for p in prompts for _ in range(req.n or 1)]
        as_ids = bool(req.return_tokens_as_token_ids)

        def answer(gen: Generation) -> _Row:
            stop_reason = self._stop_reason(gen, params)
            text = gen.text
            if stop_reason is not None and not req.include_stop_str_in_output:
                text = text[: -len(stop_reason)]
            logprobs = None if req.logprobs is None else self._logprobs(gen, as_ids)
            return _Row(gen=gen, text=text, finish=gen.finish, stop_reason=stop_reason, logprobs=logprobs)

        return _Plan("completion", expanded, params, answer, sum(len(p) for p in expanded), _include_usage(req),
                     logprobs=req.logprobs is not None, token_ids_as_text=as_ids)

    def _chat(self, req: ChatRequest) -> _Plan:
        if req.response_format is not None and req.response_format.get("type", "text") != "text":
            raise RequestError(f"response_format type {req.response_format.get('type')!r} is not supported: "
                               "envace serve cannot constrain the output (only 'text')", param="response_format")
        tools = req.tools or None
        for t in tools or []:
            fn = t.get("function")
            if t.get("type", "function") != "function" or not isinstance(fn, dict) \
                    or not isinstance(fn.get("name"), str):
                raise RequestError("tools must be a list of {'type': 'function', 'function': {'name': ..., ...}}",
                                   param="tools")
        prefill = ""  # text the answer is made to start with, so that the model calls a tool
        choice = req.tool_choice
        if choice in (None, "auto"):
            pass
        elif choice == "none":
            tools = None
        elif choice == "required" or isinstance(choice, dict):
            if not tools:
                raise RequestError("tool_choice needs tools", param="tool_choice")
            prefill = f"{CALL_OPEN}\n"
            if isinstance(choice, dict):
                fn = choice.get("function") if choice.get("type") == "function" else None
                name = fn.get("name") if isinstance(fn, dict) else None
                known = [t["function"]["name"] for t in tools]
                if name not in known:
                    raise RequestError(f"tool_choice must name one of the tools {known}, got {choice!r}",
                                       param="tool_choice")
                prefill += '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
        else:
            raise RequestError(f"tool_choice must be 'none', 'auto', 'required' or "
                               f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}",
                               param="tool_choice")
        prompt = self.render_chat(req.messages, tools, prefill)
        max_tokens = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
        params = self._sampling(req, max_tokens)

        def answer(gen: Generation) -> _Row:
            stop_reason = self._stop_reason(gen, params)
            text = prefill + (gen.text[: -len(stop_reason)] if stop_reason else gen.text)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = gen.finish
            if tools:
                parsed = parse_tool_calls(text)
                calls = parsed.calls[:1] if req.parallel_tool_calls is False else parsed.calls
                if calls:
                    message["content"] = parsed.content or None
                    message["tool_calls"] = [
                        {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                         "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                        for c in calls]
                    finish = "tool_calls"
            chat_lp = self._chat_logprobs(gen.token_ids, gen.logprobs) if req.logprobs else None
            return _Row(gen=gen, text=text, finish=finish, stop_reason=stop_reason, message=message,
                        chat_logprobs=chat_lp)

        # n rows of one batch, each seeded by its index
        return _Plan("chat", [prompt] * (req.n or 1), params, answer, len(prompt), _include_usage(req),
                     prefix=prefill, tools=bool(tools), logprobs=bool(req.logprobs))

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/load_weights {"path": FILE}``: load a safetensors file of (some of) the served
        model's weights, under its Hugging Face names, between two generations (what a trainer
        pushes after each update; see ``envace.policy.weight_sync``). Off unless the server was
        started with ``allow_weight_updates``."""
        if not self.allow_weight_updates:
            raise RequestError("weight updates are off: start the server with --allow-weight-updates")
        path = body.get("path")
        if not isinstance(path, str) or not path:
            raise RequestError("path must name a safetensors file", param="path")
        from safetensors.torch import load_file  # torch only here: the server wraps any backend

        try:
            weights = load_file(path)
        except (OSError, ValueError) as err:  # missing file, not safetensors
            raise RequestError(f"{path}: cannot load weights: {err}", param="path") from None
        model = self.backend.model
        own = model.state_dict()
        unknown = sorted(k for k in weights if k not in own)
        if unknown:
            raise RequestError(f"{path}: {len(unknown)} weights the served model does not have, e.g. {unknown[:3]}")
        bad = [k for k, v in weights.items() if tuple(v.shape) != tuple(own[k].shape)]
        if bad:
            raise RequestError(f"{path}: shape mismatch for {bad[:3]}")
        import torch

        with self._generate_lock, torch.no_grad():
            for k, v in weights.items():
                own[k].copy_(v.to(own[k].dtype))
            self.weight_version += 1
        return {"loaded": len(weights), "version": self.weight_version}

    def render_chat(self, messages: Any, tools: list[dict[str, Any]] | None, prefill: str = "") -> list[int]:
        """Token ids of the chat prompt (generation prompt appended, then ``prefill``)."""
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a non-empty list of objects", param="messages")
        tok = self.tokenizer
        chat: list[dict[str, Any]] = []
        for m in messages:
            role = m.get("role")
            if role not in ("system", "developer", "user", "assistant", "tool"):
                raise RequestError(f"unknown message role {role!r}", param="messages")
            content = _content_text(m.get("content"))
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise RequestError("tool_calls must be a list", param="messages")
            for tc in calls:  # an assistant's earlier calls, in the model's own format
                fn = tc.get("function") if isinstance(tc, dict) else None
                fn = fn if isinstance(fn, dict) else {}
                args = fn.get("arguments")
                try:
                    args = json.loads(args) if isinstance(args, str) and args.strip() else (args or {})
                except json.JSONDecodeError:
                    raise RequestError(f"tool_calls arguments are not JSON: {args[:80]!r}", param="messages") from None
                call = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
                content += ("\n" if content else "") + f"{CALL_OPEN}\n{call}\n{CALL_CLOSE}"
            chat.append({"role": "system" if role == "developer" else role, "content": content})
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools and template_supports_tools(tok):
            kwargs["tools"] = tools
        elif tools:
            note = TOOL_SYSTEM_NOTE.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
            if chat and chat[0]["role"] == "system":
                chat[0] = {"role": "system", "content": chat[0]["content"] + "\n\n" + note}
            else:
                chat.insert(0, {"role": "system", "content": note})
        text = tok.apply_chat_template(chat, **kwargs) + prefill
        return list(tok(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ request parsing

    def _prompts(self, prompt: Any) -> list[list[int]]:
        tok = self.tokenizer

        def one(p: Any) -> list[int]:
            if isinstance(p, str):
                ids = list(tok(p, add_special_tokens=False)["input_ids"])
            elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                ids = list(p)
                vocab = len(tok)
                bad = [t for t in ids if t < 0 or t >= vocab]
                if bad:
                    raise RequestError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}", param="prompt")
            else:
                raise RequestError("prompt must be a string, a list of token ids, or a list of either",
                                   param="prompt")
            if not ids:
                raise RequestError("prompt is empty", param="prompt")
            return ids

        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            return [one(prompt)]
        if isinstance(prompt, list) and prompt:
            return [one(p) for p in prompt]
        raise RequestError("prompt is required", param="prompt")

    def _sampling(self, req: _Body, max_tokens: int | None) -> SamplingParams:
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        try:
            return SamplingParams(
                max_new_tokens=self.default_max_tokens if max_tokens is None else max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                stop=[s for s in stops if s],
                seed=req.seed,
            )
        except ValueError as err:
            raise RequestError(f"max_tokens / temperature / top_p: {err}") from None

    @staticmethod
    def _stop_reason(gen: Generation, params: SamplingParams) -> str | None:
        """vLLM's ``stop_reason``: the stop string that ended the row, else None (EOS / length)."""
        if gen.finish != "stop":
            return None
        return next((s for s in params.stop if gen.text.endswith(s)), None)

    def _decode(self, token_ids: list[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False)

    def _logprobs(self, gen: Generation, as_ids: bool) -> dict[str, Any]:
        return self._completion_logprobs(gen.token_ids, gen.logprobs, as_ids, 0)[0]

    def _completion_logprobs(self, token_ids: list[int], logprobs: list[float], as_ids: bool,
                             offset: int) -> tuple[dict[str, Any], int]:
        """Completions' logprobs object for these tokens, their text offsets counted from ``offset``;
        and the offset after them."""
        tokens = [f"token_id:{t}" if as_ids else self._decode([t]) for t in token_ids]
        offsets = []
        for t in token_ids:
            offsets.append(offset)
            offset += len(self._decode([t], skip_special=True))
        return {"tokens": tokens, "token_logprobs": list(logprobs),
                "top_logprobs": [{tk: lp} for tk, lp in zip(tokens, logprobs)], "text_offset": offsets}, offset

    def _chat_logprobs(self, token_ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        texts = [self._decode([t]) for t in token_ids]
        return [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                for t, lp in zip(texts, logprobs)]

    # ------------------------------------------------------------------ streams (on the worker)

    def _stream(self, plan: _Plan, emit: Callable[[dict[str, Any]], None], gone: threading.Event) -> None:
        """Generate ``plan``, handing each SSE event to ``emit`` as soon as it is known: per choice the
        role (chat), then the text as it is sampled, then what was held back, tool calls whole, the
        finish reason; usage last. Stops generating once ``gone`` is set (the client left)."""
        chat = plan.kind == "chat"
        head = _head("chat.completion.chunk" if chat else "text_completion", self.model_name)
        holds = list(plan.params.stop)
        if plan.tools:
            holds += ["<tool_call", CALL_CLOSE]  # parse_tool_calls reads a turn with either as a call attempt
        eos = getattr(self.backend, "eos_ids", None)
        eos = frozenset(eos) if eos is not None else frozenset({self.tokenizer.eos_token_id})
        rows = [_RowStream(plan.prefix, holds, eos, strip=plan.tools) for _ in plan.prompts]
        offsets = [0] * len(rows)  # completions' text_offset, per row

        def event(i: int, piece: str | None, lp_from: int, lp_to: int, finish: str | None = None,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
            r = rows[i]
            lp = None
            if plan.logprobs and lp_to > lp_from:
                if chat:
                    lp = {"content": self._chat_logprobs(r.token_ids[lp_from:lp_to], r.logprobs[lp_from:lp_to])}
                else:
                    lp, offsets[i] = self._completion_logprobs(r.token_ids[lp_from:lp_to], r.logprobs[lp_from:lp_to],
                                                               plan.token_ids_as_text, offsets[i])
            if chat:
                delta = dict(extra or {})
                if piece is not None:
                    delta["content"] = piece
                choice = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": lp}
            else:
                choice = {"index": i, "text": piece or "", "logprobs": lp, "finish_reason": finish, **(extra or {})}
            return {**head, "choices": [choice]}

        if chat:
            for i in range(len(rows)):
                emit(event(i, "", 0, 0, extra={"role": "assistant"}))

        def on_tokens(i: int, token_ids: list[int], logprobs: list[float]) -> None:
            if gone.is_set():
                raise _ClientGone
            r = rows[i]
            piece = r.add(token_ids, logprobs, self._decode)
            if piece:
                emit(event(i, piece, r.logprobs_sent, len(r.token_ids)))
                r.logprobs_sent = len(r.token_ids)

        gens = self.generate(plan.prompts, plan.params, on_tokens=on_tokens)
        answers = [plan.answer(g) for g in gens]
        for i, (r, a) in enumerate(zip(rows, answers)):
            calls = a.message.get("tool_calls") if chat else None
            final = (a.message.get("content") or "") if chat else a.text
            rest = r.rest_of(final)
            left = r.logprobs_sent, len(r.token_ids)
            if rest or (left[1] > left[0] and not calls):
                emit(event(i, rest, *left))
                left = (left[1], left[1])
            if calls:
                emit(event(i, None, *left, extra={"tool_calls": [{"index": j, **c} for j, c in enumerate(calls)]}))
            emit(event(i, None if chat else "", 0, 0, finish=a.finish,
                       extra=None if chat else {"stop_reason": a.stop_reason}))
        if plan.include_usage:
            emit({**head, "choices": [], "usage": _Result(answers, plan.prompt_tokens).usage})

    # ------------------------------------------------------------------ HTTP

    def _app(self) -> Starlette:
        async def health(request: Request) -> Response:
            return JSONResponse({"status": "ok"})

        async def models(request: Request) -> Response:
            return self._refuse_key(request) or JSONResponse(self.models())

        async def model(request: Request) -> Response:
            if refused := self._refuse_key(request):
                return refused
            name = request.path_params["name"]
            if name != self.model_name:
                return _error(404, f"the model '{name}' does not exist: this server serves '{self.model_name}'",
                              param="model", code="model_not_found")
            return JSONResponse(self.models()["data"][0])

        async def not_found(request: Request, exc: Exception) -> Response:
            status = getattr(exc, "status_code", 404)
            if status == 405:
                return _error(405, f"{request.method} is not allowed on {request.url.path}")
            return _error(status, f"no route {request.method} {request.url.path}", "not_found_error")

        routes = [Route("/health", health), Route("/v1/health", health), Route("/v1/models", models),
                  Route("/v1/models/{name:path}", model),
                  Route("/v1/completions", self._endpoint(CompletionRequest, self._complete, _completion_json),
                        methods=["POST"]),
                  Route("/v1/chat/completions", self._endpoint(ChatRequest, self._chat, _chat_json), methods=["POST"]),
                  Route("/v1/load_weights", self._load_weights_route, methods=["POST"])]
        return _RequestLog(Starlette(routes=routes, exception_handlers={HTTPException: not_found}))

    def _refuse_key(self, request: Request) -> Response | None:
        if not self.api_key or request.headers.get("authorization", "") == f"Bearer {self.api_key}":
            return None
        return _error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error",
                      code="invalid_api_key", close=True)

    async def _json_body(self, request: Request) -> dict[str, Any] | Response:
        """The body as a dict, or the error response. The key and the declared length are checked
        before anything is read, so a client cannot hold the server by declaring a body it never sends."""
        if refused := self._refuse_key(request):
            return refused
        declared = request.headers.get("content-length")
        if declared is None:
            return _error(411, "a Content-Length header is required", close=True)
        if not declared.strip().isdigit():
            return _error(400, "a valid Content-Length header is required", close=True)
        if int(declared) > MAX_BODY_BYTES:
            return _error(413, f"request body over {MAX_BODY_BYTES} bytes", close=True)
        try:
            raw = await asyncio.wait_for(request.body(), BODY_TIMEOUT_S)
        except (TimeoutError, ClientDisconnect):
            return _error(408, "the request body did not arrive in full", close=True)
        try:
            body = json.loads(raw.decode("utf-8") or "{}")
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return _error(400, f"the request body is not valid JSON: {err}")
        return body if isinstance(body, dict) else _error(400, "the request body must be a JSON object")

    def _endpoint(self, kind: type[BaseModel], plan: Callable[[Any], _Plan],
                  as_json: Callable[[_Result, str], dict[str, Any]]) -> Callable[..., Any]:
        async def endpoint(request: Request) -> Response:
            body = await self._json_body(request)
            if isinstance(body, Response):
                return body
            try:
                req = parse_request(kind, body)
                if req.model is not None and req.model != self.model_name:
                    raise RequestError(f"the model '{req.model}' does not exist: this server serves "
                                       f"'{self.model_name}'", param="model", status=404, code="model_not_found")
                if self._pending >= self.max_queue:
                    wait = max(1, math.ceil(self._seconds * self._pending))
                    return _error(503, f"the server is busy ({self._pending} requests queued); retry after "
                                       f"{wait} s", "server_busy", headers={"Retry-After": str(wait)})
                if req.stream:
                    return await self._stream_response(request, req, plan)
                # The answer is built on the worker too: it decodes tokens, and the tokenizer stays on one thread.
                return JSONResponse(await self._on_worker(lambda r: as_json(self._run(plan(r)), self.model_name),
                                                          req, request))
            except Exception as err:  # noqa: BLE001 - every failure gets an answer
                return _failure(request, err)

        return endpoint

    async def _stream_response(self, request: Request, req: Any, plan_of: Callable[[Any], _Plan]) -> Response:
        """An SSE response whose events the worker hands over (through a queue) as it makes them.
        The request is prepared (checked, templated) before the response starts, so that a bad one
        still gets a JSON error; a failure after that ends the stream with an error event."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        gone = threading.Event()

        def emit(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def job(r: Any) -> None:
            plan = plan_of(r)
            emit(_STARTED)
            try:
                self._stream(plan, emit, gone)
            except _ClientGone:
                pass
            except Exception as err:  # noqa: BLE001 - the stream has started: the error goes into it
                log.exception("%s failed while streaming", request.url.path, exc_info=err)
                emit({"error": {"message": f"{type(err).__name__}: {err}", "type": "server_error", "param": None,
                                "code": None}})
            finally:
                emit(_END)

        task = asyncio.ensure_future(self._on_worker(job, req, request, gone))
        first = asyncio.ensure_future(queue.get())
        await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        if not first.done() and task.done() and task.exception() is not None:
            first.cancel()  # refused before the stream started
            return _failure(request, task.exception())  # type: ignore[arg-type]
        await first  # _STARTED
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # errors went into the stream

        async def sse() -> AsyncIterator[str]:
            try:
                while (item := await queue.get()) is not _END:
                    yield f"data: {json.dumps(item, ensure_ascii=False)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                gone.set()  # a client that left mid-stream: its generation stops at the next token

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _load_weights_route(self, request: Request) -> Response:
        body = await self._json_body(request)
        if isinstance(body, Response):
            return body
        try:
            return JSONResponse(await self._on_worker(self.load_weights, body))
        except Exception as err:  # noqa: BLE001 - every failure gets an answer
            return _failure(request, err)

    async def _on_worker(self, fn: Callable[[Any], Any], arg: Any, request: Request | None = None,
                         gone: threading.Event | None = None) -> Any:
        """Run ``fn(arg)`` on the one generation thread (FIFO). With ``request`` (a generation): it
        counts in the queue, is skipped if its client leaves while it waits, and ``gone`` (made here
        unless given) is set when the client leaves."""
        gone = gone if gone is not None else threading.Event()

        def timed(arg: Any) -> Any:
            if gone.is_set():
                raise _ClientGone
            started = time.monotonic()
            try:
                return fn(arg)
            finally:
                self._seconds = 0.8 * self._seconds + 0.2 * (time.monotonic() - started)

        async def watch(request: Request) -> None:  # the body is read: the next message is the disconnect
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch(request)) if request is not None else None
        self._pending += request is not None
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, timed, arg)
        finally:
            self._pending -= request is not None
            if watcher is not None:
                watcher.cancel()


class _ClientGone(Exception):
    """The client left before its generation started (or, streaming, before it ended)."""


_STARTED, _END = object(), object()  # a stream's first and last queue items


class _RowStream:
    """One streamed row: its tokens so far and how much of its text has been sent.

    What is sent is always a prefix of the row's final answer: text that could still turn into a
    stop string (cut from the answer) or a tool call (sent whole when the row ends) is held back,
    and so is an incomplete UTF-8 character (U+FFFD until its last byte arrives). Once a stop
    string or a tool-call tag appears, the rest of the row waits for the end. ``strip``: trailing
    whitespace waits too (the content around a tool call is stripped).
    """

    def __init__(self, prefix: str, holds: Sequence[str], skip: frozenset[int], strip: bool) -> None:
        self.prefix, self.holds, self.skip, self.strip = prefix, [h for h in holds if h], skip, strip
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.logprobs_sent = 0  # how many tokens' logprobs went out with sent text
        self.sent = ""
        self.closed = False

    def add(self, token_ids: list[int], logprobs: list[float], decode: Callable[[list[int]], str]) -> str:
        """Take the row's new tokens; return the text that may be sent now (maybe empty)."""
        self.token_ids += token_ids
        self.logprobs += logprobs
        if self.closed:
            return ""
        text = self.prefix + decode([t for t in self.token_ids if t not in self.skip])
        end = len(text.rstrip("\ufffd"))
        found = [i for h in self.holds if (i := text.find(h)) >= 0]
        if found:
            self.closed = True
            end = min(end, *found)
        safe = text[:end]
        safe = safe[: len(safe) - _held_back(safe, self.holds)]
        if self.strip:
            safe = safe.rstrip()
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent):], safe
        return piece

    def rest_of(self, final: str) -> str:
        """What of the row's final answer was not sent yet."""
        for sent in (self.sent, self.sent.lstrip()):  # a tool-call turn's content is stripped
            if final.startswith(sent):
                return final[len(sent):]
        return ""


def _held_back(text: str, holds: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that is the start of one of ``holds``."""
    best = 0
    for h in holds:
        for k in range(min(len(h) - 1, len(text)), best, -1):
            if text.endswith(h[:k]):
                best = k
                break
    return best


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return set()


def _failure(request: Request, err: Exception) -> Response:
    if isinstance(err, RequestError):
        return _error(err.status, str(err), param=err.param, code=err.code)
    if isinstance(err, _ClientGone):
        return _error(499, "the client closed the request before it was served")  # nginx's code; nobody reads it
    log.exception("%s failed", request.url.path, exc_info=err)
    return _error(500, f"{type(err).__name__}: {err}", "server_error")


# ---------------------------------------------------------------------------- response shapes


def _head(kind: str, model: str) -> dict[str, Any]:
    prefix = "cmpl" if kind == "text_completion" else "chatcmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()), "model": model}


def _completion_json(result: _Result, model: str) -> dict[str, Any]:
    choices = [{"index": i, "text": r.text, "finish_reason": r.finish, "stop_reason": r.stop_reason,
                "logprobs": r.logprobs} for i, r in enumerate(result.rows)]
    return {**_head("text_completion", model), "choices": choices, "usage": result.usage}


def _chat_json(result: _Result, model: str) -> dict[str, Any]:
    choices = [{"index": i, "message": r.message, "finish_reason": r.finish,
                "logprobs": None if r.chat_logprobs is None else {"content": r.chat_logprobs}}
               for i, r in enumerate(result.rows)]
    return {**_head("chat.completion", model), "choices": choices, "usage": result.usage}


def _include_usage(req: _Body) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None, close: bool = False, headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error shape. ``close``: the body was not read, so the connection cannot be reused."""
    headers = dict(headers or {})
    if close:
        headers["Connection"] = "close"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise RequestError("message content must be a string, a list of parts, or null", param="messages")


class _RequestLog:
    """ASGI middleware: one log line per request (method, path, status, milliseconds to the last byte)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), 500

        async def send_logged(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            request_log.info("%s %s %d %.1f ms", scope["method"], scope["path"], status,
                             (time.perf_counter() - started) * 1000)


def serve(spec: str, host: str = "127.0.0.1", port: int = 8000, name: str | None = None, device: str = "cpu",
          max_batch: int = 8, api_key: str | None = None, allow_weight_updates: bool = False,
          max_queue: int = DEFAULT_MAX_QUEUE) -> OpenAIServer:
    """Load ``spec`` (any :func:`envace.policy.loading.load_model` spec) into a TransformersBackend
    and return an (unstarted) server for it."""
    from envace.policy.transformers_backend import TransformersBackend  # torch: only for a served model

    backend = TransformersBackend.from_spec(spec, device=device, max_batch=max_batch)
    return OpenAIServer(backend, model_name=name or spec, host=host, port=port, api_key=api_key,
                        allow_weight_updates=allow_weight_updates, max_queue=max_queue)

