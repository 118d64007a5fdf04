"""A small OpenAI-compatible server around any GenerationBackend (``envace serve``).

Serves ``GET /v1/models``, ``GET /health``, ``POST /v1/completions`` (text or token-id prompts,
per-token logprobs, vLLM's ``return_tokens_as_token_ids`` / ``include_stop_str_in_output`` /
``stop_reason``) and ``POST /v1/chat/completions`` (the tokenizer's chat template; ``tools``
rendered natively when the template takes them, else as a Hermes-style system note, and
``<tool_call>`` output returned as OpenAI ``tool_calls``).

It exists so that a CPU model can act as a judge, user simulator or external simulator for
another process, and so that the HTTP backend is tested against a real server. It is the
standard library's ThreadingHTTPServer: requests are served concurrently, generation is
serialised (one backend call at a time; a request with a list of prompts is one batched call).
For throughput on GPUs, serve the model with vLLM or SGLang instead: same API.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from envace.core.sampling import Generation, SamplingParams

log = logging.getLogger(__name__)

TOOL_SYSTEM_NOTE = (
    "You can call these tools. To call one, write "
    '<tool_call>{{"name": "tool_name", "arguments": {{...}}}}</tool_call> and stop; the result comes '
    "back in the next message. Without a tool call, your reply goes to the user.\nTools:\n{tools}"
)


class RequestError(ValueError):
    """A client error: answered with HTTP 400 and the message."""


class OpenAIServer:
    """Serve ``backend`` on ``host:port`` (port 0: any free port; see :attr:`url`).

    ``api_key``: when set, requests need ``Authorization: Bearer <api_key>``.
    Use as a context manager, or ``start()``/``stop()``, or ``serve_forever()`` (blocking).
    """

    def __init__(self, backend: Any, model_name: str = "envace", host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, default_max_tokens: int = 256,
                 allow_weight_updates: bool = False) -> None:
        self.backend = backend
        self.allow_weight_updates = allow_weight_updates
        self.weight_version = 0
        self.model_name = model_name
        self.api_key = api_key
        self.default_max_tokens = default_max_tokens
        self._generate_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.httpd = _Server((host, port), _make_handler(self))

    @property
    def host(self) -> str:
        return str(self.httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "OpenAIServer":
        if self._thread is None:
            self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                            name=f"envace-serve-{self.port}", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        try:
            self.httpd.serve_forever(poll_interval=0.2)
        finally:
            self.httpd.server_close()

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> "OpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        with self._generate_lock:
            return self.backend.generate(prompts, params)

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer

    # ------------------------------------------------------------------ endpoints

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "envace"}]}

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            raise RequestError("stream=true is not supported by envace serve")
        if body.get("echo"):
            raise RequestError("echo=true is not supported by envace serve")
        prompts = self._prompts(body.get("prompt"))
        n = _int(body, "n", 1, lo=1)
        params = self._sampling(body)
        logprobs = body.get("logprobs")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
            raise RequestError("logprobs must be a non-negative integer or null")
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        keep_stop = bool(body.get("include_stop_str_in_output"))
        expanded = [p for p in prompts for _ in range(n)]
        gens = self.generate(expanded, params)
        choices = []
        for index, (prompt, gen) in enumerate(zip(expanded, gens)):
            stop_reason = self._stop_reason(gen, params)
            text = gen.text
            if isinstance(stop_reason, str) and not keep_stop and text.endswith(stop_reason):
                text = text[: -len(stop_reason)]
            choice: dict[str, Any] = {"index": index, "text": text, "finish_reason": gen.finish,
                                      "stop_reason": stop_reason, "logprobs": None}
            if logprobs is not None:
                choice["logprobs"] = self._logprobs(gen, as_ids)
            choices.append(choice)
        completion_tokens = sum(len(g.token_ids) for g in gens)
        prompt_tokens = sum(len(p) for p in expanded)
        return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        from envace.core.toolcall import parse_tool_calls

        if body.get("stream"):
            raise RequestError("stream=true is not supported by envace serve")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a non-empty list of objects")
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise RequestError("tools must be a list")
        if body.get("tool_choice") == "none":
            tools = None
        if "max_completion_tokens" in body and "max_tokens" not in body:
            body = {**body, "max_tokens": body["max_completion_tokens"]}
        prompt = self.render_chat(messages, tools)
        params = self._sampling(body)
        n = _int(body, "n", 1, lo=1)
        gens = self.generate([prompt] * n, params)  # n rows of one batch, each seeded by its index
        choices = []
        for index, gen in enumerate(gens):
            message: dict[str, Any] = {"role": "assistant", "content": gen.text}
            finish = gen.finish
            if tools:
                parsed = parse_tool_calls(gen.text)
                if parsed.calls:
                    message["content"] = parsed.content or None
                    message["tool_calls"] = [
                        {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                         "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                        for c in parsed.calls]
                    finish = "tool_calls"
            choices.append({"index": index, "message": message, "finish_reason": finish, "logprobs": None})
        completion = sum(len(g.token_ids) for g in gens)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                          "total_tokens": len(prompt) + completion}}

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/load_weights {"path": FILE}``: load a safetensors file of (some of) the served
        model's weights, under its Hugging Face names, between two generations (what a trainer
        pushes after each update; see ``envace.policy.weight_sync``). Off unless the server was
        started with ``allow_weight_updates``."""
        if not self.allow_weight_updates:
            raise RequestError("weight updates are off: start the server with --allow-weight-updates")
        path = body.get("path")
        if not isinstance(path, str) or not path:
            raise RequestError("path must name a safetensors file")
        from safetensors.torch import load_file

        try:
            weights = load_file(path)
        except (OSError, ValueError) as err:  # missing file, not safetensors
            raise RequestError(f"{path}: cannot load weights: {err}") from None
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

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of the chat prompt (generation prompt appended)."""
        from envace.core.prompts import template_supports_tools
        from envace.core.toolcall import CALL_CLOSE, CALL_OPEN

        tok = self.tokenizer
        chat: list[dict[str, Any]] = []
        for m in messages:
            role = m.get("role")
            if role not in ("system", "user", "assistant", "tool"):
                raise RequestError(f"unknown message role {role!r}")
            content = _content_text(m.get("content"))
            for tc in m.get("tool_calls") or []:  # an assistant's earlier calls, in the model's own format
                fn = tc.get("function") or {}
                args = fn.get("arguments")
                args = json.loads(args) if isinstance(args, str) and args.strip() else (args or {})
                call = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
                content += ("\n" if content else "") + f"{CALL_OPEN}\n{call}\n{CALL_CLOSE}"
            chat.append({"role": role, "content": content})
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools and template_supports_tools(tok):
            kwargs["tools"] = tools
        elif tools:
            note = TOOL_SYSTEM_NOTE.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
            if chat and chat[0]["role"] == "system":
                chat[0] = {"role": "system", "content": chat[0]["content"] + "\n\n" + note}
            else:
                chat.insert(0, {"role": "system", "content": note})
        text = tok.apply_chat_template(chat, **kwargs)
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
                    raise RequestError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
            else:
                raise RequestError("prompt must be a string, a list of token ids, or a list of either")
            if not ids:
                raise RequestError("prompt is empty")
            return ids

        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
            return [one(prompt)]
        if isinstance(prompt, list) and prompt:
            return [one(p) for p in prompt]
        raise RequestError("prompt is required")

    def _sampling(self, body: dict[str, Any]) -> SamplingParams:
        stop = body.get("stop")
        if stop is None:
            stops: list[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stops = list(stop)
        else:
            raise RequestError("stop must be a string or a list of strings")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise RequestError("seed must be an integer")
        max_tokens = body.get("max_tokens")
        try:
            return SamplingParams(
                max_new_tokens=self.default_max_tokens if max_tokens is None else int(max_tokens),
                temperature=float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0),
                top_p=float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0),
                stop=[s for s in stops if s],
                seed=seed,
            )
        except (TypeError, ValueError) as err:
            raise RequestError(str(err)) from None

    def _stop_reason(self, gen: Generation, params: SamplingParams) -> str | int | None:
        """vLLM's ``stop_reason``: the stop string that ended the row, else None (EOS / length)."""
        if gen.finish != "stop":
            return None
        for s in params.stop:
            if gen.text.endswith(s):
                return s
        return None

    def _logprobs(self, gen: Generation, as_ids: bool) -> dict[str, Any]:
        tok = self.tokenizer
        if as_ids:
            tokens = [f"token_id:{t}" for t in gen.token_ids]
        else:
            tokens = [tok.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                      for t in gen.token_ids]
        offsets, pos = [], 0
        for t in gen.token_ids:
            offsets.append(pos)
            pos += len(tok.decode([t], skip_special_tokens=True, clean_up_tokenization_spaces=False))
        return {"tokens": tokens, "token_logprobs": list(gen.logprobs),
                "top_logprobs": [{tk: lp} for tk, lp in zip(tokens, gen.logprobs)], "text_offset": offsets}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout, Ctrl-C) leaves a broken pipe behind: log, don't print.
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise RequestError("message content must be a string, a list of parts, or null")


def _int(body: dict[str, Any], key: str, default: int, lo: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise RequestError(f"{key} must be an integer >= {lo}")
    return value


def _make_handler(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    routes_post = {"/v1/completions": server.completions, "/v1/chat/completions": server.chat_completions,
                   "/v1/load_weights": server.load_weights}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "envace-serve"

        def log_message(self, fmt: str, *args: Any) -> None:  # route through logging, not stderr
            log.debug("%s %s", self.address_string(), fmt % args)

        def _send(self, status: int, obj: dict[str, Any]) -> None:
            data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def _authorised(self) -> bool:
            if not server.api_key:
                return True
            if self.headers.get("Authorization", "") == f"Bearer {server.api_key}":
                return True
            self._error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error")
            return False

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0].rstrip("/")
            if path in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            elif not self._authorised():
                return
            elif path == "/v1/models":
                self._send(200, server.models())
            else:
                self._error(404, f"no route GET {path}", "not_found_error")

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0].rstrip("/")
            # The key first: an unauthorised client gets nothing read, not even its body.
            if not self._authorised():
                self.close_connection = True
                return
            declared = self.headers.get("Content-Length")
            if declared is None or not declared.strip().isdigit():
                self._error(411 if declared is None else 400, "a valid Content-Length header is required",
                            "invalid_request_error")
                self.close_connection = True
                return
            length = int(declared)
            if length > MAX_BODY_BYTES:
                self._error(413, f"request body over {MAX_BODY_BYTES} bytes", "invalid_request_error")
                self.close_connection = True
                return
            self.connection.settimeout(BODY_TIMEOUT_S)  # a body shorter than declared cannot hang us
            try:
                raw = self.rfile.read(length) if length else b""
            except (TimeoutError, OSError):
                self.close_connection = True
                return
            if len(raw) < length:
                self._error(400, "the request body is shorter than its Content-Length", "invalid_request_error")
                self.close_connection = True
                return
            route = routes_post.get(path)
            if route is None:
                self._error(404, f"no route POST {path}", "not_found_error")
                return
            try:
                body = json.loads(raw.decode("utf-8") or "{}")
                if not isinstance(body, dict):
                    raise RequestError("the request body must be a JSON object")
                self._send(200, route(body))
            except (RequestError, json.JSONDecodeError, UnicodeDecodeError) as err:
                self._error(400, str(err), "invalid_request_error")
            except Exception as err:  # noqa: BLE001 - a server error must reach the client as a 500
                log.exception("request to %s failed", path)
                self._error(500, f"{type(err).__name__}: {err}", "server_error")

    return Handler


MAX_BODY_BYTES = 32 * 1024 * 1024
BODY_TIMEOUT_S = 10.0


def serve(spec: str, host: str = "127.0.0.1", port: int = 8000, name: str | None = None, device: str = "cpu",
          max_batch: int = 8, api_key: str | None = None, allow_weight_updates: bool = False) -> OpenAIServer:
    """Load ``spec`` (any :func:`envace.policy.loading.load_model` spec) into a TransformersBackend
    and return an (unstarted) server for it."""
    from envace.policy.transformers_backend import TransformersBackend

    backend = TransformersBackend.from_spec(spec, device=device, max_batch=max_batch)
    return OpenAIServer(backend, model_name=name or spec, host=host, port=port, api_key=api_key,
                        allow_weight_updates=allow_weight_updates)
