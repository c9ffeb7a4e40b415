#!/usr/bin/env python3
"""Interoperability client: drives the real snowluma-mcp binary with the
official Python MCP SDK (`mcp` 2.x) over its stdio client.

Run from the repository root with the interop venv's Python:

    target/interop/venv/bin/python tests/interop/python/client.py

Environment (set by tests/tests/interop.rs):
    SNOWLUMA_MCP_BIN    absolute path of the server binary
    INTEROP_MODE        docs | read | write
    INTEROP_ENDPOINT    URL of the fake SnowLuma (read and write)
    INTEROP_STREAM_DIR  absolute, existing, empty directory (write)
    INTEROP_EVENTS_URL  optional (read/write): the fake's event WebSocket,
                        passed to the server as SNOWLUMA_MCP_EVENTS_URL
    INTEROP_SELF_ID     the account its events carry (with INTEROP_EVENTS_URL)
    INTEROP_CONFIRM_ACTIONS  optional (write): passed as SNOWLUMA_MCP_CONFIRM_ACTIONS; with
                        set_group_kick the sessions also confirm a keyed kick through the
                        elicitation callback and replay it (c_confirm)

Live event resources (with INTEROP_EVENTS_URL; the fake injects a group
message every 200 ms once connected): the legacy session calls
`subscribe_events`, `resources/subscribe`s the canonical URI, waits for
`notifications/resources/updated` (through the Client's message_handler),
reads with cursors and `resources/unsubscribe`s, which releases the resource;
the modern session opens `Client.listen(resource_subscriptions=[uri])`
(`subscriptions/listen`), waits for a `ResourceUpdated` event on it, reads
with cursors, closes the stream and calls `unsubscribe_events`.

The SDK spawns the server itself (`mcp.client.stdio.stdio_client`, the code
path `Client(StdioServerParameters(...))` takes), once per connection style:

    legacy  Client(mode="legacy"): the `initialize` handshake (2025-era).
    auto    Client(mode="auto"), the SDK's default: the `server/discover`
            probe, falling back to `initialize`.

Both sessions register an elicitation callback (so the SDK declares form
elicitation): in write mode `invoke_action_with_input` with `group_id` only
makes the server ask for `message`; the legacy session gets a server-to-client
`elicitation/create` request, the modern one an `input_required` result that
the SDK's multi-round-trip driver answers through the same callback before
retrying the call with `requestState` (`Client.call_tool` returns only the
final result).

Two passive taps are added around the SDK's own transport: the server's
stderr goes through a pipe that is copied line by line to this script's
stderr (and kept, to look for the server's own log lines), and the JSON-RPC
messages the SDK writes and reads are recorded (to see the SDK's
`notifications/cancelled` and `progressToken`). Neither changes a byte.

Over Streamable HTTP (tests/tests/http_interop.rs runs `snowluma-mcp
serve-http` itself, in the same mode, with the same endpoint and stream
directory):

    client.py --http http://127.0.0.1:PORT/mcp [--http-token-file FILE]
    client.py --http http://localhost/mcp --http-unix-socket /abs/path.sock

(the second for `serve-http --listen /abs/path.sock`: the URL's path and Host
header, the connection to the socket). For an https:// URL whose certificate
a test CA signed, $SNOWLUMA_TEST_HTTP_CA_FILE names that CA (PEM).

The token file (`ID:TOKEN` lines, `#` comments; the entry
$SNOWLUMA_TEST_HTTP_TOKEN_ID or the first) comes from --http-token-file or
$SNOWLUMA_TEST_HTTP_TOKEN_FILE, never the token itself from the command line.
Both sessions then use the SDK's `streamable_http_client` with an httpx2
client carrying `Authorization: Bearer <token>`, and run the same checks;
what only a spawned server allows is left to the harness (the server's log
line of the cancelled call; the server's exit), and the close check instead
requires the legacy session's DELETE to be accepted (200/204/405).

Output: one `ok <check>` or `FAIL <check>: <reason>` line per check, then
`python <mode>: N checks passed, M failed`. Exit status 0 iff every check
passed. An overall deadline (90 s) and per-request timeouts bound the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import traceback
import warnings
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
from jsonschema import Draft202012Validator

from mcp import Client
from mcp.client import ClientRequestContext
from mcp.client.extension import advertise
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp.types import ElicitRequestFormParams, ElicitRequestParams, ElicitResult, ResourceUpdatedNotification

SERVER_NAME = "snowluma-mcp"
# The confirmed call (write mode with INTEROP_CONFIRM_ACTIONS=set_group_kick), keyed.
CONFIRM_CALL = {
    "action": "set_group_kick",
    "params": {"group_id": 20001, "user_id": 30001},
    "execution": {"idempotency_key": "interop-kick-1"},
}
DOC_TOOLS = {"list_actions", "get_action", "search_actions", "list_categories", "get_runtime_info", "preview_message"}
CATALOG_URI = "snowluma://onebot/actions"
ACTION_TEMPLATE = "snowluma://onebot/actions/{name}"
ACTION_COUNT = 193
OUTCOMES = {"success", "failed", "unknown"}
EVENT_TOOLS = {"subscribe_events", "unsubscribe_events"}
# The message preview panel (MCP Apps): what a UI-capable host declares and gets.
UI_EXTENSION = "io.modelcontextprotocol/ui"
UI_MIME = "text/html;profile=mcp-app"
UI_URI = "ui://snowluma-mcp/preview-message.html"
PREVIEW_ARGS = {"message_type": "group", "target_id": 20001, "text": "[CQ:at,qq=all] <img src=x onerror=alert(1)>", "reply_to": -123456}
EVENTS_URI_PREFIX = "snowluma://onebot/events/"
EVENT_READ_FIELDS = {"status", "events", "next_cursor", "oldest_cursor", "dropped_events", "gap", "notification_failed"}
EVENT_WAIT_S = 10.0  # for the fake's injected events (one per 200 ms) and their notifications

INTEROP_FILE = "interop.bin"
INTEROP_FILE_BYTES = 256 * 1024
INTEROP_FILE_SHA256 = hashlib.sha256(bytes(i % 251 for i in range(INTEROP_FILE_BYTES))).hexdigest()
BUSINESS_FAILURE_RETCODE = 100
# Input completion: the call missing `message`, and the callback's answer
# (tests/tests/interop.rs looks for exactly this merged request at the fake).
INPUT_CALL = {"action": "send_group_msg", "params": {"group_id": 20001}}
INPUT_ANSWER = {"message": "Hello"}

# Whole-run bound (the contract: FAIL and exit 1 past 90 s). The async part
# gets a little less so that its own FAIL line and summary are printed; the
# watchdog thread is the last resort if even that is stuck.
HARD_DEADLINE_S = 90.0
ASYNC_DEADLINE_S = 80.0
REQUEST_TIMEOUT_S = 15.0  # every request the SDK sends (read_timeout_seconds)
CANCEL_AFTER_S = 0.3  # how long the slow call runs before it is cancelled
SERVER_LOG_WAIT_S = 5.0  # how long to wait for the server's log line of a call
STDIO_GRACE_S = 2.0  # the SDK's PROCESS_TERMINATION_TIMEOUT: after it, it kills


class CheckFailed(Exception):
    """A check's expectation did not hold."""


def expect(cond: Any, reason: str) -> None:
    if not cond:
        raise CheckFailed(reason)


def describe(exc: BaseException) -> str:
    """`Type: message` of the innermost exceptions (task groups wrap them in groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


class Report:
    """Prints one line per check as it completes and keeps the tally."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.passed = 0
        self.failed = 0
        self.lock = threading.Lock()
        self.finished = False

    def ok(self, name: str, detail: str | None = None) -> None:
        with self.lock:
            if self.finished:
                return
            self.passed += 1
            self._emit(f"ok {name}" + (f" -- {detail}" if detail else ""))

    def fail(self, name: str, reason: str) -> None:
        with self.lock:
            if self.finished:
                return
            self.failed += 1
            reason = " ".join(reason.split()) or "(no message)"
            self._emit(f"FAIL {name}: {reason}")

    def finish(self) -> int:
        with self.lock:
            if not self.finished:
                self.finished = True
                self._emit(f"python {self.mode}: {self.passed} checks passed, {self.failed} failed")
            return 0 if self.failed == 0 and self.passed > 0 else 1

    @staticmethod
    def _emit(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class StderrTap:
    """A pipe for the server's stderr: copied to ours line by line, and kept."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w")
        self._reader_fd = read_fd
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, name="server-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        out = getattr(sys.stderr, "buffer", None)
        with os.fdopen(self._reader_fd, "rb") as pipe:
            for raw in pipe:
                try:
                    if out is not None:
                        out.write(raw)
                        out.flush()
                except (OSError, ValueError):
                    pass
                with self._lock:
                    self._lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def close_writer(self) -> None:
        """Drop our copy of the write end: EOF then means every server process is gone."""
        if not self.writer.closed:
            self.writer.close()

    def wait_eof(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def mark(self) -> int:
        with self._lock:
            return len(self._lines)

    def lines(self, since: int = 0) -> list[str]:
        with self._lock:
            return self._lines[since:]


def _as_json(message: Any) -> dict[str, Any]:
    try:
        return json.loads(message.model_dump_json(by_alias=True, exclude_unset=True))
    except Exception:  # never let the tap disturb the session
        return {}


class _SendTap:
    """The SDK's write stream, recording each JSON-RPC message on its way out."""

    def __init__(self, inner: Any, log: list[dict[str, Any]]) -> None:
        self._inner = inner
        self._log = log

    async def send(self, item: Any) -> None:
        self._log.append(_as_json(item.message))
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _SendTap:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)


class _ReceiveTap:
    """The SDK's read stream, recording each JSON-RPC message on its way in."""

    def __init__(self, inner: Any, log: list[dict[str, Any]]) -> None:
        self._inner = inner
        self._log = log

    def _note(self, item: Any) -> Any:
        message = getattr(item, "message", None)
        if message is not None:
            self._log.append(_as_json(message))
        return item

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        return self._note(await self._inner.receive())

    def __aiter__(self) -> _ReceiveTap:
        return self

    async def __anext__(self) -> Any:
        try:
            return self._note(await self._inner.receive())
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _ReceiveTap:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)


class HttpTarget:
    """`--http URL` and its bearer token (see the module docstring)."""

    def __init__(self, url: str, token: str, unix_socket: str | None = None) -> None:
        self.url = url
        self.token = token
        self.unix_socket = unix_socket
        self.responses: list[tuple[str, int]] = []  # (method, status) of every HTTP response


def read_bearer_token(path: str, entry: str | None) -> str:
    """The token of a serve-http token file: of the entry `entry`, or of the first."""
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            ident, sep, token = line.partition(":")
            if not sep or not ident:
                raise CheckFailed(f"{path}: a line is not ID:TOKEN")
            if entry and ident != entry:
                continue
            return token
    raise CheckFailed(f"{path}: no entry {entry!r}" if entry else f"{path}: no ID:TOKEN entry")


def http_target(argv: list[str]) -> HttpTarget | None:
    """The --http mode's target, or None over stdio. Raises CheckFailed when incomplete."""
    url = None
    unix_socket = None
    token_file = os.environ.get("SNOWLUMA_TEST_HTTP_TOKEN_FILE") or None
    it = iter(argv)
    for arg in it:
        if arg == "--http":
            url = next(it, "")
        elif arg.startswith("--http="):
            url = arg.partition("=")[2]
        elif arg == "--http-token-file":
            token_file = next(it, None)
        elif arg.startswith("--http-token-file="):
            token_file = arg.partition("=")[2]
        elif arg == "--http-unix-socket":
            unix_socket = next(it, None)
        elif arg.startswith("--http-unix-socket="):
            unix_socket = arg.partition("=")[2]
        else:
            raise CheckFailed(f"unknown argument {arg!r}")
    if url is None:
        return None
    if not url:
        raise CheckFailed("--http needs the server URL (http://HOST:PORT/mcp)")
    if not token_file:
        raise CheckFailed("--http needs a token file: --http-token-file FILE or SNOWLUMA_TEST_HTTP_TOKEN_FILE")
    if unix_socket is not None and not os.path.isabs(unix_socket):
        raise CheckFailed(f"--http-unix-socket needs an absolute path, got {unix_socket!r}")
    token = read_bearer_token(token_file, os.environ.get("SNOWLUMA_TEST_HTTP_TOKEN_ID") or None)
    return HttpTarget(url, token, unix_socket)


@asynccontextmanager
async def tapped_http(target: HttpTarget, sent: list, received: list):
    """The SDK's Streamable HTTP client with the bearer header, tapped like tapped_stdio."""
    import httpx2

    async def on_response(response: Any) -> None:
        target.responses.append((response.request.method, response.status_code))

    # A test CA for https:// (serve-http --tls-cert): trusted instead of the system roots.
    ca_file = os.environ.get("SNOWLUMA_TEST_HTTP_CA_FILE")
    verify: Any = True
    if ca_file:
        import ssl

        verify = ssl.create_default_context(cafile=ca_file)
    # Over a Unix socket (serve-http --listen /abs/path.sock): httpx2's own
    # transport option; the URL still gives the path and the Host header.
    transport = httpx2.AsyncHTTPTransport(uds=target.unix_socket, verify=verify) if target.unix_socket else None
    client = httpx2.AsyncClient(
        transport=transport,
        verify=verify,
        headers={"Authorization": f"Bearer {target.token}"},
        timeout=httpx2.Timeout(30.0, read=300.0),  # the SDK's defaults (create_mcp_http_client)
        event_hooks={"response": [on_response]},
    )
    async with client:
        async with streamable_http_client(target.url, http_client=client) as (read_stream, write_stream):
            yield _ReceiveTap(read_stream, received), _SendTap(write_stream, sent)


@asynccontextmanager
async def tapped_stdio(params: StdioServerParameters, errlog: Any, sent: list, received: list):
    async with stdio_client(params, errlog=errlog) as (read_stream, write_stream):
        yield _ReceiveTap(read_stream, received), _SendTap(write_stream, sent)


class Run:
    """One connection (one spawned server) in one connection style."""

    def __init__(
        self,
        report: Report,
        mode: str,
        era: str,
        env: dict[str, str],
        stream_dir: str | None,
        http: HttpTarget | None = None,
        ui: bool = False,
    ) -> None:
        self.report = report
        self.http = http
        self.http_mark = 0
        # A session whose client declares the MCP Apps extension: it runs only
        # the preview checks (run_preview) and touches nothing else.
        self.ui = ui
        self.mode = mode
        self.era = era
        self.env = env
        self.stream_dir = stream_dir
        self.client: Client | None = None
        self.tap: StderrTap | None = None
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.tools: dict[str, Any] = {}
        self.validators: dict[str, Draft202012Validator] = {}
        self.elicitations: list[ElicitRequestParams] = []
        self.events_url = env.get("SNOWLUMA_MCP_EVENTS_URL")
        self.self_id = int(env["__self_id"]) if "__self_id" in env else None
        self.updates: list[str] = []  # uris of notifications/resources/updated (message_handler)
        self.event_uri: str | None = None
        self.first_read: dict[str, Any] | None = None

    async def on_message(self, message: Any) -> None:
        """The Client's message_handler: records resource update notifications."""
        if isinstance(message, ResourceUpdatedNotification):
            self.updates.append(str(message.params.uri))

    async def on_elicit(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        """The elicitation callback: record the request, answer the form with INPUT_ANSWER."""
        self.elicitations.append(params)
        if not isinstance(params, ElicitRequestFormParams):
            return ElicitResult(action="decline")
        # A confirmation (SNOWLUMA_MCP_CONFIRM_ACTIONS): one boolean field `confirm`.
        props = (params.requested_schema or {}).get("properties") or {}
        if (props.get("confirm") or {}).get("type") == "boolean":
            return ElicitResult(action="accept", content={"confirm": True})
        return ElicitResult(action="accept", content={"params_json": json.dumps(INPUT_ANSWER)})

    def name(self, check: str) -> str:
        return f"[{self.era}] {'UI session: ' if self.ui else ''}{check}"

    async def check(self, check: str, fn, *args: Any) -> bool:
        name = self.name(check)
        try:
            detail = await fn(*args)
        except CheckFailed as e:
            self.report.fail(name, str(e))
            return False
        except Exception as e:  # the SDK raised where a result was expected, etc.
            self.report.fail(name, describe(e))
            traceback.print_exc(file=sys.stderr)
            return False
        self.report.ok(name, detail)
        return True

    # ---- tool calls -------------------------------------------------------

    async def call(self, tool: str, args: dict[str, Any], **kw: Any) -> tuple[Any, dict[str, Any]]:
        """tools/call through the SDK, then the envelope and outputSchema checks."""
        assert self.client is not None
        result = await self.client.call_tool(tool, args, **kw)
        sc = result.structured_content
        expect(isinstance(sc, dict), f"{tool}: no structuredContent (got {short(sc)})")
        validator = self.validators.get(tool)
        expect(validator is not None, f"{tool}: no advertised outputSchema to validate against")
        errors = sorted(validator.iter_errors(sc), key=lambda e: list(e.absolute_path))
        expect(
            not errors,
            f"{tool}: structuredContent violates its outputSchema at "
            f"/{'/'.join(str(p) for p in errors[0].absolute_path) if errors else ''}: "
            f"{errors[0].message if errors else ''}",
        )
        expect("result" in sc and "diagnostics" in sc, f"{tool}: structuredContent lacks result/diagnostics")
        diag = sc["diagnostics"]
        expect(isinstance(diag, dict) and diag.get("outcome") in OUTCOMES, f"{tool}: bad diagnostics {short(diag)}")
        if result.is_error:
            expect(sc["result"] is None, f"{tool}: isError but result is {short(sc['result'])}")
        return result, sc

    async def call_ok(self, tool: str, args: dict[str, Any], **kw: Any) -> Any:
        result, sc = await self.call(tool, args, **kw)
        expect(not result.is_error, f"isError true: {short(sc['diagnostics'])}")
        expect(sc["diagnostics"]["outcome"] == "success", f"outcome {short(sc['diagnostics'])}")
        return sc["result"]

    async def call_err(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        result, sc = await self.call(tool, args)
        expect(result.is_error is True, f"expected isError true, got {result.is_error}: {short(sc)}")
        expect(sc["diagnostics"]["outcome"] == "failed", f"outcome {sc['diagnostics'].get('outcome')!r}")
        return sc["diagnostics"]

    # ---- checks: connection --------------------------------------------------

    async def c_connected(self) -> str:
        assert self.client is not None
        session = self.client.session
        info = self.client.server_info
        version = self.client.protocol_version
        if self.era == "legacy":
            init = session.initialize_result
            expect(init is not None, "no InitializeResult: the initialize handshake did not run")
            info = init.server_info
            version = init.protocol_version
        else:
            expect(info is not None, "the server did not identify itself (no serverInfo)")
        expect(info.name == SERVER_NAME, f"serverInfo.name {info.name!r}, expected {SERVER_NAME!r}")
        how = "initialize" if session.initialize_result is not None else "server/discover"
        return f"{how}; serverInfo {info.name} {info.version}; protocolVersion {version}"

    async def c_list_tools(self, expected: set[str]) -> str:
        assert self.client is not None
        listing = await self.client.list_tools()
        expect(listing.next_cursor is None, "tools/list is paginated (unexpected for 5-7 tools)")
        names = [t.name for t in listing.tools]
        expect(len(names) == len(set(names)), f"duplicate tool names: {names}")
        expect(set(names) == expected, f"tools {sorted(names)}, expected {sorted(expected)}")
        for tool in listing.tools:
            expect(tool.output_schema is not None, f"{tool.name}: no outputSchema")
            try:
                Draft202012Validator.check_schema(tool.output_schema)
                Draft202012Validator.check_schema(tool.input_schema)
            except Exception as e:
                raise CheckFailed(f"{tool.name}: invalid schema: {e}") from e
            self.tools[tool.name] = tool
            self.validators[tool.name] = Draft202012Validator(tool.output_schema)
        return ", ".join(names)

    # ---- checks: docs tools --------------------------------------------------

    async def c_list_actions_all(self) -> str:
        r = await self.call_ok("list_actions", {})
        actions = r.get("actions")
        expect(isinstance(actions, list), f"result.actions missing: {short(r)}")
        expect(len(actions) == ACTION_COUNT, f"{len(actions)} actions, expected {ACTION_COUNT}")
        expect(r.get("count") == ACTION_COUNT, f"count {r.get('count')}, expected {ACTION_COUNT}")
        return f"{len(actions)} actions"

    async def c_list_actions_page(self) -> str:
        r = await self.call_ok("list_actions", {"limit": 5})
        expect(len(r.get("actions") or []) == 5, f"{len(r.get('actions') or [])} actions, expected 5")
        expect(r.get("count") == 5, f"count {r.get('count')}")
        expect(r.get("next_offset") == 5, f"next_offset {r.get('next_offset')!r}, expected 5")
        expect(r.get("total") == ACTION_COUNT, f"total {r.get('total')!r}, expected {ACTION_COUNT}")
        return f"5 actions, next_offset 5, total {r.get('total')}"

    async def c_get_action(self) -> str:
        r = await self.call_ok("get_action", {"name": "get_status"})
        expect(isinstance(r, dict) and r.get("name") == "get_status", f"result.name {short(r)}")
        return f"category {r.get('category')}"

    async def c_search_actions(self) -> str:
        r = await self.call_ok("search_actions", {"query": "禁言", "match": "keywords"})
        actions = r.get("actions") or []
        expect(actions, f"no match: {short(r)}")
        expect(r.get("count") == len(actions), f"count {r.get('count')} vs {len(actions)} actions")
        return f"{len(actions)} matches, first {actions[0].get('name')}"

    async def c_list_categories(self) -> str:
        r = await self.call_ok("list_categories", {})
        expect(isinstance(r, list) and r, f"result {short(r)}")
        total = sum(c.get("count", 0) for c in r)
        expect(total == ACTION_COUNT, f"category counts add up to {total}, expected {ACTION_COUNT}")
        return f"{len(r)} categories, {total} actions"

    async def c_runtime_info(self) -> str:
        r = await self.call_ok("get_runtime_info", {})
        expect(isinstance(r, dict) and r.get("mode") == self.mode, f"mode {short(r.get('mode') if isinstance(r, dict) else r)}")
        expect(r.get("execution_enabled") == (self.mode != "docs"), f"execution_enabled {r.get('execution_enabled')}")
        expect(r.get("write_enabled") == (self.mode == "write"), f"write_enabled {r.get('write_enabled')}")
        return f"mode {r['mode']}"

    async def c_unknown_action(self) -> str:
        d = await self.call_err("get_action", {"name": "no_such_action"})
        expect(d.get("kind") == "unknown_action", f"kind {d.get('kind')!r}, expected 'unknown_action'")
        expect(isinstance(d.get("next_step"), str) and d["next_step"].strip(), "next_step missing or empty")
        return "isError, kind unknown_action"

    async def c_bad_arguments(self) -> str:
        d = await self.call_err("list_actions", {"limit": "ten"})
        expect(isinstance(d.get("next_step"), str) and d["next_step"].strip(), "next_step missing or empty")
        return f"isError, kind {d.get('kind')}"

    # ---- checks: resources ---------------------------------------------------

    async def c_resources_catalog(self) -> str:
        assert self.client is not None
        listing = await self.client.list_resources()
        uris = [str(r.uri) for r in listing.resources]
        expect(CATALOG_URI in uris, f"resources/list: {uris}")
        read = await self.client.read_resource(CATALOG_URI)
        expect(len(read.contents) == 1, f"{len(read.contents)} contents")
        text = getattr(read.contents[0], "text", None)
        expect(isinstance(text, str), "the catalog is not text")
        doc = json.loads(text)
        actions = doc.get("actions") if isinstance(doc, dict) else doc
        expect(isinstance(actions, list) and len(actions) == ACTION_COUNT, f"{len(actions or [])} actions")
        return f"{ACTION_COUNT} actions, {len(text.encode())} bytes"

    async def c_resource_template(self) -> str:
        assert self.client is not None
        listing = await self.client.list_resource_templates()
        templates = [t.uri_template for t in listing.resource_templates]
        expect(ACTION_TEMPLATE in templates, f"resources/templates/list: {templates}")
        uri = ACTION_TEMPLATE.replace("{name}", "get_status")
        read = await self.client.read_resource(uri)
        expect(read.contents, "no contents")
        doc = json.loads(read.contents[0].text)
        expect(doc.get("name") == "get_status", f"name {doc.get('name')!r}")
        return f"read {uri}"

    # ---- checks: execution ---------------------------------------------------

    async def c_query_status(self) -> str:
        r = await self.call_ok("query_action", {"action": "get_status"})
        expect(isinstance(r, dict) and r.get("status") == "ok", f"result {short(r)}")
        return "result.status ok"

    async def c_query_denied(self) -> str:
        d = await self.call_err("query_action", {"action": "get_cookies"})
        expect(d.get("kind") == "policy_denied", f"kind {d.get('kind')!r}, expected 'policy_denied'")
        return "isError, kind policy_denied"

    async def c_query_write_refused(self) -> str:
        d = await self.call_err("query_action", {"action": "send_group_msg", "params": {"group_id": 1, "message": "x"}})
        expect(d.get("kind"), "no kind")
        return f"isError, kind {d['kind']}"

    async def c_invoke_business_failure(self) -> str:
        result, sc = await self.call("invoke_action", {"action": "send_group_msg", "params": {"group_id": 1, "message": "hi"}})
        expect(result.is_error is False, f"isError {result.is_error}: {short(sc)}")
        expect(sc["diagnostics"]["outcome"] == "failed", f"outcome {sc['diagnostics'].get('outcome')!r}")
        r = sc["result"]
        expect(isinstance(r, dict) and r.get("retcode") == BUSINESS_FAILURE_RETCODE, f"result {short(r)}")
        return f"isError false, outcome failed, retcode 100, kind {sc['diagnostics'].get('kind')}"

    async def c_invoke_with_input(self) -> str:
        mark = len(self.elicitations)
        sent_mark, received_mark = len(self.sent), len(self.received)
        result, sc = await self.call("invoke_action_with_input", INPUT_CALL)
        asked = self.elicitations[mark:]
        # On the wire: a server-to-client request (legacy), or an input_required
        # result and a retry echoing its requestState (modern).
        received, sent = self.received[received_mark:], self.sent[sent_mark:]
        pushed = [m for m in received if m.get("method") == "elicitation/create"]
        states = [
            (m.get("result") or {}).get("requestState")
            for m in received
            if (m.get("result") or {}).get("resultType") == "input_required"
        ]
        retries = [m for m in sent if m.get("method") == "tools/call" and "requestState" in (m.get("params") or {})]
        if self.era == "legacy":
            expect(len(pushed) == 1 and not states, f"expected one elicitation/create request: {len(pushed)} requests, {len(states)} input_required")
        else:
            expect(not pushed and len(states) == 1, f"expected one input_required result: {len(pushed)} requests, {len(states)} input_required")
            expect(
                len(retries) == 1 and retries[0]["params"]["requestState"] == states[0],
                f"expected one retry echoing requestState: {short(retries)}",
            )
        expect(len(asked) == 1, f"the elicitation callback ran {len(asked)} times, expected once")
        form = asked[0]
        expect(isinstance(form, ElicitRequestFormParams), f"not a form elicitation: {short(form.model_dump())}")
        expect("send_group_msg" in form.message and "message" in form.message, f"message {form.message!r}")
        schema = form.requested_schema or {}
        props = schema.get("properties") or {}
        expect(
            schema.get("type") == "object" and list(props) == ["params_json"] and props["params_json"].get("type") == "string",
            f"requestedSchema is not one string field params_json: {short(schema)}",
        )
        expect(schema.get("required") == ["params_json"], f"required {schema.get('required')!r}")
        # Executed: the fake's interop preset answers every send_group_msg with retcode 100.
        expect(result.is_error is False, f"isError {result.is_error}: {short(sc)}")
        r = sc["result"]
        expect(isinstance(r, dict) and r.get("retcode") == BUSINESS_FAILURE_RETCODE, f"result {short(r)}")
        how = "elicitation/create request" if self.era == "legacy" else "input_required round"
        return f"asked once ({how}: {form.message!r}), executed: outcome {sc['diagnostics'].get('outcome')}, retcode {r.get('retcode')}"

    async def c_confirm(self) -> str:
        """invoke_action set_group_kick (listed in SNOWLUMA_MCP_CONFIRM_ACTIONS): asked once, run once;
        the same call with its idempotency key again replays without asking."""
        mark = len(self.elicitations)
        result, sc = await self.call("invoke_action", CONFIRM_CALL)
        asked = self.elicitations[mark:]
        expect(len(asked) == 1, f"the elicitation callback ran {len(asked)} times, expected once")
        form = asked[0]
        expect(isinstance(form, ElicitRequestFormParams), f"not a form elicitation: {short(form.model_dump())}")
        for needle in ("set_group_kick", '{"group_id":20001,"user_id":30001}', "SNOWLUMA_MCP_CONFIRM_ACTIONS"):
            expect(needle in form.message, f"the message lacks {needle!r}: {form.message!r}")
        props = (form.requested_schema or {}).get("properties") or {}
        expect(list(props) == ["confirm"] and props["confirm"].get("type") == "boolean", f"schema {short(form.requested_schema)}")
        expect(result.is_error is False, f"isError {result.is_error}: {short(sc)}")
        expect(sc["diagnostics"].get("replayed") is None, f"the first call is a replay: {short(sc)}")
        again, sc2 = await self.call("invoke_action", CONFIRM_CALL)
        expect(len(self.elicitations) == mark + 1, "asked again for the replay")
        expect(sc2["diagnostics"].get("replayed") is True, f"not replayed: {short(sc2)}")
        expect(sc2["result"] == sc["result"], "the replay is not the recorded result")
        return f"confirmed once, outcome {sc['diagnostics'].get('outcome')}; the keyed retry replayed without asking"

    async def c_download(self) -> str:
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((value, total, message))

        mark = len(self.sent)
        r = await self.call_ok(
            "invoke_action",
            {"action": "download_file_stream", "params": {"file": INTEROP_FILE}},
            progress_callback=on_progress,
        )
        calls = [m for m in self.sent[mark:] if m.get("method") == "tools/call"]
        token = calls[0].get("params", {}).get("_meta", {}).get("progressToken") if calls else None
        expect(token is not None, "the SDK sent no progressToken")
        expect(isinstance(r, dict), f"result {short(r)}")
        expect(r.get("file_size") == INTEROP_FILE_BYTES, f"file_size {r.get('file_size')!r}")
        expect(r.get("sha256") == INTEROP_FILE_SHA256, f"sha256 {r.get('sha256')!r}, expected {INTEROP_FILE_SHA256}")
        path = r.get("file_path")
        expect(isinstance(path, str) and os.path.isabs(path), f"file_path {path!r}")
        real_dir = os.path.realpath(self.stream_dir or "")
        expect(
            os.path.commonpath([os.path.realpath(path), real_dir]) == real_dir,
            f"file_path {path} is not inside INTEROP_STREAM_DIR {self.stream_dir}",
        )
        expect(os.path.isfile(path), f"{path} does not exist")
        with open(path, "rb") as f:
            data = f.read()
        expect(len(data) == INTEROP_FILE_BYTES, f"{len(data)} bytes on disk")
        expect(hashlib.sha256(data).hexdigest() == INTEROP_FILE_SHA256, "file contents differ from the expected bytes")
        expect(progress, "no progress notification arrived")
        values = [p[0] for p in progress]
        expect(values == sorted(values), f"progress went backwards: {values}")
        return f"{len(data)} bytes, sha256 ok, {len(progress)} progress notifications (last {progress[-1][0]:g}/{progress[-1][1]})"

    async def c_cancel(self) -> str:
        assert self.client is not None and (self.tap is not None or self.http is not None)
        sent_mark = len(self.sent)
        log_mark = self.tap.mark() if self.tap is not None else 0
        done: dict[str, Any] = {}
        scope_box: list[anyio.CancelScope] = []

        async def slow_call() -> None:
            with anyio.CancelScope() as scope:
                scope_box.append(scope)
                try:
                    done["result"] = await self.client.call_tool("query_action", {"action": "get_group_list"})
                except Exception as e:
                    done["error"] = e
                done["after"] = time.monotonic() - started

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_call)
            await anyio.sleep(CANCEL_AFTER_S)
            scope_box[0].cancel()
        elapsed = time.monotonic() - started
        if "result" in done:
            raise CheckFailed(
                f"get_group_list answered after {done['after'] * 1000:.0f} ms, before the cancel, so nothing was cancelled "
                f"(the fake's interop preset should hang it): {short(done['result'].structured_content)}"
            )
        if "error" in done:
            raise CheckFailed(
                f"the call failed after {done['after'] * 1000:.0f} ms, before the cancel: {describe(done['error'])}"
            )
        expect(scope_box[0].cancelled_caught, "the call's cancel scope did not catch the cancellation")

        # Client side: the SDK wrote notifications/cancelled naming the request.
        request_id = None
        for m in self.sent[sent_mark:]:
            if m.get("method") == "tools/call" and (m.get("params") or {}).get("arguments", {}).get("action") == "get_group_list":
                request_id = m.get("id")
        expect(request_id is not None, "the SDK never wrote the tools/call request")
        cancels = [
            m for m in self.sent[sent_mark:]
            if m.get("method") == "notifications/cancelled" and (m.get("params") or {}).get("requestId") == request_id
        ]
        expect(cancels, f"the SDK wrote no notifications/cancelled for request {request_id!r}")

        late = [m for m in self.received if m.get("id") == request_id and ("result" in m or "error" in m)]
        note = f"; the server still answered the cancelled request ({short(late[0], 120)})" if late else ""
        if self.http is not None:
            # The server's log is the harness's (http_interop.rs), not ours.
            return f"cancelled after {elapsed * 1000:.0f} ms; SDK sent notifications/cancelled for id {request_id}{note}"

        # Server side: it logs one line per finished call; a cancelled call ends with failure="cancelled".
        deadline = time.monotonic() + SERVER_LOG_WAIT_S
        line = None
        while line is None and time.monotonic() < deadline:
            for text in self.tap.lines(log_mark):
                if 'tool="query_action"' in text and 'failure="cancelled"' in text:
                    line = text
                    break
            else:
                await anyio.sleep(0.05)
        expect(line is not None, f"the server logged no cancelled query_action within {SERVER_LOG_WAIT_S:g} s of notifications/cancelled")
        return f"cancelled after {elapsed * 1000:.0f} ms; SDK sent notifications/cancelled for id {request_id}; server logged the call as cancelled{note}"

    async def c_after_cancel(self) -> str:
        r = await self.call_ok("list_categories", {})
        expect(isinstance(r, list) and r, f"result {short(r)}")
        return "list_categories answered"

    # ---- checks: live event resources ----------------------------------------

    def _event_doc(self, read: Any) -> dict[str, Any]:
        expect(len(read.contents) == 1, f"{len(read.contents)} contents")
        text = getattr(read.contents[0], "text", None)
        expect(isinstance(text, str), "the event resource is not text")
        doc = json.loads(text)
        expect(isinstance(doc, dict), f"not an object: {short(doc)}")
        return doc

    def _event_problems(self, doc: dict[str, Any]) -> list[str]:
        problems = []
        # The documented fields, plus `uri` (the canonical URI), which the
        # server also sends although the README does not list it.
        if set(doc) - {"uri"} != EVENT_READ_FIELDS:
            problems.append(f"fields {sorted(doc)}, expected {sorted(EVENT_READ_FIELDS)}")
        if "uri" in doc and doc["uri"] != self.event_uri:
            problems.append(f"uri {doc['uri']!r}, expected {self.event_uri!r}")
        if (doc.get("status") or {}).get("state") != "connected":
            problems.append(f"status {short(doc.get('status'))}")
        if not isinstance(doc.get("next_cursor"), str):
            problems.append(f"next_cursor {doc.get('next_cursor')!r}")
        for key, want in (("dropped_events", 0), ("gap", False), ("notification_failed", False)):
            if doc.get(key) != want or type(doc.get(key)) is not type(want):
                problems.append(f"{key} {doc.get(key)!r}")
        for e in doc.get("events") or []:
            ev = e.get("event") if isinstance(e, dict) else None
            if not isinstance(e.get("cursor"), str) or not isinstance(ev, dict):
                problems.append(f"entry {short(e, 120)}")
                break
            if ev.get("self_id") != self.self_id or not str(ev.get("raw_message", "")).startswith("interop event "):
                problems.append(f"event {short(ev, 160)}")
                break
        return problems

    async def _read_events(self, uri: str) -> dict[str, Any]:
        """Read until the resource holds at least one event (bounded)."""
        assert self.client is not None
        with anyio.fail_after(EVENT_WAIT_S):
            while True:
                doc = self._event_doc(await self.client.read_resource(uri))
                if doc.get("events"):
                    return doc
                await anyio.sleep(0.05)

    async def c_subscribe_events(self) -> str:
        r = await self.call_ok("subscribe_events", {"self_id": self.self_id})
        uri = r.get("uri") if isinstance(r, dict) else None
        expect(isinstance(uri, str) and uri.startswith(EVENTS_URI_PREFIX), f"result {short(r)}")
        expect((r.get("status") or {}).get("state") == "connected", f"status {short(r.get('status'))}")
        self.event_uri = uri
        return uri

    async def c_resources_subscribe(self) -> str:
        assert self.client is not None and self.event_uri is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated as of 2026-07-28, the era this session is not in
            await self.client.subscribe_resource(self.event_uri)
        return "resources/subscribe accepted"

    async def c_legacy_updated(self) -> str:
        with anyio.fail_after(EVENT_WAIT_S):
            while self.event_uri not in self.updates:
                await anyio.sleep(0.05)
        return f"{len(self.updates)} notifications/resources/updated for the uri"

    async def c_event_reads(self) -> str:
        assert self.event_uri is not None
        first = await self._read_events(self.event_uri)
        problems = self._event_problems(first)
        expect(not problems, "; ".join(problems))
        evs = first["events"]
        expect(first["oldest_cursor"] == evs[0]["cursor"], f"oldest_cursor {first['oldest_cursor']!r}, first entry {evs[0]['cursor']!r}")
        expect(first["next_cursor"] == evs[-1]["cursor"], f"next_cursor {first['next_cursor']!r}, last entry {evs[-1]['cursor']!r}")
        after = await self._read_events(f"{self.event_uri}?after={first['next_cursor']}")
        problems = self._event_problems(after)
        expect(not problems, f"?after=: {'; '.join(problems)}")
        number = lambda e: int(str(e["event"]["raw_message"]).removeprefix("interop event "))
        old = {e["cursor"] for e in evs}
        newer = after["events"]
        expect(
            all(e["cursor"] not in old and number(e) > number(evs[-1]) for e in newer),
            f"?after= returned events at or before the cursor: {[number(e) for e in newer]} (last read {number(evs[-1])})",
        )
        return f"{len(evs)} events, then {len(newer)} newer after {first['next_cursor']}"

    async def c_resources_unsubscribe(self) -> str:
        assert self.client is not None and self.event_uri is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await self.client.unsubscribe_resource(self.event_uri)
        return await self._released()

    async def _released(self) -> str:
        assert self.client is not None and self.event_uri is not None
        try:
            read = await self.client.read_resource(self.event_uri)
        except MCPError as e:
            return f"released: resources/read answers {e}"
        raise CheckFailed(f"still readable after the release: {short(self._event_doc(read))}")

    async def c_listen(self) -> str:
        """subscriptions/listen with the uri: an update, reads, then close the stream."""
        assert self.client is not None and self.event_uri is not None
        uri = self.event_uri
        async with self.client.listen(resource_subscriptions=[uri]) as sub:
            honored = list(sub.honored.resource_subscriptions or [])
            expect(uri in honored, f"honored {short(sub.honored.model_dump(exclude_none=True))}")
            with anyio.fail_after(EVENT_WAIT_S):
                async for event in sub:
                    if isinstance(event, ResourceUpdated) and event.uri == uri:
                        break
            detail = f"subscription {sub.subscription_id!r} acknowledged {honored}, ResourceUpdated for the uri"
            await self.check("resources/read event resource with cursors (listening)", self.c_event_reads)
        # Closing the stream does not release the buffer.
        doc = self._event_doc(await self.client.read_resource(uri))
        expect((doc.get("status") or {}).get("state") == "connected", f"after close: status {short(doc.get('status'))}")
        return detail + "; closed, the resource is still readable"

    async def c_unsubscribe_events(self) -> str:
        assert self.event_uri is not None
        await self.call_ok("unsubscribe_events", {"uri": self.event_uri})
        return await self._released()

    async def run_events(self) -> None:
        if not await self.check(f"subscribe_events {{self_id:{self.self_id}}}", self.c_subscribe_events):
            return
        if self.era == "legacy":
            if not await self.check("resources/subscribe event resource", self.c_resources_subscribe):
                return
            await self.check("notifications/resources/updated", self.c_legacy_updated)
            await self.check("resources/read event resource with cursors", self.c_event_reads)
            await self.check("resources/unsubscribe releases the event resource", self.c_resources_unsubscribe)
        else:
            await self.check("subscriptions/listen resourceSubscriptions [uri]", self.c_listen)
            await self.check("unsubscribe_events releases the event resource", self.c_unsubscribe_events)

    # ---- the sequence --------------------------------------------------------

    # ---- checks: preview_message and its panel ---------------------------------

    async def c_preview_tool(self) -> str:
        assert self.client is not None
        tools = (await self.client.list_tools()).tools
        tool = next((t for t in tools if t.name == "preview_message"), None)
        expect(tool is not None, "preview_message is not listed")
        linked = [t.name for t in tools if (t.meta or {}).get("ui")]
        if self.ui:
            expect((tool.meta or {}).get("ui") == {"resourceUri": UI_URI}, f"_meta is {short(tool.meta)}")
            expect(linked == ["preview_message"], f"tools with _meta.ui: {linked}")
            return f"_meta.ui.resourceUri {UI_URI}"
        expect(not linked, f"tools with _meta.ui without the extension: {linked}")
        return "no _meta.ui"

    async def c_preview_resources(self) -> str:
        assert self.client is not None
        resources = (await self.client.list_resources()).resources
        ui = [r for r in resources if str(r.uri).startswith("ui://")]
        if not self.ui:
            expect(not ui, f"ui:// resources listed without the extension: {[str(r.uri) for r in ui]}")
            return "no ui:// resource"
        expect(len(ui) == 1 and str(ui[0].uri) == UI_URI and ui[0].mime_type == UI_MIME, f"ui resources {short(ui)}")
        read = await self.client.read_resource(UI_URI)
        expect(len(read.contents) == 1, f"{len(read.contents)} contents")
        c = read.contents[0]
        expect(c.mime_type == UI_MIME, f"mimeType {c.mime_type!r}")
        text = getattr(c, "text", None)
        expect(isinstance(text, str) and text.startswith("<!doctype html>"), "no HTML text")
        expect("connect-src 'none'" in text, "no Content-Security-Policy forbidding connections")
        csp = ((c.meta or {}).get("ui") or {}).get("csp")
        expect(csp == {"connectDomains": [], "resourceDomains": [], "frameDomains": [], "baseUriDomains": []}, f"csp {short(csp)}")
        return f"{len(text)} chars"

    async def c_preview_call(self) -> str:
        r = await self.call_ok("preview_message", PREVIEW_ARGS)
        can_send = self.mode == "write"
        expect(r.get("can_send") is can_send, f"can_send {r.get('can_send')!r} in {self.mode} mode ({r.get('send_blocked_by')!r})")
        want = {
            "action": "send_group_msg",
            "params": {"group_id": 20001, "message": [
                {"type": "reply", "data": {"id": "-123456"}},
                {"type": "text", "data": {"text": PREVIEW_ARGS["text"]}},
            ]},
        }
        expect(r.get("invoke_action") == want, f"invoke_action {short(r.get('invoke_action'))}")
        return f"can_send {can_send}"

    async def c_preview_bad(self) -> str:
        diag = await self.call_err("preview_message", {**PREVIEW_ARGS, "reply_to": 0})
        expect(diag.get("kind") == "invalid_arguments", f"kind {diag.get('kind')!r}")
        return str(diag.get("message"))

    async def run_preview(self) -> None:
        await self.check("tools/list preview_message _meta.ui", self.c_preview_tool)
        await self.check("resources/list and read of the panel", self.c_preview_resources)
        await self.check("preview_message", self.c_preview_call)
        await self.check("preview_message reply_to 0 -> tool error", self.c_preview_bad)

    async def run(self) -> None:
        if self.http is not None:
            self.http_mark = len(self.http.responses)  # this session's responses start here
            transport = tapped_http(self.http, self.sent, self.received)
        else:
            params = StdioServerParameters(
                command=self.env["__bin"], env={k: v for k, v in self.env.items() if not k.startswith("__")}
            )
            self.tap = StderrTap()
            transport = tapped_stdio(params, self.tap.writer, self.sent, self.received)
        client = Client(
            transport,
            mode=self.era,
            read_timeout_seconds=REQUEST_TIMEOUT_S,
            elicitation_callback=self.on_elicit,
            input_required_max_rounds=3,
            message_handler=self.on_message,
            extensions=[advertise(UI_EXTENSION, {"mimeTypes": [UI_MIME]})] if self.ui else None,
        )
        entered = False
        closing_started = None
        try:
            try:
                await client.__aenter__()
                entered = True
            except Exception as e:
                self.report.fail(self.name("connect"), describe(e))
                traceback.print_exc(file=sys.stderr)
                return
            finally:
                # The child holds its own copy now; ours would keep the pipe open forever.
                if self.tap is not None:
                    self.tap.close_writer()
            self.client = client
            await self.check("initialize" if self.era == "legacy" else "connect", self.c_connected)

            expected = set(DOC_TOOLS)
            if self.mode in ("read", "write"):
                expected.update(("query_action", "query_action_with_input"))
            if self.mode == "write":
                expected.update(("invoke_action", "invoke_action_with_input"))
            if self.events_url:
                expected.update(EVENT_TOOLS)
            if not await self.check(f"tools/list ({self.mode})", self.c_list_tools, expected):
                return
            if self.ui:
                await self.run_preview()
                closing_started = time.monotonic()
                return

            await self.check("list_actions {}", self.c_list_actions_all)
            await self.check("list_actions {limit:5}", self.c_list_actions_page)
            await self.check("get_action get_status", self.c_get_action)
            await self.check("search_actions 禁言 keywords", self.c_search_actions)
            await self.check("list_categories", self.c_list_categories)
            await self.check("get_runtime_info", self.c_runtime_info)
            await self.run_preview()
            if self.mode == "docs":
                await self.check("get_action unknown -> tool error", self.c_unknown_action)
                await self.check("list_actions bad limit -> tool error", self.c_bad_arguments)
                await self.check("resources/read catalog", self.c_resources_catalog)
                await self.check("resource template get_status", self.c_resource_template)
            if self.mode in ("read", "write"):
                await self.check("query_action get_status", self.c_query_status)
                await self.check("query_action get_cookies -> policy_denied", self.c_query_denied)
                await self.check("query_action send_group_msg -> refused", self.c_query_write_refused)
                if self.events_url:
                    await self.run_events()
            if self.mode == "write":
                await self.check("invoke_action send_group_msg -> business failure", self.c_invoke_business_failure)
                await self.check("invoke_action_with_input send_group_msg {group_id} -> elicitation", self.c_invoke_with_input)
                if self.env.get("SNOWLUMA_MCP_CONFIRM_ACTIONS"):
                    await self.check("invoke_action set_group_kick -> confirmation, keyed replay", self.c_confirm)
                await self.check("invoke_action download_file_stream", self.c_download)
                await self.check("cancel query_action get_group_list", self.c_cancel)
                await self.check("list_categories after cancel", self.c_after_cancel)
            closing_started = time.monotonic()
        finally:
            if entered:
                started = time.monotonic()
                try:
                    await client.__aexit__(None, None, None)
                except Exception as e:
                    extra = ""
                    if self.http is not None:
                        refused = [r for r in self.http.responses[self.http_mark :] if r[1] >= 400]
                        extra = f" (HTTP responses >= 400 in this session: {refused})" if refused else ""
                    self.report.fail(self.name("close"), describe(e) + extra)
                    traceback.print_exc(file=sys.stderr)
                    closing_started = None
                took = time.monotonic() - started
                if closing_started is not None:
                    await self._check_close(took)

    async def _check_close(self, took: float) -> None:
        """The server must exit by itself once its stdin closes, leaving nothing behind.
        Over HTTP: a legacy session must have been ended by an accepted DELETE."""
        if self.http is not None:
            mine = self.http.responses[self.http_mark :]
            deletes = [status for method, status in mine if method == "DELETE"]
            denied = [(m, st) for m, st in mine if st in (401, 403)]
            if denied:
                self.report.fail(self.name("close"), f"the server refused requests: {denied[:3]}")
            elif self.era == "legacy" and not deletes:
                self.report.fail(self.name("close"), "the legacy session was not ended with DELETE (no Mcp-Session-Id?)")
            elif any(status not in (200, 202, 204, 405) for status in deletes):
                self.report.fail(self.name("close"), f"DELETE answered {deletes}")
            else:
                how = f"DELETE answered {deletes[0]}" if deletes else "no session to end"
                self.report.ok(self.name("close"), f"{how}; closed in {took * 1000:.0f} ms")
            return
        assert self.tap is not None
        gone = await anyio.to_thread.run_sync(self.tap.wait_eof, 3.0)
        problems = []
        if took >= STDIO_GRACE_S - 0.05:
            problems.append(f"the server did not exit within {STDIO_GRACE_S:g} s of stdin closing (the SDK had to kill it; close took {took:.1f} s)")
        if not gone:
            problems.append("a server process still holds stderr open 3 s after close")
        bad = [l for l in self.tap.lines() if "fatal runtime error" in l or "panicked" in l]
        if bad:
            problems.append(f"server stderr: {short(bad[0], 200)}")
        if problems:
            self.report.fail(self.name("close"), "; ".join(problems))
        else:
            self.report.ok(self.name("close"), f"server exited on stdin EOF in {took * 1000:.0f} ms")


def build_env(mode: str, http: bool = False) -> tuple[dict[str, str], str | None]:
    binary = os.environ.get("SNOWLUMA_MCP_BIN", "")
    if not binary and not http:
        raise CheckFailed("SNOWLUMA_MCP_BIN is not set")
    # Exactly these; the SDK adds its default inherited set (HOME, LOGNAME,
    # PATH, SHELL, TERM, USER when present), as it does for every server.
    env = {"__bin": binary, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SNOWLUMA_MCP_MODE": mode}
    stream_dir = None
    if mode in ("read", "write"):
        endpoint = os.environ.get("INTEROP_ENDPOINT")
        if not endpoint:
            raise CheckFailed("INTEROP_ENDPOINT is not set")
        env["SNOWLUMA_MCP_ENDPOINT"] = endpoint
        events_url = os.environ.get("INTEROP_EVENTS_URL")
        if events_url:
            self_id = os.environ.get("INTEROP_SELF_ID", "")
            if not self_id.isdigit():
                raise CheckFailed(f"INTEROP_SELF_ID must be an integer with INTEROP_EVENTS_URL (got {self_id!r})")
            env["SNOWLUMA_MCP_EVENTS_URL"] = events_url
            env["__self_id"] = self_id
    if mode == "write":
        stream_dir = os.environ.get("INTEROP_STREAM_DIR")
        if not stream_dir or not os.path.isdir(stream_dir):
            raise CheckFailed(f"INTEROP_STREAM_DIR is not an existing directory: {stream_dir!r}")
        env["SNOWLUMA_MCP_STREAM_DIR"] = stream_dir
        confirm = os.environ.get("INTEROP_CONFIRM_ACTIONS")
        if confirm:
            env["SNOWLUMA_MCP_CONFIRM_ACTIONS"] = confirm
    return env, stream_dir


async def main_async(report: Report, mode: str) -> None:
    try:
        http = http_target(sys.argv[1:])
        env, stream_dir = build_env(mode, http is not None)
    except (CheckFailed, OSError) as e:
        report.fail("setup", str(e))
        return
    try:
        with anyio.fail_after(ASYNC_DEADLINE_S):
            for era in ("legacy", "auto"):
                await Run(report, mode, era, env, stream_dir, http).run()
            # The same eras once more, declaring the MCP Apps extension.
            for era in ("legacy", "auto"):
                await Run(report, mode, era, env, stream_dir, http, ui=True).run()
    except TimeoutError:
        report.fail("deadline", f"the run did not finish within {ASYNC_DEADLINE_S:g} s")


def main() -> int:
    mode = os.environ.get("INTEROP_MODE", "")
    report = Report(mode or "?")
    if mode not in ("docs", "read", "write"):
        report.fail("setup", f"INTEROP_MODE must be docs, read or write (got {mode!r})")
        return report.finish()

    def watchdog() -> None:
        report.fail("deadline", f"hard deadline of {HARD_DEADLINE_S:g} s reached; aborting")
        report.finish()
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(HARD_DEADLINE_S, watchdog)
    timer.daemon = True
    timer.start()
    try:
        anyio.run(main_async, report, mode)
    except BaseException as e:  # an escaped exception is a failure, never a hang or a silent pass
        report.fail("run", describe(e))
        traceback.print_exc(file=sys.stderr)
    finally:
        timer.cancel()
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
