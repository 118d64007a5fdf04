"""Fixtures for the scale tests: loopback HTTP servers that stop themselves."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from envace.policy.http_server import OpenAIServer


@pytest.fixture(scope="module")
def tiny_server(tiny_backend) -> Iterator[OpenAIServer]:
    """``envace serve`` around the session's tiny model, on 127.0.0.1 and a free port."""
    with OpenAIServer(tiny_backend, model_name="tiny") as server:
        yield server


Reply = tuple[int, dict[str, Any], dict[str, str]]  # status, JSON body, extra headers


@contextmanager
def scripted_server(respond: Callable[[str, dict[str, Any]], Reply]) -> Iterator[Any]:
    """A loopback server whose every POST/GET is answered by ``respond(path, body)``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            status, obj, headers = respond(self.path, body | {"_auth": self.headers.get("Authorization")})
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

    class Quiet(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that timed out and left: expected in these tests

    httpd = Quiet(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def url_of(httpd: Any) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/v1"


def completion(ids: list[int], logprobs: list[float] | None = None, finish: str = "length") -> dict[str, Any]:
    """A vLLM-style /v1/completions answer for one prompt."""
    lp = logprobs if logprobs is not None else [-0.5] * len(ids)
    return {"object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "", "finish_reason": finish, "stop_reason": None,
                         "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": lp}}]}
