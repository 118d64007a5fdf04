"""A real environment behind an MCP server, through the official ``mcp`` SDK (``envace[mcp]``).

The server is a command (stdio: envace starts it, one process per episode, and stops it after)
or a streamable-HTTP URL (one session per episode). Episodes never share a session, so they
cannot leak state into each other through it; a server that keeps global state can name a
``reset_tool``, called with the task's ``env.args`` when each episode's session opens.

The SDK is asynchronous; the episode loop is not. One event loop runs in a daemon thread per
provider, and each episode's session lives in its own task there (the SDK's transports must be
entered and left in one task). Calls wait at most ``timeout_s``; a server that hangs, crashes or
refuses answers with a structured ``ENVIRONMENT_ERROR`` and the episode goes on.
Training by rehearsal never opens a session; listing the tools does, once.

A server's tool ``annotations`` (``readOnlyHint``, ``destructiveHint``, ...) are kept beside each
tool's ``function``; results are capped at ``max_result_chars``; a stdio server that dies before
the handshake is reported with its exit code and the end of its stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import shlex
import sys
import threading
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from envace.core.errors import tool_error
from envace.core.types import EnvRef, ToolCall, ToolSpec
from envace.envs.provider import (ENVIRONMENT_ERROR, MAX_RESULT_CHARS, TOOL_EXECUTION_ERROR, ResultPolicy,
                                  WorldProvider, check_call, done, json_safe, recorded)


class MCPSpec(BaseModel):
    """How to reach an MCP server. Exactly one of ``command`` (stdio) and ``url`` (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = Field(None, description="stdio server command, e.g. [python, server.py]")
    url: str | None = Field(None, description="streamable-HTTP endpoint, e.g. http://127.0.0.1:8000/mcp")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the command")
    cwd: str | None = None
    timeout_s: float = Field(30.0, gt=0, description="longest wait for one tool call")
    startup_timeout_s: float = Field(60.0, gt=0, description="longest wait for a session to open")
    reset_tool: str | None = Field(None, description="tool called with env.args when an episode's session opens "
                                   "(default: the server's tool named 'reset', if it has one); never an agent tool")
    max_result_chars: int = Field(MAX_RESULT_CHARS, gt=0, description="longest tool result (JSON text) the agent "
                                  "sees; longer ones are cut with a marker")
    stderr: str | None = Field(None, description="file the stdio server's stderr is appended to "
                               "(default: this process's stderr)")

    @model_validator(mode="after")
    def _one_transport(self) -> MCPSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP world needs exactly one of 'command' (stdio) and 'url' (streamable HTTP)")
        if self.command is not None and not self.command:
            raise ValueError("an MCP world's 'command' is empty")
        return self

    @classmethod
    def parse(cls, spec: str) -> MCPSpec:
        """``mcp:COMMAND ARGS`` (stdio) or an ``http(s)://`` URL."""
        s = spec.strip()
        if s.startswith(("http://", "https://")):
            return cls(url=s)
        if s.startswith("mcp:"):
            rest = s[4:].strip()
            if rest.startswith(("http://", "https://")):
                return cls(url=rest)
            return cls(command=shlex.split(rest))
        raise ValueError(f"{spec!r} is not an MCP server spec (mcp:COMMAND ... or http(s)://.../mcp)")

    def label(self) -> str:
        return self.url or "mcp:" + shlex.join(self.command or [])


def _require_sdk() -> Any:
    try:
        import mcp
    except ImportError:
        raise ValueError("MCP worlds need the official MCP SDK: pip install 'envace[mcp]'") from None
    return mcp


class _StderrTap:
    """The stdio server's stderr through a pipe: passed on to where it would have gone, the
    last few KB kept, so a server that dies before the handshake can be reported with it."""

    KEEP = 2000

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        r, w = os.pipe()
        self._r = r
        self.writer = os.fdopen(w, "w", encoding="utf-8")
        self._tail = b""
        self.thread = threading.Thread(target=self._pump, name="envace-mcp-stderr", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        try:
            while chunk := os.read(self._r, 4096):
                self._tail = (self._tail + chunk)[-self.KEEP:]
                try:
                    self.sink.write(chunk.decode("utf-8", "replace"))
                    self.sink.flush()
                except (OSError, ValueError):  # a closed sink: keep reading, or the server blocks
                    pass
        finally:
            os.close(self._r)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()
        self.thread.join(timeout=1)  # EOF comes when the server (and what it started) is gone

    def tail(self) -> str:
        return self._tail.decode("utf-8", "replace").strip()


class _Probe:
    """What one stdio session leaves for a failure report: its server process and stderr tap."""

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.tap: _StderrTap | None = None

    def report(self) -> str:
        """' (exit code N; stderr ended with: ...)' for a server that is gone, else ''."""
        parts = []
        code = next((getattr(p, "returncode", None) for p in self.processes), None)
        if code is not None:
            parts.append(f"the server exited with code {code}")
        tail = self.tap.tail() if self.tap is not None else ""
        if tail:
            parts.append("its stderr ended with: " + tail[-600:].replace("\n", " | "))
        return f" ({'; '.join(parts)})" if parts else ""


# The SDK does not hand back the server process; the hook records it (per task, through a context
# variable) so that a server that died can be reported with its exit code.
_SPAWNED: contextvars.ContextVar[list | None] = contextvars.ContextVar("envace_mcp_spawned", default=None)


def _hook_spawn() -> None:
    import mcp.client.stdio as stdio

    original = getattr(stdio, "_create_platform_compatible_process", None)
    if original is None or getattr(original, "_envace_hook", False):
        return

    async def spawn(*args: Any, **kwargs: Any) -> Any:
        process = await original(*args, **kwargs)
        sink = _SPAWNED.get()
        if sink is not None:
            sink.append(process)
        return process

    spawn._envace_hook = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = spawn


@asynccontextmanager
async def _client(spec: MCPSpec, probe: _Probe | None = None) -> AsyncIterator[Any]:
    """An entered ``mcp.Client``: over streamable HTTP, or a stdio server started now (and
    stopped when the context exits) with its stderr where ``spec.stderr`` says. Requests wait up
    to ``startup_timeout_s`` (the handshake, the listing, the reset tool); an agent's tool calls
    pass ``timeout_s`` themselves."""
    mcp = _require_sdk()
    if spec.url is not None:
        async with mcp.Client(spec.url, read_timeout_seconds=spec.startup_timeout_s, mode="legacy") as client:
            yield client
        return
    from mcp.client.stdio import stdio_client

    _hook_spawn()
    probe = probe or _Probe()
    _SPAWNED.set(probe.processes)
    params = mcp.StdioServerParameters(command=spec.command[0], args=list(spec.command[1:]),
                                       env={**os.environ, **spec.env} if spec.env else None, cwd=spec.cwd)
    with contextlib.ExitStack() as files:
        sink = files.enter_context(open(spec.stderr, "a", encoding="utf-8")) if spec.stderr else _stderr(files)
        probe.tap = _StderrTap(sink)
        files.callback(probe.tap.close)
        async with mcp.Client(stdio_client(params, errlog=probe.tap.writer), read_timeout_seconds=spec.startup_timeout_s,
                              mode="legacy") as client:
            yield client


def _stderr(files: contextlib.ExitStack) -> Any:
    """A stream with a real file descriptor for the server's stderr: ours when it has one (a
    notebook's or a test's captured stderr does not), else the process's original, else null."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.fileno()
            return stream
        except (AttributeError, OSError, ValueError):
            continue
    return files.enter_context(open(os.devnull, "w"))


def _leaf(e: BaseException) -> BaseException:
    """The first real error inside the task groups' exception groups the SDK raises."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def result_value(result: Any) -> Any:
    """A ``CallToolResult`` as the JSON value the caller sees: structured content when the server
    sends it, else the text (parsed as JSON when it is JSON); ``isError`` -> a structured error."""
    texts = [getattr(c, "text", None) for c in getattr(result, "content", None) or []]
    texts = [t for t in texts if isinstance(t, str)]
    text = "\n".join(texts)
    if getattr(result, "is_error", None) or getattr(result, "isError", None):
        return tool_error(TOOL_EXECUTION_ERROR, text[:500] or "the tool failed")
    structured = getattr(result, "structured_content", None)
    if structured is None:
        structured = getattr(result, "structuredContent", None)
    if structured is not None:
        if isinstance(structured, dict) and set(structured) == {"result"}:
            return json_safe(structured["result"])  # the SDK wraps a non-object return value
        return json_safe(structured)
    if len(texts) == 1:
        try:
            return json.loads(texts[0])
        except (ValueError, RecursionError):
            return texts[0]
    return text


def tool_spec(tool: Any) -> ToolSpec:
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {}
    schema = dict(schema) if isinstance(schema, dict) else {"type": "object", "properties": {}}
    schema.setdefault("type", "object")
    annotations = getattr(tool, "annotations", None)
    if annotations is not None and hasattr(annotations, "model_dump"):
        annotations = annotations.model_dump(by_alias=True, exclude_none=True, mode="json")
    annotations = {k: v for k, v in (annotations or {}).items() if k != "title"} if isinstance(annotations, dict) else {}
    spec = {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                              "parameters": schema},
            **({"annotations": annotations} if annotations else {})}
    output = _output_schema(getattr(tool, "output_schema", None) or getattr(tool, "outputSchema", None))
    if output is not None:
        try:  # the declared result shape, which rehearsed results are checked against
            return ToolSpec.model_validate({**spec, "output_schema": output})
        except ValueError:
            pass  # a schema envace cannot use (invalid, an unsafe pattern): the tool without it
    return ToolSpec.model_validate(spec)


def _output_schema(schema: Any) -> dict[str, Any] | None:
    """A tool's output schema as the shape of the value the caller sees: the SDK wraps a
    non-object return value as ``{"result": ...}`` and :func:`result_value` unwraps it, so the
    schema is unwrapped the same way."""
    if not isinstance(schema, dict) or not schema:
        return None
    props = schema.get("properties")
    if isinstance(props, dict) and set(props) == {"result"} and isinstance(props["result"], dict) and (
            schema.get("x-fastmcp-wrap-result") or schema.get("required") == ["result"]):
        defs = schema.get("$defs")
        return {**props["result"], **({"$defs": defs} if isinstance(defs, dict) else {})}
    return schema


class _Loop:
    """An event loop in a daemon thread; coroutines are submitted from the episode loop's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="envace-mcp", daemon=True)
        self.thread.start()

    def submit(self, coro: Any) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


class _Session:
    """One episode's session: a task in the loop that opens the client, serves calls from a
    queue and closes the client (stopping a stdio server) when told to or when cancelled. Once
    it is dead (could not open, crashed, closed) every call is answered with the reason."""

    def __init__(self, world: MCPWorld, env: EnvRef) -> None:
        self.world, self.env = world, env
        self.queue: asyncio.Queue = asyncio.Queue()
        self.dead: str | None = None
        self.task: Future = world.loop.submit(self._run())

    async def _run(self) -> None:
        spec = self.world.spec_model
        me = asyncio.current_task()
        opened = False

        def too_slow() -> None:
            if not opened and me is not None:
                self.dead = f"the MCP server did not open a session within {spec.startup_timeout_s:g} s"
                me.cancel()

        watchdog = asyncio.get_running_loop().call_later(spec.startup_timeout_s, too_slow)
        probe = _Probe()
        reset_tool = self.world.reset_tool
        try:
            async with _client(spec, probe) as client:
                if reset_tool:
                    reset = await client.call_tool(reset_tool, dict(self.env.args))
                    if getattr(reset, "is_error", False) or getattr(reset, "isError", False):
                        raise RuntimeError(f"reset tool {reset_tool!r} failed: {result_value(reset)}")
                elif self.env.args:
                    self.world.warn_args_ignored(self.env.args)
                opened = True
                watchdog.cancel()
                while True:
                    item = await self.queue.get()
                    if item is None:
                        return
                    name, args, fut = item
                    try:
                        value = self.world.results.apply(name, result_value(
                            await client.call_tool(name, args, read_timeout_seconds=spec.timeout_s)))
                    except Exception as e:  # a call timed out, the server died, a protocol error
                        value = tool_error(ENVIRONMENT_ERROR, f"MCP server: {type(e).__name__}: {e}"[:500])
                    fut.set_result(value)
        except BaseException as e:  # could not start, crashed, or cancelled
            e = _leaf(e)
            if self.dead is None:
                when = "" if opened else " before the session opened"
                self.dead = (f"the MCP server failed{when}: {type(e).__name__}: {e}"[:400]
                             + (probe.report() if not opened else ""))[:1200]
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            watchdog.cancel()
            self.dead = self.dead or "the MCP session is closed"
            while not self.queue.empty():
                item = self.queue.get_nowait()
                if item is not None:
                    item[2].set_result(tool_error(ENVIRONMENT_ERROR, self.dead))

    def _put(self, item: Any) -> None:  # in the loop's thread, so it cannot race the drain above
        if self.dead is not None:
            if item is not None:
                item[2].set_result(tool_error(ENVIRONMENT_ERROR, self.dead))
            return
        self.queue.put_nowait(item)

    def call(self, name: str, arguments: dict) -> Future:
        out: Future = Future()
        self.world.loop.loop.call_soon_threadsafe(self._put, (name, arguments, out))
        return out

    def close(self) -> None:
        self.world.loop.loop.call_soon_threadsafe(self._put, None)
        try:
            self.task.result(timeout=10)
        except Exception:  # a server that will not stop: cancel its task (the transport kills it)
            self.task.cancel()


class MCPWorld(WorldProvider):
    kind = "mcp"

    def __init__(self, spec: MCPSpec) -> None:
        _require_sdk()
        super().__init__(spec.label())
        self.spec_model = spec
        self._loop: _Loop | None = None
        self._tools: list[ToolSpec] | None = None
        self._lock = threading.Lock()
        # The tool each episode's session calls with env.args: the spec's, else the server's 'reset'
        # tool if it lists one (known once the tools are listed). Never offered to the agent.
        self.reset_tool: str | None = spec.reset_tool
        self.results = ResultPolicy(self.spec, spec.max_result_chars, setting="max_result_chars (in the MCP world's settings)")
        self._warned_args = False

    @property
    def loop(self) -> _Loop:
        with self._lock:
            if self._loop is None:
                self._loop = _Loop()
            return self._loop

    def tools(self) -> list[ToolSpec]:
        """The server's tool listing (one short session), minus the reset tool."""
        if self._tools is None:
            spec = self.spec_model

            probe = _Probe()

            async def listing() -> list[Any]:
                async with _client(spec, probe) as client:
                    tools = []
                    cursor = None
                    while True:
                        page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
                        tools.extend(page.tools)
                        cursor = getattr(page, "next_cursor", None) or getattr(page, "nextCursor", None)
                        if not cursor:
                            return tools

            fut = self.loop.submit(listing())
            try:
                listed = fut.result(timeout=spec.startup_timeout_s + spec.timeout_s)
            except FutureTimeout:
                fut.cancel()
                raise ValueError(f"{self.spec}: the MCP server did not list its tools within "
                                 f"{spec.startup_timeout_s + spec.timeout_s:g} s") from None
            except Exception as e:  # noqa: BLE001 - any failure of the session: reported as one ValueError
                e = _leaf(e)
                raise ValueError(f"{self.spec}: could not list the MCP server's tools: {type(e).__name__}: "
                                 f"{str(e)[:300]}{probe.report()}") from None
            names = {t.name for t in listed}
            if spec.reset_tool is not None and spec.reset_tool not in names:
                raise ValueError(f"{self.spec}: reset_tool {spec.reset_tool!r} is not a tool of the server "
                                 f"(its tools: {', '.join(sorted(names))})")
            if self.reset_tool is None and "reset" in names:
                self.reset_tool = "reset"
            self._tools = [tool_spec(t) for t in listed if t.name != self.reset_tool]
        return [ToolSpec.model_validate(t.model_dump()) for t in self._tools]

    def open(self, env: EnvRef) -> MCPEnvironment:
        return MCPEnvironment(self, env)

    def args_ignored(self) -> str | None:
        self.tools()  # the reset tool is known once the tools are listed
        if self.reset_tool is None:
            return (f"{self.spec} has no reset tool: name one (reset_tool in the world's settings) or give the "
                    "server a tool named 'reset', else every episode runs on the server's default state")
        return None

    def warn_args_ignored(self, args: dict) -> None:
        if not self._warned_args:
            self._warned_args = True
            warnings.warn(f"{self.spec}: task env.args {sorted(args)} reach nothing: the server has no reset tool "
                          "(set reset_tool, or add a tool named 'reset'); episodes run on its default state",
                          RuntimeWarning, stacklevel=2)

    def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.stop()
            self._loop = None


class MCPEnvironment:
    """One episode against the server. The session opens at the first call (an episode that
    never calls a tool starts no server) and closes with the episode."""

    def __init__(self, world: MCPWorld, env: EnvRef) -> None:
        self.world, self.env = world, env
        self.session: _Session | None = None
        self.calls: list[tuple[ToolCall, Any]] = []
        world.tools()  # listed once per provider; the episode checks calls against that listing
        self._specs = {t.name: t for t in world._tools or []}

    def submit(self, name: str, arguments: dict) -> Future:
        """Start a call; the result (never an exception) comes in the future."""
        err = check_call(name, arguments, self._specs)
        if err is not None:
            self.calls.append((recorded(name, arguments), err))
            return done(err)
        if self.session is None:
            self.session = _Session(self.world, self.env)
        fut = self.session.call(name, arguments)
        wrapped: Future = Future()

        def finish(f: Future) -> None:
            self.calls.append((recorded(name, arguments), f.result()))
            wrapped.set_result(f.result())

        fut.add_done_callback(finish)
        return wrapped

    def call(self, name: str, arguments: dict) -> Any:
        return wait(self.submit(name, arguments), self.world.spec_model)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def wait(fut: Future, spec: MCPSpec) -> Any:
    """A call's result; past its deadline, a structured timeout error (the server keeps nothing
    of ours waiting: the session's own read timeout ends the call on its side)."""
    try:
        return fut.result(timeout=spec.timeout_s + spec.startup_timeout_s + 5)
    except FutureTimeout:
        return tool_error(ENVIRONMENT_ERROR, f"the MCP server did not answer within {spec.timeout_s:g} s")
