"""A GenerationBackend over any OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp, a hosted
API, or ``envace serve``), plus chat completions with tools for judges and user simulators.

Two entry points:

* :meth:`HTTPBackend.generate` is the :class:`~envace.policy.backend.GenerationBackend` protocol
  over ``/v1/completions``. Prompts go as token-id lists (vLLM, SGLang, llama.cpp and the OpenAI
  API accept a list of ints as ``prompt``), so the server sees exactly the ids the rollout
  rendered. Each returned :class:`Generation` follows the in-process backend's conventions: token
  ids end with the EOS token when the model stopped by itself, the text keeps a stop string
  that ended the row, and logprobs are the server's per-token ones. Token ids come from the server
  when it can send them (vLLM's ``return_tokens_as_token_ids``); otherwise they are recovered by
  re-tokenising the text, and a logprob that cannot be aligned is NaN (a frozen judge or
  simulator does not need them; a trained policy must use a server that sends ids).
* :meth:`HTTPBackend.chat` is ``/v1/chat/completions`` with optional tools: for an LLM judge, a
  user simulator or an external tool simulator that needs no token-level view.

Networking is httpx2 (one pooled client per backend): a per-request timeout that also bounds a
server trickling its answer; retries with exponential backoff and jitter on connection errors,
timeouts, 429 and 5xx (never on other 4xx), honouring ``Retry-After``; a concurrency limit shared by
every call of one backend (a batch fans out over a thread pool); an API key from an environment
variable; and errors that name the URL.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from envace.core.sampling import FinishReason, Generation, SamplingParams
from envace.core.toolcall import parse_tool_calls

log = logging.getLogger(__name__)

DEFAULT_API_KEY_ENV = "ENVACE_API_KEY"
TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token under return_tokens_as_token_ids

# Same stream-splitting rule as the transformers backend (one stream per prompt index), kept
# here so this module does not import torch.
_SEED_STRIDE = 0x9E3779B97F4A7C15


def row_seed(seed: int, index: int) -> int:
    return (seed * _SEED_STRIDE + index) % (1 << 63)


class HTTPBackendError(RuntimeError):
    """A request failed for good. ``url`` is the endpoint, ``status`` the HTTP status (None when
    no response came), ``body`` the start of the server's answer."""

    def __init__(self, message: str, url: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.body = body


class ServerUnavailableError(HTTPBackendError, ConnectionError):
    """No connection could be made (or kept) to the server, after every retry."""


class ServerTimeoutError(HTTPBackendError, TimeoutError):
    """The server did not answer within the timeout, after every retry."""


@dataclass
class ChatToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str = ""  # the JSON text as sent; ``arguments`` is {} when it did not parse
    arguments_ok: bool = True


@dataclass
class ChatResult:
    content: str | None
    tool_calls: list[ChatToolCall] = field(default_factory=list)
    finish: str = "stop"  # the server's finish_reason: stop | length | tool_calls | ...
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.content or ""


def normalise_base_url(url: str) -> str:
    """``http://host:8000`` -> ``http://host:8000/v1``; a URL with a path is kept as given."""
    url = url.strip().rstrip("/")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"base_url must be an http(s) URL like http://127.0.0.1:8000/v1, got {url!r}")
    if parsed.path in ("", "/"):
        url += "/v1"
    return url


class HTTPBackend:
    """GenerationBackend (and chat client) over an OpenAI-compatible server.

    ``tokenizer`` is the policy's tokenizer (what rollouts render prompts with); it is required
    for :meth:`generate` and optional for :meth:`chat`. A string is loaded: a local Hugging Face
    directory, or any :func:`envace.policy.loading.load_model` spec. ``model`` is the served
    model's name (default: the first one ``/v1/models`` lists). ``server_extras`` sends vLLM's
    extension fields (``return_tokens_as_token_ids``, ``include_stop_str_in_output``); servers
    that reject unknown fields (the hosted OpenAI API) need ``server_extras=False``.
    ``batch_prompts`` sends a whole batch in one request (``prompt`` = list of id lists, one seed
    for the request: right for ``envace serve``, which seeds rows by index as the in-process
    backend does; vLLM would give identical prompts identical samples under one seed, so the
    default is one request per prompt, each with its own seed).
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: Any = None,
        model: str | None = None,
        *,
        api_key: str | None = None,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_concurrency: int = 8,
        token_prompts: bool = True,
        server_extras: bool = True,
        batch_prompts: bool = False,
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_url = normalise_base_url(base_url)
        self.tokenizer = _resolve_tokenizer(tokenizer)
        self._model = model
        self.api_key = api_key if api_key is not None else (os.environ.get(api_key_env) or None)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.max_concurrency = int(max_concurrency)
        self.token_prompts = token_prompts
        self.server_extras = server_extras
        self.batch_prompts = batch_prompts
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx2.Client(
            timeout=self.timeout, headers={"Accept": "application/json", **auth, **self.headers}, follow_redirects=True,
            limits=httpx2.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency))
        self._model_lock = threading.Lock()
        self._warned_alignment = False

    # ------------------------------------------------------------------ model name

    @property
    def model(self) -> str:
        if self._model is None:
            with self._model_lock:
                if self._model is None:
                    listing = self._request("GET", "/models")
                    data = listing.get("data") or []
                    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
                        raise HTTPBackendError(f"{self.base_url}/models lists no model; pass model=...",
                                               f"{self.base_url}/models")
                    self._model = str(data[0]["id"])
        return self._model

    # ------------------------------------------------------------------ completions (protocol)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.tokenizer is None:
            raise ValueError("HTTPBackend.generate needs the policy's tokenizer (HTTPBackend(url, tokenizer=...))")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; a prompt needs at least one token")
        if not prompts:
            return []
        model = self.model  # resolve once, before fanning out
        if self.batch_prompts:
            chunk = max(1, math.ceil(len(prompts) / self.max_concurrency))
            groups = [list(range(s, min(s + chunk, len(prompts)))) for s in range(0, len(prompts), chunk)]
            outs = self._fan_out(lambda idx: self._complete_batch(model, [prompts[i] for i in idx], params), groups)
            return [g for group in outs for g in group]
        jobs = list(range(len(prompts)))
        seeds = [None if params.seed is None else row_seed(params.seed, i) for i in jobs]
        return self._fan_out(lambda i: self._complete_batch(model, [prompts[i]], params, seeds[i])[0], jobs)

    def _fan_out(self, fn: Any, jobs: Sequence[Any]) -> list[Any]:
        if len(jobs) == 1:
            return [fn(jobs[0])]
        # The semaphore inside _request bounds in-flight requests across all callers; the pool
        # only needs enough threads to keep that many busy.
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(jobs)),
                                thread_name_prefix="envace-http") as pool:
            return list(pool.map(fn, jobs))

    def completion_body(self, model: str, prompts: list[list[int]], params: SamplingParams,
                        seed: int | None = None) -> dict[str, Any]:
        """The JSON body of one /v1/completions request (public for inspection and tests)."""
        if self.token_prompts:
            prompt: Any = prompts[0] if len(prompts) == 1 else prompts
        else:
            texts = [self._decode(p) for p in prompts]
            prompt = texts[0] if len(texts) == 1 else texts
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "n": 1,
            "stream": False,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        chosen_seed = params.seed if seed is None else seed
        if chosen_seed is not None:
            body["seed"] = int(chosen_seed)
        if self.server_extras:
            body["return_tokens_as_token_ids"] = True
            body["include_stop_str_in_output"] = True
        body.update(self.extra_body)
        return body

    def _complete_batch(self, model: str, prompts: list[list[int]], params: SamplingParams,
                        seed: int | None = None) -> list[Generation]:
        response = self._request("POST", "/completions", self.completion_body(model, prompts, params, seed))
        choices = response.get("choices")
        if not isinstance(choices, list) or len(choices) != len(prompts):
            raise HTTPBackendError(
                f"{self.base_url}/completions returned {len(choices) if isinstance(choices, list) else 'no'} "
                f"choices for {len(prompts)} prompts", f"{self.base_url}/completions", body=_clip(response))
        choices = sorted(choices, key=lambda c: c.get("index", 0))
        return [self.generation_from_choice(c, params) for c in choices]

    def generation_from_choice(self, choice: dict[str, Any], params: SamplingParams) -> Generation:
        """Map one completions ``choice`` to our Generation (conventions in the module docstring)."""
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        server_text = choice.get("text") or ""
        stop_reason = choice.get("stop_reason")  # vLLM/envace: the stop string, a token id, or None
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") if isinstance(lp, dict) else None
        token_logprobs = lp.get("token_logprobs") if isinstance(lp, dict) else None
        ids = _ids_from_tokens(tokens)
        if ids is not None:
            logprobs = [float("nan") if v is None else float(v) for v in (token_logprobs or [])]
            if len(logprobs) != len(ids):
                logprobs = [float("nan")] * len(ids)
            return Generation(token_ids=ids, logprobs=logprobs, text=self._text_of(ids, finish, params),
                              finish=finish)
        # No ids from the server: recover them from the text.
        text = server_text
        if finish == "stop" and isinstance(stop_reason, str) and stop_reason and not text.endswith(stop_reason):
            text += stop_reason  # the server cut the stop string off; our convention keeps it
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        ended_by_model = finish == "stop" and not (isinstance(stop_reason, str) and stop_reason) and not any(
            s in text for s in params.stop)
        if ended_by_model and self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        values = [float("nan") if v is None else float(v) for v in (token_logprobs or [])]
        if len(values) != len(ids):
            if not self._warned_alignment:
                log.warning("%s sent no token ids and its %d logprobs do not align with the %d re-tokenised ids; "
                            "logprobs are NaN (fine for a frozen judge/simulator, not for training: use a server "
                            "that supports return_tokens_as_token_ids, e.g. vLLM or envace serve)",
                            self.base_url, len(values), len(ids))
                self._warned_alignment = True
            values = [float("nan")] * len(ids)
        return Generation(token_ids=ids, logprobs=values, text=text, finish=finish)

    def _text_of(self, ids: list[int], finish: FinishReason, params: SamplingParams) -> str:
        """The in-process backend's text rule: no EOS, cut right after the first stop string."""
        body = ids
        if finish == "stop" and ids and ids[-1] in _special_ids(self.tokenizer):
            body = ids[:-1]
        text = self._decode(body)
        if params.stop:
            ends = [i + len(s) for s in params.stop if (i := text.find(s)) >= 0]
            if ends:
                text = text[: min(ends)]
        return text

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ------------------------------------------------------------------ chat

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             **params: Any) -> ChatResult:
        """One chat completion. ``params`` go into the body as given (temperature, top_p, seed,
        stop, tool_choice, response_format, ...); ``max_new_tokens`` is accepted for
        ``max_tokens``. Tool calls come back parsed; a server without a tool-call parser that
        returns ``<tool_call>{...}</tool_call>`` text gets it parsed here."""
        if "max_new_tokens" in params:
            params["max_tokens"] = params.pop("max_new_tokens")
        body: dict[str, Any] = {"model": self.model, "messages": [_plain_message(m) for m in messages],
                                "stream": False}
        if tools:
            body["tools"] = [_plain_message(t) for t in tools]
        body.update(params)
        response = self._request("POST", "/chat/completions", body)
        return chat_result(response, f"{self.base_url}/chat/completions")

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One JSON POST to ``base_url + path`` (e.g. ``/load_weights``), with the client's retries."""
        return self._request("POST", path, body)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "HTTPBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = self.base_url + path
        attempts, started = self.max_retries + 1, time.monotonic()
        kind, detail, status, text = "", "", None, ""
        for attempt in range(attempts):
            retry_after = None
            with self._slots:
                try:
                    status, raw, headers = self._send(method, url, body)
                except (httpx2.TimeoutException, TimeoutError) as err:
                    kind, detail, status = "timeout", str(err) or "timed out", None
                except httpx2.TransportError as err:
                    kind, detail, status = "connect", f"{type(err).__name__}: {err}", None
                else:
                    if status < 400:
                        try:
                            return json.loads(raw.decode("utf-8"))
                        except (UnicodeDecodeError, json.JSONDecodeError) as err:
                            raise HTTPBackendError(f"{url} answered with invalid JSON ({err})", url,
                                                   body=raw[:500].decode("utf-8", "replace")) from None
                    text = _error_text(raw)
                    if status != 429 and status < 500:
                        raise HTTPBackendError(f"{method} {url} failed with HTTP {status}: {text}", url,
                                               status=status, body=text)
                    kind, detail = "status", f"HTTP {status}: {text}"
                    retry_after = _seconds(headers.get("retry-after"))
            if attempt + 1 < attempts:
                pause = self.backoff * (2 ** attempt) * random.uniform(0.75, 1.25)
                time.sleep(min(max(pause, retry_after or 0.0), self.max_backoff))
        tries = f"{attempts} attempt{'s' if attempts != 1 else ''} over {time.monotonic() - started:.1f} s"
        if kind == "timeout":
            raise ServerTimeoutError(f"{method} {url}: no answer within the {self.timeout:g} s timeout ({tries}); "
                                     "raise timeout=... or check the server's load", url)
        if kind == "connect":
            raise ServerUnavailableError(
                f"cannot reach the server at {url} ({detail}; {tries}). Is it running? Start one with "
                f"`envace serve --model SPEC --port PORT` or `vllm serve MODEL`, or fix base_url.", url)
        raise HTTPBackendError(f"{method} {url} kept failing with {detail} ({tries})", url, status=status, body=text)

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> tuple[int, bytes, httpx2.Headers]:
        """One exchange. The whole answer must arrive within ``timeout``: httpx2's read timeout
        bounds one read, so a server trickling bytes could otherwise hold a request far longer."""
        deadline = time.monotonic() + self.timeout
        with self._client.stream(method, url, json=body) as resp:
            chunks = []
            for chunk in resp.iter_bytes():
                if time.monotonic() > deadline:
                    raise TimeoutError("the response did not arrive within the timeout")
                chunks.append(chunk)
            return resp.status_code, b"".join(chunks), resp.headers


# ---------------------------------------------------------------------------- helpers


def chat_result(response: dict[str, Any], url: str = "") -> ChatResult:
    """Parse a /v1/chat/completions response into a ChatResult."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise HTTPBackendError(f"{url} returned no choices", url, body=_clip(response))
    choice = choices[0]
    message = choice.get("message") or {}
    content = message.get("content")
    calls: list[ChatToolCall] = []
    for i, tc in enumerate(message.get("tool_calls") or []):
        fn = tc.get("function") or {}
        raw_args = fn.get("arguments")
        if isinstance(raw_args, dict):
            args, raw_text, ok = raw_args, json.dumps(raw_args), True
        else:
            raw_text = raw_args or ""
            try:
                parsed = json.loads(raw_text) if raw_text.strip() else {}
                ok = isinstance(parsed, dict)
                args = parsed if ok else {}
            except json.JSONDecodeError:
                args, ok = {}, False
        calls.append(ChatToolCall(id=str(tc.get("id") or f"call_{i}"), name=str(fn.get("name") or ""),
                                  arguments=args, raw_arguments=raw_text, arguments_ok=ok))
    if not calls and isinstance(content, str) and "<tool_call>" in content:
        parsed_turn = parse_tool_calls(content)
        if parsed_turn.calls:
            calls = [ChatToolCall(id=f"call_{i}", name=c.name, arguments=dict(c.arguments),
                                  raw_arguments=json.dumps(c.arguments)) for i, c in enumerate(parsed_turn.calls)]
            content = parsed_turn.content or None
    return ChatResult(content=content, tool_calls=calls, finish=str(choice.get("finish_reason") or "stop"),
                      raw=response)


def _ids_from_tokens(tokens: Any) -> list[int] | None:
    """Token ids when every token is spelled ``token_id:N`` (vLLM's return_tokens_as_token_ids)."""
    if not isinstance(tokens, list):
        return None
    ids: list[int] = []
    for t in tokens:
        if isinstance(t, int):
            ids.append(t)
        elif isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX):
            try:
                ids.append(int(t[len(TOKEN_ID_PREFIX):]))
            except ValueError:
                return None
        else:
            return None
    return ids


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _plain_message(m: Any) -> Any:
    return m.model_dump(mode="json", exclude_none=True) if hasattr(m, "model_dump") else m


def _error_text(raw: bytes) -> str:
    """An error answer's message (OpenAI's ``error.message`` when it has one)."""
    text = raw[:1000].decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        return str(obj["error"].get("message") or text)
    return text.strip()


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _clip(obj: Any, n: int = 500) -> str:
    text = json.dumps(obj)[:n] if not isinstance(obj, str) else obj[:n]
    return text


def _resolve_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None or not isinstance(tokenizer, str):
        return tokenizer
    # transformers only here: the HTTP client itself runs without torch and transformers
    path = Path(tokenizer).expanduser()
    if path.is_dir() and (path / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    from envace.policy.loading import load_model

    return load_model(tokenizer)[1]
