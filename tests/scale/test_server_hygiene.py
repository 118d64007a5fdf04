"""envace serve and the HTTP client against misbehaving peers: raw sockets, no client library."""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest

from envace.policy.http_backend import HTTPBackend, ServerTimeoutError
from envace.policy.http_server import OpenAIServer


def _raw(url: str, request: bytes, wait: float = 5.0) -> bytes:
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=wait) as s:
        s.sendall(request)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


def _post(headers: str, body: bytes = b"") -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{headers}\r\n").encode() + body


@pytest.mark.parametrize("headers,status", [
    ("Content-Length: abc\r\n", b"400"),
    ("Content-Length: -5\r\n", b"400"),
    ("", b"411"),
    ("Content-Length: 999999999999\r\n", b"413"),
])
def test_bad_content_length_is_refused_at_once(tiny_backend, headers, status):
    with OpenAIServer(tiny_backend, model_name="tiny") as server:
        t0 = time.perf_counter()
        reply = _raw(server.url, _post(headers))
        assert reply.split(b" ")[1] == status and time.perf_counter() - t0 < 3


def test_the_key_is_checked_before_the_body_is_read(tiny_backend):
    with OpenAIServer(tiny_backend, model_name="tiny", api_key="k") as server:
        t0 = time.perf_counter()
        # Declares a body it never sends: a server reading first would wait for it.
        reply = _raw(server.url, _post("Content-Length: 100000\r\n"), wait=10)
        assert reply.split(b" ")[1] == b"401" and time.perf_counter() - t0 < 3


def test_a_body_shorter_than_declared_cannot_hold_the_server(tiny_backend, monkeypatch):
    import envace.policy.http_server as http_server

    monkeypatch.setattr(http_server, "BODY_TIMEOUT_S", 0.5)
    with OpenAIServer(tiny_backend, model_name="tiny") as server:
        t0 = time.perf_counter()
        reply = _raw(server.url, _post("Content-Length: 100\r\n", b'{"prompt": '), wait=10)
        assert reply.split(b" ")[1] == b"408" and time.perf_counter() - t0 < 3
        # ...and it still answers everyone else.
        ok = _raw(server.url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert ok.split(b" ")[1] == b"200"


def test_a_trickling_server_cannot_hold_a_request_past_the_timeout():
    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):  # one byte every 0.2 s: each read is quick, the whole is 200 s
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.2)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = HTTPBackend(f"http://127.0.0.1:{srv.server_address[1]}/v1", model="m", timeout=1.5, max_retries=0)
        t0 = time.perf_counter()
        with pytest.raises(ServerTimeoutError):
            client._request("POST", "/completions", {})
        assert time.perf_counter() - t0 < 5
    finally:
        srv.shutdown()
