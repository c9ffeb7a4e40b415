// Shared helpers of the Node interoperability clients (v1.mjs, v2.mjs,
// inspector.mjs): the environment contract with tests/tests/interop.rs,
// check bookkeeping, the overall deadline, JSON Schema validation with ajv,
// and the scenario both TypeScript SDK clients run (through a small adapter,
// so that each script keeps its own SDK's calling conventions).
//
// Output contract: one line per check on stdout, `ok <name>` or
// `FAIL <name>: <reason>`, then `<client> <mode>: N checks passed, M failed`;
// exit status 0 iff every check passed.

import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';

const addFormats = addFormatsModule.default ?? addFormatsModule;

/** Overall budget of one script run, in ms (the harness runs each script once per mode). */
export const DEADLINE_MS = 90_000;
/** Budget of one MCP request, in ms. */
export const REQUEST_TIMEOUT_MS = 20_000;

export const DOCS_TOOLS = ['list_actions', 'get_action', 'search_actions', 'list_categories', 'get_runtime_info', 'preview_message'];
export const ACTION_COUNT = 193;
export const ACTIONS_URI = 'snowluma://onebot/actions';
export const ACTION_TEMPLATE = 'snowluma://onebot/actions/{name}';
export const INTEROP_FILE = 'interop.bin';
export const INTEROP_FILE_BYTES = 262_144;

export const EVENT_TOOLS = ['subscribe_events', 'unsubscribe_events'];
export const EVENTS_URI_PREFIX = 'snowluma://onebot/events/';
/** The fields of an event resource's read (README, "Live event resources"). */
export const EVENT_READ_FIELDS = ['dropped_events', 'events', 'gap', 'next_cursor', 'notification_failed', 'oldest_cursor', 'status'];
/** How long to wait for the fake's injected events (one every 200 ms) and their notifications. */
export const EVENT_WAIT_MS = 10_000;

/** The tools the server must list in `mode` (`events`: SNOWLUMA_MCP_EVENTS_URL is set). */
export function expectedTools(mode, events = false) {
    if (mode === 'docs') return [...DOCS_TOOLS];
    const ev = events ? EVENT_TOOLS : [];
    if (mode === 'read') return [...DOCS_TOOLS, 'query_action', 'query_action_with_input', ...ev];
    return [...DOCS_TOOLS, 'query_action', 'invoke_action', 'query_action_with_input', 'invoke_action_with_input', ...ev];
}

/**
 * Input completion: the call whose missing field the server asks for, and
 * the answer the clients' elicitation handlers give (tests/tests/interop.rs
 * looks for exactly this merged request at the fake).
 */
export const INPUT_CALL = { action: 'send_group_msg', params: { group_id: 20001 } };
export const INPUT_ANSWER = { message: 'Hello' };

/**
 * An `elicitation/create` handler for the input-completion form: records
 * the request's params in `seen` and accepts with `params_json` holding
 * INPUT_ANSWER (a non-form request is declined).
 */
export function inputCompletionHandler(seen) {
    return async (request) => {
        const params = request.params ?? {};
        seen.push(params);
        if ((params.mode ?? 'form') !== 'form') return { action: 'decline' };
        // A confirmation (SNOWLUMA_MCP_CONFIRM_ACTIONS): one boolean field `confirm`.
        if (params.requestedSchema?.properties?.confirm?.type === 'boolean') {
            return { action: 'accept', content: { confirm: true } };
        }
        return { action: 'accept', content: { params_json: JSON.stringify(INPUT_ANSWER) } };
    };
}

/** The confirmed call (write mode with INTEROP_CONFIRM_ACTIONS=set_group_kick), keyed. */
export const CONFIRM_CALL = {
    action: 'set_group_kick',
    params: { group_id: 20001, user_id: 30001 },
    execution: { idempotency_key: 'interop-kick-1' },
};

/** Problems with the form of a confirmation (empty when it is as specified). */
export function confirmFormProblems(params) {
    const problems = [];
    const message = typeof params?.message === 'string' ? params.message : '';
    if (!message.includes('set_group_kick')) problems.push(`the message does not name set_group_kick: ${JSON.stringify(message)}`);
    if (!message.includes('{"group_id":20001,"user_id":30001}')) problems.push(`the message does not show the exact params: ${JSON.stringify(message)}`);
    if (!message.includes('SNOWLUMA_MCP_CONFIRM_ACTIONS')) problems.push('the message does not name SNOWLUMA_MCP_CONFIRM_ACTIONS');
    const schema = params?.requestedSchema ?? {};
    const props = Object.keys(schema.properties ?? {});
    if (schema.type !== 'object' || props.length !== 1 || schema.properties.confirm?.type !== 'boolean') {
        problems.push(`requestedSchema is not one boolean field confirm: ${JSON.stringify(schema)}`);
    }
    return problems;
}

/** Problems with the form of an input-completion elicitation (empty when it is as specified). */
export function inputFormProblems(params) {
    const problems = [];
    const message = typeof params?.message === 'string' ? params.message : '';
    if (!message.includes('send_group_msg')) problems.push(`the message does not name send_group_msg: ${JSON.stringify(message)}`);
    if (!message.includes('message')) problems.push(`the message does not name the missing field: ${JSON.stringify(message)}`);
    const schema = params?.requestedSchema ?? {};
    const props = Object.keys(schema.properties ?? {});
    if (schema.type !== 'object' || props.length !== 1 || props[0] !== 'params_json' || schema.properties.params_json.type !== 'string') {
        problems.push(`requestedSchema is not one string field params_json: ${JSON.stringify(schema)}`);
    }
    if (JSON.stringify(schema.required) !== '["params_json"]') problems.push(`required is ${JSON.stringify(schema.required)}`);
    return problems;
}

/** The bytes the fake serves for interop.bin: byte i is i % 251. */
export function expectedFileBytes() {
    const bytes = Buffer.alloc(INTEROP_FILE_BYTES);
    for (let i = 0; i < bytes.length; i++) bytes[i] = i % 251;
    return bytes;
}

export function sha256Hex(bytes) {
    return createHash('sha256').update(bytes).digest('hex');
}

/**
 * The run's configuration from the environment the harness sets. Throws a
 * readable Error when it is incomplete.
 */
export function readConfig({ http = false } = {}) {
    const bin = process.env.SNOWLUMA_MCP_BIN;
    const mode = process.env.INTEROP_MODE;
    const endpoint = process.env.INTEROP_ENDPOINT;
    const streamDir = process.env.INTEROP_STREAM_DIR;
    // Over HTTP (--http, see http.mjs) the harness runs `serve-http` itself
    // with the same mode, endpoint and stream directory: no binary here.
    if (!http) {
        if (!bin) throw new Error('SNOWLUMA_MCP_BIN is not set (absolute path of the snowluma-mcp binary)');
        if (!path.isAbsolute(bin)) throw new Error(`SNOWLUMA_MCP_BIN must be an absolute path, got ${bin}`);
    }
    if (!['docs', 'read', 'write'].includes(mode)) throw new Error(`INTEROP_MODE must be docs, read or write, got ${JSON.stringify(mode)}`);
    if (mode !== 'docs' && !endpoint) throw new Error(`INTEROP_ENDPOINT is required in ${mode} mode`);
    if (mode === 'write') {
        if (!streamDir) throw new Error('INTEROP_STREAM_DIR is required in write mode');
        if (!path.isAbsolute(streamDir) || !fs.statSync(streamDir).isDirectory()) {
            throw new Error(`INTEROP_STREAM_DIR must be an existing absolute directory, got ${streamDir}`);
        }
    }
    // Live event resources (optional): the fake's event WebSocket and the
    // account its events carry (the fake's get_login_info user_id).
    const eventsUrl = process.env.INTEROP_EVENTS_URL || undefined;
    // Actions the server confirms first (SNOWLUMA_MCP_CONFIRM_ACTIONS), write mode.
    const confirmActions = process.env.INTEROP_CONFIRM_ACTIONS || undefined;
    const selfId = eventsUrl ? Number(process.env.INTEROP_SELF_ID) : undefined;
    if (eventsUrl && mode === 'docs') throw new Error('INTEROP_EVENTS_URL needs read or write mode');
    if (eventsUrl && !Number.isSafeInteger(selfId)) throw new Error(`INTEROP_SELF_ID must be an integer, got ${process.env.INTEROP_SELF_ID}`);
    return { bin, mode, endpoint, streamDir, eventsUrl, selfId, http, confirmActions };
}

/**
 * The server's environment, exactly: PATH, the mode, and the endpoint and
 * stream directory where the mode uses them. (The SDKs' stdio transports add
 * their own short list of inherited variables, HOME, USER and the like, as
 * they do for every host.)
 */
export function serverEnv(cfg) {
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', SNOWLUMA_MCP_MODE: cfg.mode };
    if (cfg.mode !== 'docs') env.SNOWLUMA_MCP_ENDPOINT = cfg.endpoint;
    if (cfg.mode === 'write') env.SNOWLUMA_MCP_STREAM_DIR = cfg.streamDir;
    if (cfg.eventsUrl) env.SNOWLUMA_MCP_EVENTS_URL = cfg.eventsUrl;
    if (cfg.confirmActions) env.SNOWLUMA_MCP_CONFIRM_ACTIONS = cfg.confirmActions;
    return env;
}

function oneLine(text) {
    return String(text).replace(/\s+/g, ' ').trim();
}

export function errorText(err) {
    if (err instanceof Error) {
        const code = err.code !== undefined ? ` (code ${err.code})` : '';
        return oneLine(`${err.name}: ${err.message}${code}`);
    }
    return oneLine(JSON.stringify(err) ?? String(err));
}

/** Check bookkeeping and the final summary line. */
export class Checks {
    constructor(client, mode) {
        this.client = client;
        this.mode = mode;
        this.passed = 0;
        this.failed = 0;
        this.finished = false;
    }

    ok(name) {
        this.passed++;
        process.stdout.write(`ok ${oneLine(name)}\n`);
    }

    fail(name, reason) {
        this.failed++;
        process.stdout.write(`FAIL ${oneLine(name)}: ${oneLine(reason)}\n`);
    }

    /**
     * Run one check: `fn` returns nothing (ok), a string (ok, appended to the
     * name as detail) or throws (FAIL with the error's message). Returns
     * whether it passed.
     */
    async check(name, fn) {
        try {
            const detail = await fn();
            this.ok(typeof detail === 'string' && detail !== '' ? `${name} (${detail})` : name);
            return true;
        } catch (err) {
            this.fail(name, err instanceof CheckFailure ? err.message : errorText(err));
            return false;
        }
    }

    /** Print the summary and exit (0 iff all passed and at least one check ran). */
    finish() {
        if (this.finished) return;
        this.finished = true;
        if (this.passed + this.failed === 0) this.fail('checks ran', 'no check ran');
        process.stdout.write(`${this.client} ${this.mode}: ${this.passed} checks passed, ${this.failed} failed\n`);
        process.exit(this.failed === 0 ? 0 : 1);
    }
}

/** A failed expectation (its message is the FAIL reason as it stands). */
export class CheckFailure extends Error {}

export function expect(cond, reason) {
    if (!cond) throw new CheckFailure(reason);
}

/**
 * Fail and exit when the whole run exceeds DEADLINE_MS, and on anything
 * thrown outside a check. `cleanup` (optional, sync) kills what the script
 * started.
 */
export function installGuards(checks, cleanup = () => {}) {
    const timer = setTimeout(() => {
        checks.fail('deadline', `the script did not finish within ${DEADLINE_MS / 1000} s`);
        try { cleanup(); } catch { /* exiting anyway */ }
        checks.finish();
    }, DEADLINE_MS);
    const bail = (what) => (err) => {
        checks.fail(what, errorText(err));
        try { cleanup(); } catch { /* exiting anyway */ }
        checks.finish();
    };
    process.on('uncaughtException', bail('uncaught exception'));
    process.on('unhandledRejection', bail('unhandled rejection'));
    return timer;
}

/** Reject after `ms` with a readable error unless `promise` settles first. */
export function withTimeout(promise, ms, what) {
    let timer;
    const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new CheckFailure(`${what}: no answer within ${ms} ms`)), ms);
    });
    return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// ---------------------------------------------------------------- schemas --

/**
 * An ajv instance for tool schemas. MCP's default dialect for tool schemas
 * is JSON Schema 2020-12, so Ajv2020; ajv's default strict mode stays on, so
 * a schema with an unknown keyword does not compile.
 */
export function makeAjv() {
    const ajv = new Ajv2020({ allErrors: true });
    addFormats(ajv);
    return ajv;
}

function ajvErrors(validate) {
    return (validate.errors ?? []).map((e) => `${e.instancePath || '/'} ${e.message}`).join('; ');
}

/** Compile every tool's inputSchema and outputSchema; returns Map name -> validate(outputSchema). */
export function compileToolSchemas(ajv, tools) {
    const validators = new Map();
    const problems = [];
    for (const tool of tools) {
        try {
            ajv.compile(tool.inputSchema);
        } catch (err) {
            problems.push(`${tool.name}: inputSchema does not compile: ${errorText(err)}`);
        }
        if (tool.outputSchema === undefined) {
            problems.push(`${tool.name}: no outputSchema`);
            continue;
        }
        try {
            validators.set(tool.name, ajv.compile(tool.outputSchema));
        } catch (err) {
            problems.push(`${tool.name}: outputSchema does not compile: ${errorText(err)}`);
        }
    }
    return { validators, problems };
}

const OUTCOMES = ['success', 'failed', 'unknown'];

/**
 * The checks every tools/call result gets: structuredContent is present,
 * valid against the tool's advertised outputSchema (ajv), shaped
 * {result, diagnostics:{outcome, kind?, message?, next_step?}}, and an
 * isError result has result null and a failed/unknown outcome. Returns the
 * list of problems (empty when all hold).
 */
export function resultProblems(validators, tool, res) {
    const problems = [];
    if (res === null || typeof res !== 'object') return [`the result is not an object: ${JSON.stringify(res)}`];
    const sc = res.structuredContent;
    if (sc === undefined || sc === null || typeof sc !== 'object' || Array.isArray(sc)) {
        return [`no structuredContent object (content: ${JSON.stringify(res.content)?.slice(0, 200)})`];
    }
    const validate = validators.get(tool);
    if (!validate) problems.push(`no compiled outputSchema for ${tool}`);
    else if (!validate(sc)) problems.push(`structuredContent does not match ${tool}'s outputSchema (ajv): ${ajvErrors(validate)}`);
    if (!('result' in sc)) problems.push('structuredContent has no result');
    const d = sc.diagnostics;
    if (d === null || typeof d !== 'object') {
        problems.push('structuredContent has no diagnostics object');
    } else {
        if (!OUTCOMES.includes(d.outcome)) problems.push(`diagnostics.outcome is ${JSON.stringify(d.outcome)}`);
        for (const key of ['kind', 'message', 'next_step']) {
            if (key in d && typeof d[key] !== 'string') problems.push(`diagnostics.${key} is not a string`);
        }
    }
    if (res.isError === true) {
        if (sc.result !== null) problems.push(`isError but result is not null: ${JSON.stringify(sc.result)?.slice(0, 120)}`);
        if (d && d.outcome === 'success') problems.push('isError but diagnostics.outcome is success');
    }
    if (!Array.isArray(res.content) || res.content.length === 0) problems.push('no content blocks');
    return problems;
}

// --------------------------------------------------------------- scenario --

/**
 * The scenario of the TypeScript SDK clients. `client` adapts one SDK:
 *   connect(), serverInfo(), protocolVersion(), listTools(),
 *   callTool(name, args, {onprogress?, signal?}), listResources(),
 *   listResourceTemplates(), readResource(uri), close() -> {exitCode, signal, ms}
 *     (over HTTP, cfg.http: {detail}, a description of how the session ended),
 *   errors() -> the errors the SDK reported through its onerror hook,
 *   elicitations() (optional) -> the params of every elicitation/create its
 *     handler (inputCompletionHandler) answered
 * Every call is bounded by REQUEST_TIMEOUT_MS (the adapters pass it to the
 * SDK; withTimeout is the backstop). With `inputCompletion` (a client that
 * handles elicitation), write mode also completes INPUT_CALL through
 * invoke_action_with_input.
 */
export async function runScenario(checks, cfg, client, { expectProtocol, inputCompletion = false } = {}) {
    const ajv = makeAjv();
    let validators = new Map();
    const T = (p, what) => withTimeout(p, REQUEST_TIMEOUT_MS + 5_000, what);

    const connected = await checks.check('initialize', async () => {
        await T(client.connect(), 'connect');
        const info = client.serverInfo();
        expect(info?.name === 'snowluma-mcp', `serverInfo.name is ${JSON.stringify(info?.name)}, expected "snowluma-mcp"`);
        const version = client.protocolVersion();
        if (expectProtocol) expect(version === expectProtocol, `negotiated protocol ${version}, expected ${expectProtocol}`);
        return `serverInfo ${info.name} ${info.version}${version ? `, protocol ${version}` : ''}`;
    });
    if (!connected) return;

    // tools/list comes first: the SDKs only validate structuredContent
    // against outputSchema for tools they have listed.
    await checks.check('tools/list', async () => {
        const { tools } = await T(client.listTools(), 'tools/list');
        const names = tools.map((t) => t.name);
        const want = expectedTools(cfg.mode, Boolean(cfg.eventsUrl));
        const missing = want.filter((n) => !names.includes(n));
        const extra = names.filter((n) => !want.includes(n));
        const compiled = compileToolSchemas(ajv, tools);
        validators = compiled.validators;
        const problems = [];
        if (missing.length) problems.push(`missing ${missing.join(', ')}`);
        if (extra.length) problems.push(`unexpected ${extra.join(', ')}`);
        problems.push(...compiled.problems);
        expect(problems.length === 0, problems.join('; '));
        return `${names.length} tools, every inputSchema and outputSchema compiles`;
    });

    /**
     * One tools/call as a check: the common result checks plus `verify(res)`
     * (throws via expect; may return a detail string). A client that throws
     * instead of returning the tool result is a FAIL with its message.
     */
    const call = (label, name, args, verify = () => {}, opts = {}) =>
        checks.check(label, async () => {
            let res;
            try {
                res = await T(client.callTool(name, args, opts), `tools/call ${name}`);
            } catch (err) {
                throw new CheckFailure(`the client threw instead of returning the tool result: ${errorText(err)}`);
            }
            const problems = resultProblems(validators, name, res);
            expect(problems.length === 0, problems.join('; '));
            return verify(res, res.structuredContent);
        });

    const success = (res, sc) => {
        expect(res.isError !== true, `isError is true: ${JSON.stringify(sc.diagnostics)}`);
        expect(sc.diagnostics.outcome === 'success', `diagnostics.outcome is ${sc.diagnostics.outcome}: ${JSON.stringify(sc.diagnostics)}`);
    };

    // ---- the documentation tools (every mode)
    await call('tools/call list_actions {}', 'list_actions', {}, (res, sc) => {
        success(res, sc);
        expect(sc.result.actions.length === ACTION_COUNT, `${sc.result.actions.length} actions, expected ${ACTION_COUNT}`);
        expect(sc.result.count === ACTION_COUNT, `count is ${sc.result.count}`);
        return `${sc.result.count} actions`;
    });
    await call('tools/call list_actions {limit:5}', 'list_actions', { limit: 5 }, (res, sc) => {
        success(res, sc);
        expect(sc.result.actions.length === 5, `${sc.result.actions.length} actions, expected 5`);
        expect(sc.result.next_offset === 5, `next_offset is ${JSON.stringify(sc.result.next_offset)}, expected 5`);
        return `5 actions, next_offset 5, total ${sc.result.total}`;
    });
    await call('tools/call get_action {name:"get_status"}', 'get_action', { name: 'get_status' }, (res, sc) => {
        success(res, sc);
        expect(sc.result?.name === 'get_status', `result.name is ${JSON.stringify(sc.result?.name)}`);
    });
    await call('tools/call search_actions {query:"禁言",match:"keywords"}', 'search_actions', { query: '禁言', match: 'keywords' }, (res, sc) => {
        success(res, sc);
        const actions = sc.result.actions;
        expect(Array.isArray(actions) && actions.length > 0, 'no result');
        return `${actions.length} results, first ${actions[0].name}`;
    });
    await call('tools/call list_categories {}', 'list_categories', {}, (res, sc) => {
        success(res, sc);
        expect(Array.isArray(sc.result) && sc.result.length > 0, 'no categories');
        const total = sc.result.reduce((n, c) => n + c.count, 0);
        expect(total === ACTION_COUNT, `the category counts add up to ${total}, expected ${ACTION_COUNT}`);
        return `${sc.result.length} categories`;
    });
    await call('tools/call get_runtime_info {}', 'get_runtime_info', {}, (res, sc) => {
        success(res, sc);
        expect(sc.result.mode === cfg.mode, `result.mode is ${JSON.stringify(sc.result.mode)}, expected ${cfg.mode}`);
        return `mode ${sc.result.mode}`;
    });

    // ---- error paths: tool results, not thrown
    await call('tools/call get_action {name:"no_such_action"} is a tool error', 'get_action', { name: 'no_such_action' }, (res, sc) => {
        expect(res.isError === true, 'isError is not true');
        expect(sc.result === null, 'result is not null');
        expect(sc.diagnostics.kind === 'unknown_action', `diagnostics.kind is ${JSON.stringify(sc.diagnostics.kind)}, expected unknown_action`);
        expect(typeof sc.diagnostics.next_step === 'string' && sc.diagnostics.next_step.trim() !== '', 'no next_step');
        return `kind ${sc.diagnostics.kind}`;
    });
    await call('tools/call list_actions {limit:"ten"} is a tool error', 'list_actions', { limit: 'ten' }, (res, sc) => {
        expect(res.isError === true, 'isError is not true');
        expect(sc.result === null, 'result is not null');
        expect(typeof sc.diagnostics.next_step === 'string' && sc.diagnostics.next_step.trim() !== '', 'no next_step');
        return `kind ${sc.diagnostics.kind}`;
    });

    // ---- resources
    await checks.check('resources/list', async () => {
        const { resources } = await T(client.listResources(), 'resources/list');
        const r = resources.find((x) => x.uri === ACTIONS_URI);
        expect(r, `no ${ACTIONS_URI} among ${resources.map((x) => x.uri).join(', ')}`);
        return `${resources.length} resources, ${ACTIONS_URI} ${r.mimeType ?? ''}`.trim();
    });
    await checks.check(`resources/read ${ACTIONS_URI}`, async () => {
        const { contents } = await T(client.readResource(ACTIONS_URI), 'resources/read');
        expect(contents.length === 1, `${contents.length} contents`);
        const c = contents[0];
        expect(typeof c.text === 'string', 'no text content');
        const doc = JSON.parse(c.text);
        const actions = Array.isArray(doc) ? doc : doc.actions;
        expect(Array.isArray(actions), 'the JSON has no actions list');
        expect(actions.length === ACTION_COUNT, `${actions.length} actions, expected ${ACTION_COUNT}`);
        return `${actions.length} actions, ${c.text.length} chars, ${c.mimeType}`;
    });
    await checks.check('resources/templates/list', async () => {
        const { resourceTemplates } = await T(client.listResourceTemplates(), 'resources/templates/list');
        expect(resourceTemplates.some((t) => t.uriTemplate === ACTION_TEMPLATE),
            `no ${ACTION_TEMPLATE} among ${resourceTemplates.map((t) => t.uriTemplate).join(', ')}`);
    });
    await checks.check(`resources/read ${ACTIONS_URI}/get_status`, async () => {
        const { contents } = await T(client.readResource(`${ACTIONS_URI}/get_status`), 'resources/read');
        expect(contents.length >= 1 && typeof contents[0].text === 'string', 'no text content');
        const doc = JSON.parse(contents[0].text);
        expect(doc.name === 'get_status', `name is ${JSON.stringify(doc.name)}`);
    });

    // ---- execution
    if (cfg.mode !== 'docs') {
        await call('tools/call query_action {action:"get_status"}', 'query_action', { action: 'get_status' }, (res, sc) => {
            success(res, sc);
            expect(sc.result?.status === 'ok', `result.status is ${JSON.stringify(sc.result?.status)}`);
        });
    }
    if (cfg.mode === 'read') {
        await call('tools/call query_action {action:"get_cookies"} is refused', 'query_action', { action: 'get_cookies' }, (res, sc) => {
            expect(res.isError === true, 'isError is not true');
            expect(sc.diagnostics.kind === 'policy_denied', `diagnostics.kind is ${JSON.stringify(sc.diagnostics.kind)}, expected policy_denied`);
            return `kind ${sc.diagnostics.kind}`;
        });
        await call('tools/call query_action {action:"send_group_msg"} is refused in read mode', 'query_action',
            { action: 'send_group_msg', params: { group_id: 1, message: 'x' } }, (res, sc) => {
                expect(res.isError === true, `isError is not true: ${JSON.stringify(sc).slice(0, 200)}`);
                return `kind ${sc.diagnostics.kind}`;
            });
    }
    if (cfg.mode === 'write') {
        await call('tools/call invoke_action send_group_msg is a business failure', 'invoke_action',
            { action: 'send_group_msg', params: { group_id: 1, message: 'hi' } }, (res, sc) => {
                expect(res.isError !== true, `isError is true: ${JSON.stringify(sc.diagnostics)}`);
                expect(sc.diagnostics.outcome === 'failed', `diagnostics.outcome is ${sc.diagnostics.outcome}`);
                expect(sc.result?.retcode === 100, `result.retcode is ${JSON.stringify(sc.result?.retcode)}`);
                return `kind ${sc.diagnostics.kind}, wording ${JSON.stringify(sc.result.wording)}`;
            });

        if (inputCompletion) {
            await call('tools/call invoke_action_with_input send_group_msg {group_id} completes the message through elicitation',
                'invoke_action_with_input', INPUT_CALL, (res, sc) => {
                    const seen = client.elicitations();
                    expect(seen.length === 1, `the elicitation handler ran ${seen.length} times, expected once`);
                    const problems = inputFormProblems(seen[0]);
                    expect(problems.length === 0, problems.join('; '));
                    // Executed: the fake's interop preset answers every send_group_msg with retcode 100.
                    expect(res.isError !== true, `isError is true: ${JSON.stringify(sc.diagnostics)}`);
                    expect(sc.result?.retcode === 100,
                        `result is ${JSON.stringify(sc.result)?.slice(0, 200)}, expected the fake's envelope (retcode 100)`);
                    return `asked once (${JSON.stringify(seen[0].message)}), executed: outcome ${sc.diagnostics.outcome}, retcode ${sc.result.retcode}`;
                });
        }
        if (inputCompletion && cfg.confirmActions) {
            const mark = client.elicitations().length;
            let first;
            await call('tools/call invoke_action set_group_kick is confirmed through elicitation, then runs once',
                'invoke_action', CONFIRM_CALL, (res, sc) => {
                    const seen = client.elicitations().slice(mark);
                    expect(seen.length === 1, `the elicitation handler ran ${seen.length} times, expected once`);
                    const problems = confirmFormProblems(seen[0]);
                    expect(problems.length === 0, problems.join('; '));
                    expect(res.isError !== true, `isError is true: ${JSON.stringify(sc.diagnostics)}`);
                    expect(sc.diagnostics.replayed !== true, 'the first call is not a replay');
                    first = sc.result;
                    return `confirmed, outcome ${sc.diagnostics.outcome}`;
                });
            await call('tools/call invoke_action set_group_kick again with the same idempotency_key replays without asking',
                'invoke_action', CONFIRM_CALL, (res, sc) => {
                    const seen = client.elicitations().slice(mark);
                    expect(seen.length === 1, `asked again (${seen.length} elicitations)`);
                    expect(sc.diagnostics.replayed === true, `diagnostics.replayed is ${JSON.stringify(sc.diagnostics.replayed)}`);
                    expect(JSON.stringify(sc.result) === JSON.stringify(first), 'not the recorded result');
                    return 'replayed';
                });
        }

        let progress = [];
        await call('tools/call invoke_action download_file_stream with progress', 'invoke_action',
            { action: 'download_file_stream', params: { file: INTEROP_FILE } }, (res, sc) => {
                success(res, sc);
                const r = sc.result;
                const want = sha256Hex(expectedFileBytes());
                expect(r.file_size === INTEROP_FILE_BYTES, `result.file_size is ${r.file_size}`);
                expect(r.sha256 === want, `result.sha256 is ${r.sha256}, expected ${want}`);
                expect(typeof r.file_path === 'string', 'no result.file_path');
                const rel = path.relative(fs.realpathSync(cfg.streamDir), fs.realpathSync(r.file_path));
                expect(rel !== '' && !rel.startsWith('..') && !path.isAbsolute(rel), `${r.file_path} is not inside ${cfg.streamDir}`);
                const onDisk = fs.readFileSync(r.file_path);
                expect(sha256Hex(onDisk) === want, `the file on disk (${onDisk.length} bytes) has another SHA-256`);
                expect(progress.length > 0, 'no progress notification arrived');
                const last = progress[progress.length - 1];
                return `${progress.length} progress notifications, last ${last.progress}/${last.total ?? '?'}`;
            }, { onprogress: (p) => progress.push(p) });

        await checks.check('tools/call query_action get_group_list cancelled after 300 ms', async () => {
            const ac = new AbortController();
            const started = Date.now();
            const timer = setTimeout(() => ac.abort(), 300);
            try {
                const res = await T(client.callTool('query_action', { action: 'get_group_list' }, { signal: ac.signal }), 'tools/call query_action');
                throw new CheckFailure(`the call was not cancelled: it answered after ${Date.now() - started} ms: ${JSON.stringify(res.structuredContent ?? res).slice(0, 200)}`);
            } catch (err) {
                if (err instanceof CheckFailure) throw err;
                const ms = Date.now() - started;
                expect(ac.signal.aborted, `the call failed before the abort: ${errorText(err)}`);
                expect(ms < 5_000, `the client only gave up after ${ms} ms: ${errorText(err)}`);
                return `client reported ${errorText(err)} after ${ms} ms`;
            } finally {
                clearTimeout(timer);
            }
        });
        await call('tools/call list_categories {} after the cancellation', 'list_categories', {}, success);
    }

    if (cfg.eventsUrl && client.events) await runEvents(checks, cfg, client, call, success, T);

    // ---- preview_message without the MCP Apps extension: the draft, no UI.
    await runPreview(checks, cfg, client, call, success, T, { ui: false });

    // Anything the SDK reported through onerror instead of a request's
    // promise: e.g. a progress notification after its request's response
    // ("unknown token"), a message that does not parse, an unknown id.
    await checks.check('no protocol errors reported by the client', async () => {
        const errors = client.errors();
        expect(errors.length === 0, `${errors.length} reported: ${errors.map(errorText).join(' | ')}`);
    });

    await checks.check('close', async () => {
        const closed = await T(client.close(), 'close');
        // Over HTTP the adapter ends the session (DELETE) and reports how.
        if (cfg.http) return closed.detail;
        const { exitCode, signal, ms } = closed;
        expect(exitCode === 0 && signal === null,
            `the server did not exit 0 on stdin EOF: exit code ${exitCode}, signal ${signal} (after ${ms} ms; the SDK sends SIGTERM after 2 s)`);
        return `server exited 0 after ${ms} ms`;
    });
}

/** Poll `probe` (returns a value when done, undefined otherwise) every 50 ms for up to `ms`. */
async function pollFor(probe, ms, what) {
    const deadline = Date.now() + ms;
    for (;;) {
        const v = await probe();
        if (v !== undefined) return v;
        if (Date.now() >= deadline) throw new CheckFailure(`${what}: not within ${ms} ms`);
        await new Promise((r) => setTimeout(r, 50));
    }
}

/** Problems with one event resource read (the parsed text of resources/read). */
function eventReadProblems(doc, selfId, uri) {
    const problems = [];
    // The documented fields, plus `uri` (the canonical URI), which the server
    // also sends although the README does not list it.
    const keys = Object.keys(doc ?? {}).filter((k) => k !== 'uri').sort();
    if (JSON.stringify(keys) !== JSON.stringify(EVENT_READ_FIELDS)) problems.push(`fields ${keys.join(',')}, expected ${EVENT_READ_FIELDS.join(',')}`);
    if ('uri' in (doc ?? {}) && doc.uri !== uri) problems.push(`uri ${JSON.stringify(doc.uri)}, expected ${uri}`);
    if (doc?.status?.state !== 'connected') problems.push(`status ${JSON.stringify(doc?.status)}`);
    if (!Array.isArray(doc?.events)) return [...problems, 'events is not an array'];
    if (typeof doc.next_cursor !== 'string') problems.push(`next_cursor ${JSON.stringify(doc.next_cursor)}`);
    if (doc.dropped_events !== 0) problems.push(`dropped_events ${doc.dropped_events}`);
    if (doc.gap !== false) problems.push(`gap ${doc.gap}`);
    if (doc.notification_failed !== false) problems.push(`notification_failed ${doc.notification_failed}`);
    for (const e of doc.events) {
        if (typeof e?.cursor !== 'string' || typeof e?.event !== 'object') { problems.push(`entry ${JSON.stringify(e).slice(0, 120)}`); break; }
        if (e.event.self_id !== selfId || !String(e.event.raw_message).startsWith('interop event ')) {
            problems.push(`event ${JSON.stringify(e.event).slice(0, 160)}`);
            break;
        }
    }
    return problems;
}

const eventNumber = (e) => Number(String(e.event.raw_message).slice('interop event '.length));

/**
 * Live event resources, as a client of each generation uses them. The fake
 * injects a group message of cfg.selfId every 200 ms once its WebSocket
 * is connected (tests/fake-snowluma `FakeEvents::interop_preset`).
 * `client.events` adapts the SDK:
 *   updates() -> params of every notifications/resources/updated received,
 *   and either (modern) listen(uri) -> {honored, close(), closed}
 *   or (legacy) subscribe(uri), unsubscribe(uri).
 * Modern: subscribe_events, subscriptions/listen with resourceSubscriptions
 * [uri], an update, reads (whole, then ?after=next_cursor), close the
 * stream, unsubscribe_events. Legacy: subscribe_events, resources/subscribe,
 * an update, reads, resources/unsubscribe (which releases the resource).
 */
async function runEvents(checks, cfg, client, call, success, T) {
    const ev = client.events;
    let uri;
    const subscribed = await call(`tools/call subscribe_events {self_id:${cfg.selfId}}`, 'subscribe_events', { self_id: cfg.selfId }, (res, sc) => {
        success(res, sc);
        uri = sc.result?.uri;
        expect(typeof uri === 'string' && uri.startsWith(EVENTS_URI_PREFIX), `result.uri is ${JSON.stringify(uri)}`);
        expect(sc.result.status?.state === 'connected', `result.status is ${JSON.stringify(sc.result.status)}`);
        return uri;
    });
    if (!subscribed || !uri) return;

    const readDoc = async (u) => {
        const { contents } = await T(client.readResource(u), `resources/read ${u}`);
        expect(Array.isArray(contents) && contents.length === 1 && typeof contents[0].text === 'string', `contents ${JSON.stringify(contents).slice(0, 200)}`);
        return JSON.parse(contents[0].text);
    };

    let sub;
    if (ev.listen) {
        const ok = await checks.check('subscriptions/listen {resourceSubscriptions:[uri]} is acknowledged', async () => {
            sub = await T(ev.listen(uri), 'subscriptions/listen');
            const honored = sub.honored?.resourceSubscriptions ?? [];
            expect(honored.includes(uri), `honored filter ${JSON.stringify(sub.honored)}`);
            return `honored ${JSON.stringify(sub.honored)}`;
        });
        if (!ok) return;
    } else {
        const ok = await checks.check('resources/subscribe uri', async () => {
            await T(ev.subscribe(uri), 'resources/subscribe');
        });
        if (!ok) return;
    }

    await checks.check('notifications/resources/updated for the uri after the fake injects events', async () => {
        const n = await pollFor(() => ev.updates().find((p) => p?.uri === uri), EVENT_WAIT_MS, 'no notifications/resources/updated for the uri');
        const sid = n?._meta?.['io.modelcontextprotocol/subscriptionId'];
        return `${ev.updates().length} received${sid !== undefined ? `, subscriptionId ${JSON.stringify(sid)}` : ''}`;
    });

    let first;
    await checks.check('resources/read uri', async () => {
        first = await pollFor(async () => {
            const d = await readDoc(uri);
            return d.events?.length > 0 ? d : undefined;
        }, EVENT_WAIT_MS, 'no event buffered');
        const problems = eventReadProblems(first, cfg.selfId, uri);
        expect(problems.length === 0, problems.join('; '));
        expect(first.oldest_cursor === first.events[0].cursor, `oldest_cursor ${first.oldest_cursor}, first entry ${first.events[0].cursor}`);
        expect(first.next_cursor === first.events[first.events.length - 1].cursor, `next_cursor ${first.next_cursor}, last entry ${first.events[first.events.length - 1].cursor}`);
        return `${first.events.length} events, next_cursor ${first.next_cursor}`;
    });
    if (first) {
        await checks.check('resources/read uri?after=next_cursor has only newer events', async () => {
            const after = await pollFor(async () => {
                const d = await readDoc(`${uri}?after=${encodeURIComponent(first.next_cursor)}`);
                return d.events?.length > 0 ? d : undefined;
            }, EVENT_WAIT_MS, 'no newer event');
            const problems = eventReadProblems(after, cfg.selfId, uri);
            expect(problems.length === 0, problems.join('; '));
            const last = eventNumber(first.events[first.events.length - 1]);
            const old = new Set(first.events.map((e) => e.cursor));
            expect(after.events.every((e) => !old.has(e.cursor) && eventNumber(e) > last),
                `events at or before the cursor: ${after.events.map(eventNumber).join(',')} (last read ${last})`);
            return `${after.events.length} newer events, next_cursor ${after.next_cursor}`;
        });
    }

    if (ev.listen) {
        await checks.check('close the listen stream', async () => {
            await T(sub.close(), 'subscription close');
            const how = await T(sub.closed, 'subscription closed');
            expect(how === 'local', `closed ${how}`);
            // Closing the stream does not release the buffer.
            const d = await readDoc(uri);
            expect(d.status?.state === 'connected', `after close: status ${JSON.stringify(d.status)}`);
            return `closed ${how}; the resource is still readable`;
        });
        await call('tools/call unsubscribe_events {uri}', 'unsubscribe_events', { uri }, success);
    } else {
        await checks.check('resources/unsubscribe uri releases the resource', async () => {
            await T(ev.unsubscribe(uri), 'resources/unsubscribe');
        });
    }
    await checks.check('the released resource cannot be read', async () => {
        let doc;
        try {
            doc = await readDoc(uri);
        } catch (err) {
            if (err instanceof CheckFailure) throw err;
            return `error: ${errorText(err)}`;
        }
        throw new CheckFailure(`still readable: ${JSON.stringify(doc).slice(0, 200)}`);
    });
}

/**
 * Follow a spawned stdio transport's child: resolves {exitCode, signal}
 * once it has exited. `child` is the transport's ChildProcess.
 */
export function childExit(child) {
    if (!child) return Promise.resolve({ exitCode: null, signal: 'unknown' });
    if (child.exitCode !== null || child.signalCode !== null) {
        return Promise.resolve({ exitCode: child.exitCode, signal: child.signalCode });
    }
    return new Promise((resolve) => child.once('exit', (exitCode, signal) => resolve({ exitCode, signal })));
}

// ---- preview_message and its MCP Apps panel (README, "Message preview")

export const UI_MIME = 'text/html;profile=mcp-app';
export const UI_URI = 'ui://snowluma-mcp/preview-message.html';
/** The client capabilities of a host that renders MCP Apps panels. */
export const UI_CAPABILITIES = { extensions: { 'io.modelcontextprotocol/ui': { mimeTypes: [UI_MIME] } } };
export const PREVIEW_ARGS = { message_type: 'group', target_id: 20001, text: '[CQ:at,qq=all] <img src=x onerror=alert(1)>', reply_to: -123456 };

/**
 * preview_message through `client` (the scenario's adapter): the draft and
 * its invoke_action arguments, can_send for the mode, and `_meta.ui` and the
 * ui:// resource present exactly when `ui` (the client declared the
 * extension). Nothing reaches SnowLuma (tests/tests/interop.rs checks the
 * fake's log).
 */
export async function runPreview(checks, cfg, client, call, success, T, { ui }) {
    const tag = ui ? ' (UI extension declared)' : '';
    await checks.check(`tools/list: preview_message ${ui ? 'links its panel' : 'has no UI metadata'}${tag}`, async () => {
        const { tools } = await T(client.listTools(), 'tools/list');
        const tool = tools.find((t) => t.name === 'preview_message');
        expect(tool, 'preview_message is not listed');
        const linked = tools.filter((t) => t._meta?.ui);
        if (ui) {
            expect(tool._meta?.ui?.resourceUri === UI_URI, `_meta is ${JSON.stringify(tool._meta)}`);
            expect(linked.length === 1, `${linked.length} tools carry _meta.ui`);
        } else {
            expect(linked.length === 0, `${linked.map((t) => t.name).join(', ')} carry _meta.ui`);
        }
    });
    await checks.check(`resources/list: the panel resource is ${ui ? 'listed' : 'absent'}${tag}`, async () => {
        const { resources } = await T(client.listResources(), 'resources/list');
        const r = resources.find((x) => x.uri === UI_URI);
        if (ui) expect(r?.mimeType === UI_MIME, `no ${UI_URI} with ${UI_MIME}: ${JSON.stringify(resources.map((x) => x.uri))}`);
        else expect(!r && !resources.some((x) => x.uri.startsWith('ui://')), 'a ui:// resource is listed');
    });
    if (ui) {
        await checks.check(`resources/read ${UI_URI}${tag}`, async () => {
            const { contents } = await T(client.readResource(UI_URI), 'resources/read');
            expect(contents.length === 1, `${contents.length} contents`);
            const c = contents[0];
            expect(c.mimeType === UI_MIME, `mimeType ${c.mimeType}`);
            expect(typeof c.text === 'string' && c.text.startsWith('<!doctype html>'), 'no HTML text');
            expect(/connect-src 'none'/.test(c.text), 'no Content-Security-Policy forbidding connections');
            expect(JSON.stringify(c._meta?.ui?.csp?.connectDomains) === '[]', `_meta.ui.csp is ${JSON.stringify(c._meta?.ui?.csp)}`);
            return `${c.text.length} chars`;
        });
    }
    await call(`tools/call preview_message${tag}`, 'preview_message', PREVIEW_ARGS, (res, sc) => {
        success(res, sc);
        const r = sc.result;
        const canSend = cfg.mode === 'write';
        expect(r.can_send === canSend, `can_send is ${r.can_send} in ${cfg.mode} mode (${r.send_blocked_by})`);
        expect(canSend || typeof r.send_blocked_by === 'string', 'no reason for can_send false');
        const want = {
            action: 'send_group_msg',
            params: { group_id: 20001, message: [
                { type: 'reply', data: { id: '-123456' } },
                { type: 'text', data: { text: PREVIEW_ARGS.text } },
            ] },
        };
        expect(JSON.stringify(r.invoke_action) === JSON.stringify(want), `invoke_action is ${JSON.stringify(r.invoke_action)}`);
        return `can_send ${r.can_send}`;
    });
    await call(`tools/call preview_message {text:""} is a tool error${tag}`, 'preview_message', { ...PREVIEW_ARGS, text: '' }, (res, sc) => {
        expect(res.isError === true, 'isError is not true');
        expect(sc.diagnostics.kind === 'invalid_arguments', `diagnostics.kind is ${sc.diagnostics.kind}`);
    });
}

/**
 * A second session whose client declares the MCP Apps extension
 * (UI_CAPABILITIES): it lists tools (so that results are validated), then
 * runs runPreview with `ui: true` and closes. `client` is an adapter like
 * runScenario's (connect, listTools, callTool, listResources, readResource,
 * close).
 */
export async function runPreviewUiSession(checks, cfg, client) {
    const T = (p, what) => withTimeout(p, REQUEST_TIMEOUT_MS + 5_000, what);
    const ajv = makeAjv();
    let validators = new Map();
    const connected = await checks.check('UI session: connect declaring io.modelcontextprotocol/ui', async () => {
        await T(client.connect(), 'connect');
        const { tools } = await T(client.listTools(), 'tools/list');
        const compiled = compileToolSchemas(ajv, tools);
        validators = compiled.validators;
        expect(compiled.problems.length === 0, compiled.problems.join('; '));
    });
    if (!connected) return;
    const call = (label, name, args, verify) =>
        checks.check(label, async () => {
            const res = await T(client.callTool(name, args), `tools/call ${name}`);
            const problems = resultProblems(validators, name, res);
            expect(problems.length === 0, problems.join('; '));
            return verify(res, res.structuredContent);
        });
    const success = (res, sc) => {
        expect(res.isError !== true, `isError is true: ${JSON.stringify(sc.diagnostics)}`);
        expect(sc.diagnostics.outcome === 'success', `diagnostics.outcome is ${sc.diagnostics.outcome}`);
    };
    await runPreview(checks, cfg, client, call, success, T, { ui: true });
    await checks.check('UI session: close', async () => {
        const closed = await T(client.close(), 'close');
        if (closed === undefined) return; // over HTTP: no process of ours to watch
        const { exitCode, signal } = closed;
        expect(exitCode === 0 && signal === null, `the server did not exit 0: exit code ${exitCode}, signal ${signal}`);
    });
}
