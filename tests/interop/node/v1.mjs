// Interoperability client: the TypeScript MCP SDK v1 (@modelcontextprotocol/sdk,
// pinned in ../package.json) drives the real snowluma-mcp binary, spawned by
// the SDK's own StdioClientTransport exactly as hosts built on it do (Node's
// child_process, so the server's stdin and stdout are socketpairs).
//
// Run from the repository root after tests/interop/setup.sh:
//   SNOWLUMA_MCP_BIN=$PWD/target/debug/snowluma-mcp INTEROP_MODE=docs node tests/interop/node/v1.mjs
//   (read/write modes also need INTEROP_ENDPOINT=<fake URL>; write also
//   INTEROP_STREAM_DIR=<empty absolute dir>; see common.mjs and
//   tests/tests/interop.rs).
//
// Over Streamable HTTP, against a running `snowluma-mcp serve-http` started
// with the same mode (tests/tests/http_interop.rs):
//   INTEROP_MODE=docs SNOWLUMA_TEST_HTTP_TOKEN_FILE=<token file> \
//     node tests/interop/node/v1.mjs --http http://127.0.0.1:PORT/mcp
//   (or --http-token-file FILE; http.mjs). The SDK's own
//   StreamableHTTPClientTransport with requestInit.headers.Authorization;
//   the session ends with the SDK's terminateSession() (HTTP DELETE).
//
// The v1 client validates structuredContent against the tool's outputSchema
// once it has listed the tools, error results included, and throws when it
// does not match; the scenario lists tools before calling any.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, ResourceUpdatedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import {
    Checks, REQUEST_TIMEOUT_MS, UI_CAPABILITIES, childExit, errorText, expect, installGuards, readConfig, runPreviewUiSession,
    runScenario, serverEnv, withTimeout,
} from './common.mjs';
import { httpTarget } from './http.mjs';

const overHttp = process.argv.includes('--http') || process.argv.some((a) => a.startsWith('--http='));
const checks = new Checks(overHttp ? 'ts-sdk-v1-http' : 'ts-sdk-v1', process.env.INTEROP_MODE ?? '?');
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

const client = new Client({ name: 'snowluma-interop-ts-sdk-v1', version: '1.0.0' }, { capabilities: {} });
// The client's default stdio transport: no args, stderr inherited (the
// server's log goes to this script's stderr).
// Over HTTP: the SDK's Streamable HTTP transport, the bearer token as a
// request header on every request (POST, GET stream, DELETE).
transport = target
    ? new StreamableHTTPClientTransport(target.url, { requestInit: { headers: target.headers } })
    : new StdioClientTransport({ command: cfg.bin, args: [], env: serverEnv(cfg) });
// Errors the SDK reports outside any request's promise (see common.mjs).
const clientErrors = [];
client.onerror = (err) => {
    clientErrors.push(err);
    process.stderr.write(`v1 client error: ${errorText(err)}\n`);
};
// v1 keeps the negotiated version only in transports that take it (HTTP);
// this hook, which the client calls after initialize, records it for the log.
// (The HTTP transport needs it for its MCP-Protocol-Version header: wrapped.)
let negotiated;
const setProtocolVersion = transport.setProtocolVersion?.bind(transport);
transport.setProtocolVersion = (version) => {
    negotiated = version;
    if (target) setProtocolVersion(version);
};
const opts = (extra = {}) => ({ timeout: REQUEST_TIMEOUT_MS, ...extra });
let exited;
// Live event resources (when the harness sets INTEROP_EVENTS_URL), the
// 2025 way: resources/subscribe, notifications/resources/updated,
// resources/unsubscribe (common.mjs runEvents).
const updates = [];
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => { updates.push(n.params); });
const events = {
    updates: () => updates,
    subscribe: (uri) => client.subscribeResource({ uri }, opts()),
    unsubscribe: (uri) => client.unsubscribeResource({ uri }, opts()),
};

await runScenario(checks, cfg, {
    connect: async () => {
        await client.connect(transport, opts());
        // The ChildProcess (a private field of the transport): to tell, at
        // close, whether the server exited by itself on stdin EOF.
        if (!target) exited = childExit(transport._process);
    },
    serverInfo: () => client.getServerVersion(),
    protocolVersion: () => negotiated,
    listTools: () => client.listTools({}, opts()),
    callTool: (name, args, extra) => client.callTool({ name, arguments: args }, CallToolResultSchema, opts(extra)),
    listResources: () => client.listResources({}, opts()),
    listResourceTemplates: () => client.listResourceTemplates({}, opts()),
    readResource: (uri) => client.readResource({ uri }, opts()),
    errors: () => clientErrors,
    events,
    close: async () => {
        const started = Date.now();
        if (target) {
            // The session ends explicitly (HTTP DELETE with Mcp-Session-Id;
            // the SDK accepts 2xx and 405), then the transport closes.
            const session = transport.sessionId;
            expect(typeof session === 'string' && session !== '', 'the server gave the 2025 session no Mcp-Session-Id');
            await transport.terminateSession();
            await client.close();
            return { detail: `session ended with DELETE after ${Date.now() - started} ms` };
        }
        await client.close();
        const { exitCode, signal } = await exited;
        return { exitCode, signal, ms: Date.now() - started };
    },
});
// After a failed run the server may still be up: stop it (a no-op after close).
await withTimeout(transport.close(), 5_000, 'transport close').catch(() => {});
// A second session whose client declares the MCP Apps extension: the
// preview tool links its panel and the ui:// resource is listed and read
// (common.mjs runPreviewUiSession).
const uiClient = new Client({ name: 'snowluma-interop-ts-sdk-v1-ui', version: '1.0.0' }, { capabilities: UI_CAPABILITIES });
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
    listTools: () => uiClient.listTools({}, opts()),
    callTool: (name, args) => uiClient.callTool({ name, arguments: args }, CallToolResultSchema, opts()),
    listResources: () => uiClient.listResources({}, opts()),
    readResource: (uri) => uiClient.readResource({ uri }, opts()),
    close: async () => {
        if (target) await uiTransport.terminateSession();
        await uiClient.close();
        return uiExited;
    },
});
await withTimeout(uiTransport.close(), 5_000, 'transport close').catch(() => {});
checks.finish();
