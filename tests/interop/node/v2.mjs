// Interoperability client: the TypeScript MCP SDK v2 (@modelcontextprotocol/client,
// pinned in ../package.json) drives the real snowluma-mcp binary, spawned by
// the SDK's own StdioClientTransport (@modelcontextprotocol/client/stdio)
// exactly as hosts built on it do (Node's child_process: socketpairs).
//
// Protocol era: pinned to the modern era, revision 2026-07-28, with the
// client option `versionNegotiation: { mode: { pin: '2026-07-28' } }`
// (ClientOptions.versionNegotiation in the package's client .d.mts: the
// default mode is 'legacy', i.e. a plain 2025 `initialize`; a pin makes
// connect() open with `server/discover` and requires the server to offer
// exactly that revision, with no fallback). The initialize check also
// asserts client.getNegotiatedProtocolVersion() === '2026-07-28'.
//
// Input completion (write mode): the client declares form elicitation and
// registers an `elicitation/create` handler (common.mjs
// inputCompletionHandler). On the 2026-07-28 era the server never sends that
// request itself: it answers tools/call with `resultType: "input_required"`
// and the SDK's multi-round-trip driver (ClientOptions.inputRequired,
// auto-fulfilment on by default) runs the same handler, then retries the call
// with `inputResponses` and the byte-exact `requestState`; callTool() only
// returns the final result.
//
// Live event resources (read mode, with INTEROP_EVENTS_URL): subscribe_events,
// client.listen({resourceSubscriptions: [uri]}) (subscriptions/listen),
// notifications/resources/updated, reads with cursors, closing the stream,
// unsubscribe_events (common.mjs runEvents).
//
// Run from the repository root after tests/interop/setup.sh:
//   SNOWLUMA_MCP_BIN=$PWD/target/debug/snowluma-mcp INTEROP_MODE=docs node tests/interop/node/v2.mjs
//   (read/write modes also need INTEROP_ENDPOINT=<fake URL>; write also
//   INTEROP_STREAM_DIR=<empty absolute dir>; see common.mjs and
//   tests/tests/interop.rs).
//
// Over Streamable HTTP, against a running `snowluma-mcp serve-http` started
// with the same mode (tests/tests/http_interop.rs):
//   INTEROP_MODE=docs SNOWLUMA_TEST_HTTP_TOKEN_FILE=<token file> \
//     node tests/interop/node/v2.mjs --http http://127.0.0.1:PORT/mcp
//   (or --http-token-file FILE; http.mjs). The SDK's own
//   StreamableHTTPClientTransport with requestInit.headers.Authorization,
//   the same 2026-07-28 pin (every request carries its own _meta; no session).

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import {
    Checks, REQUEST_TIMEOUT_MS, childExit, errorText, inputCompletionHandler, installGuards, readConfig, runPreviewUiSession, runScenario, serverEnv, UI_CAPABILITIES,
    withTimeout,
} from './common.mjs';
import { httpTarget } from './http.mjs';

const PROTOCOL = '2026-07-28';

const overHttp = process.argv.includes('--http') || process.argv.some((a) => a.startsWith('--http='));
const checks = new Checks(overHttp ? 'ts-sdk-v2-http' : 'ts-sdk-v2', process.env.INTEROP_MODE ?? '?');
let transport;
installGuards(checks, () => transport?._process?.kill('SIGKILL'));

let cfg;
let target;
try {
    target = httpTarget();
    cfg = readConfig({ http: target !== undefined });
} catch (err) {
    checks.fail('environment', errorText(err));
    checks.finish();
}

const client = new Client(
    { name: 'snowluma-interop-ts-sdk-v2', version: '1.0.0' },
    {
        capabilities: { elicitation: { form: {} } },
        versionNegotiation: { mode: { pin: PROTOCOL }, probe: { timeoutMs: REQUEST_TIMEOUT_MS } },
        inputRequired: { maxRounds: 3 },
    },
);
// The params of every elicitation the handler answered (MRTR rounds included).
const elicitations = [];
client.setRequestHandler('elicitation/create', inputCompletionHandler(elicitations));
// Errors the SDK reports outside any request's promise (see common.mjs).
const clientErrors = [];
client.onerror = (err) => {
    clientErrors.push(err);
    process.stderr.write(`v2 client error: ${errorText(err)}\n`);
};
// The client's default stdio transport: no args, stderr inherited (the
// server's log goes to this script's stderr).
// Over HTTP: the SDK's Streamable HTTP transport, the bearer token as a
// request header on every request.
transport = target
    ? new StreamableHTTPClientTransport(target.url, { requestInit: { headers: target.headers } })
    : new StdioClientTransport({ command: cfg.bin, args: [], env: serverEnv(cfg) });
const opts = (extra = {}) => ({ timeout: REQUEST_TIMEOUT_MS, ...extra });
let exited;
// Live event resources (when the harness sets INTEROP_EVENTS_URL): the
// params of every notifications/resources/updated, delivered on a
// subscriptions/listen stream opened with client.listen() (the SDK
// dispatches the stream's notifications to these handlers).
const updates = [];
client.setNotificationHandler('notifications/resources/updated', (n) => { updates.push(n.params); });
const events = {
    updates: () => updates,
    listen: async (uri) => {
        const sub = await client.listen({ resourceSubscriptions: [uri] }, opts());
        return { honored: sub.honoredFilter, close: () => sub.close(), closed: sub.closed };
    },
};

await runScenario(checks, cfg, {
    connect: async () => {
        await client.connect(transport, opts());
        // The ChildProcess (a private field of the transport): to tell, at
        // close, whether the server exited by itself on stdin EOF.
        if (!target) exited = childExit(transport._process);
    },
    serverInfo: () => client.getServerVersion(),
    protocolVersion: () => client.getNegotiatedProtocolVersion(),
    listTools: () => client.listTools(undefined, opts()),
    callTool: (name, args, extra) => client.callTool({ name, arguments: args }, opts(extra)),
    listResources: () => client.listResources(undefined, opts()),
    listResourceTemplates: () => client.listResourceTemplates(undefined, opts()),
    readResource: (uri) => client.readResource({ uri }, opts()),
    errors: () => clientErrors,
    elicitations: () => elicitations,
    events,
    close: async () => {
        const started = Date.now();
        if (target) {
            // 2026-07-28 has no session to end: closing the client closes
            // its open streams (a DELETE only if the server gave a session).
            const session = transport.sessionId;
            if (session) await transport.terminateSession();
            await client.close();
            return { detail: `${session ? 'session ended with DELETE' : 'no session (per-request _meta)'}, closed after ${Date.now() - started} ms` };
        }
        await client.close();
        const { exitCode, signal } = await exited;
        return { exitCode, signal, ms: Date.now() - started };
    },
}, { expectProtocol: PROTOCOL, inputCompletion: true });
// After a failed run the server may still be up: stop it (a no-op after close).
await withTimeout(transport.close(), 5_000, 'transport close').catch(() => {});
// A second session whose client declares the MCP Apps extension: the
// preview tool links its panel and the ui:// resource is listed and read
// (common.mjs runPreviewUiSession).
const uiClient = new Client(
    { name: 'snowluma-interop-ts-sdk-v2-ui', version: '1.0.0' },
    { capabilities: UI_CAPABILITIES, versionNegotiation: { mode: { pin: PROTOCOL }, probe: { timeoutMs: REQUEST_TIMEOUT_MS } } },
);
// Over HTTP the UI session is a second HTTP session (ended with DELETE).
const uiTransport = target
    ? new StreamableHTTPClientTransport(target.url, { requestInit: { headers: target.headers } })
    : new StdioClientTransport({ command: cfg.bin, args: [], env: serverEnv(cfg) });
let uiExited;
await runPreviewUiSession(checks, cfg, {
    connect: async () => {
        await uiClient.connect(uiTransport, opts());
        if (!target) uiExited = childExit(uiTransport._process);
    },
    listTools: () => uiClient.listTools(undefined, opts()),
    callTool: (name, args) => uiClient.callTool({ name, arguments: args }, opts()),
    listResources: () => uiClient.listResources(undefined, opts()),
    readResource: (uri) => uiClient.readResource({ uri }, opts()),
    close: async () => {
        await uiClient.close();
        return uiExited;
    },
});
await withTimeout(uiTransport.close(), 5_000, 'transport close').catch(() => {});
checks.finish();
