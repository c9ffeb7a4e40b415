// The preview panel in a real browser: Debian's Chromium, driven by
// playwright-core, renders the panel inside a test host page (host.js, the
// official AppBridge) that speaks the host side of the MCP Apps protocol.
// The panel's HTML, the draft and every tools/call go through real
// snowluma-mcp sessions (the official TypeScript client, spawned over stdio
// and declaring the io.modelcontextprotocol/ui extension): a write-mode
// session against the fake SnowLuma the Rust harness started, and a
// read-mode one.
//
// Run by tests/tests/preview_panel.rs, which sets
//   SNOWLUMA_MCP_BIN      the binary under test
//   PREVIEW_ENDPOINT      the fake SnowLuma's URL
//   PREVIEW_ARTIFACTS     where the screenshot goes (target/test-artifacts)
// and afterwards checks the fake's log: exactly one send_group_msg per
// clicking scenario that reached the write session.
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { build } from "esbuild";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const ASSET = join(here, "../../../supervisor/assets/preview-panel.html");
const UI_URI = "ui://snowluma-mcp/preview-message.html";
const UI_MIME = "text/html;profile=mcp-app";
const CHROMIUM = process.env.PREVIEW_CHROMIUM || "/usr/bin/chromium";
const TIMEOUT = 20_000;

function need(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (tests/tests/preview_panel.rs sets it)`);
  return v;
}

// Exactly 10 000 characters: markup that would run or fetch if it were
// parsed, CQ codes, bidirectional overrides, then padding.
const HOSTILE_HEAD =
  `<img src=x onerror="parent.postMessage({pwned:'img'},'*')">` +
  `<script>parent.postMessage({pwned:'script'},'*')</script>` +
  `<svg onload="parent.postMessage({pwned:'svg'},'*')"></svg>` +
  `[CQ:at,qq=all][CQ:image,file=http://127.0.0.1:9/cq.png]` +
  `\u202eevil.exe\u202c \u2067isolate\u2069 ` +
  `<link rel=stylesheet href="http://127.0.0.1:9/x.css"><style>@import url(http://127.0.0.1:9/y.css)</style>` +
  `<a href="http://127.0.0.1:9/">link</a> &lt;entity&gt; `;
const HOSTILE = HOSTILE_HEAD + "x".repeat(10_000 - [...HOSTILE_HEAD].length);
assert.equal([...HOSTILE].length, 10_000);
const GROUP = 20001;
const REPLY_TO = -123456;

let browser;
let hostScript;
const sessions = {};

async function session(mode) {
  // Send pacing off: the write session sends to one group several times in
  // a few seconds on purpose (pacing is tested in tests/tests/safety.rs).
  const env = {
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    SNOWLUMA_MCP_MODE: mode,
    SNOWLUMA_MCP_LOG: "warn",
    SNOWLUMA_MCP_SEND_INTERVAL_MS: "0",
    SNOWLUMA_MCP_SEND_BURST: "0",
  };
  if (mode !== "docs") env.SNOWLUMA_MCP_ENDPOINT = need("PREVIEW_ENDPOINT");
  const client = new Client(
    { name: "snowluma-preview-test-host", version: "1.0.0" },
    {
      capabilities: { extensions: { "io.modelcontextprotocol/ui": { mimeTypes: [UI_MIME] } } },
      versionNegotiation: { mode: { pin: "2026-07-28" } },
    },
  );
  const transport = new StdioClientTransport({ command: need("SNOWLUMA_MCP_BIN"), args: [], env, stderr: "inherit" });
  await client.connect(transport);
  return { client, env };
}

async function preview(client, args) {
  const r = await client.callTool({ name: "preview_message", arguments: args });
  assert.equal(r.isError ?? false, false, JSON.stringify(r));
  return r;
}

before(async () => {
  const bundle = await build({
    entryPoints: [join(here, "host.js")],
    bundle: true,
    minify: true,
    format: "iife",
    target: "es2020",
    write: false,
    logLevel: "warning",
  });
  hostScript = bundle.outputFiles[0].text;
  sessions.write = await session("write");
  sessions.read = await session("read");
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
});

after(async () => {
  await browser?.close();
  for (const s of Object.values(sessions)) {
    await s.client.close();
  }
});

// A panel in a fresh browser context. `onCall(params)` answers the
// panel's tools/call; every call is recorded first.
async function openPanel({ html, toolInput, toolResult, serverTools, onCall }) {
  const context = await browser.newContext({ viewport: { width: 700, height: 680 } });
  // Every request any frame starts, and the error of each that failed.
  const network = [];
  const failed = new Map();
  context.on("request", (r) => network.push(r.url()));
  context.on("requestfailed", (r) => failed.set(r.url(), r.failure()?.errorText ?? "?"));
  // Anything that got past the browser's own checks would be recorded and
  // refused here, before it reached the network.
  await context.route("**/*", (route) => {
    network.push("routed " + route.request().url());
    return route.abort();
  });
  const page = await context.newPage();
  const consoleErrors = [];
  page.on("console", (m) => {
    if (m.type() === "error") consoleErrors.push(m.text());
  });
  const calls = [];
  await page.exposeFunction("hostCallTool", async (params) => {
    calls.push(params);
    return onCall(params, calls.length);
  });
  await page.setContent(`<!doctype html><html><body><script>${hostScript}</script></body></html>`);
  await page.evaluate((opts) => window.startHost(opts), { html, toolInput, toolResult, serverTools });
  const frame = page.frameLocator("#panel");
  await frame.locator("#status").filter({ hasText: /Draft ready|No draft/ }).waitFor({ timeout: TIMEOUT });
  return { context, page, frame, calls, network, failed, consoleErrors };
}

async function panelHtml(client) {
  const read = await client.readResource({ uri: UI_URI });
  assert.equal(read.contents.length, 1);
  const c = read.contents[0];
  assert.equal(c.mimeType, UI_MIME);
  assert.deepEqual(c._meta?.ui?.csp, { connectDomains: [], resourceDomains: [], frameDomains: [], baseUriDomains: [] });
  assert.equal(c.text, readFileSync(ASSET, "utf8"), "the server serves the committed asset");
  return c.text;
}

test("a UI-capable client sees the panel's tool metadata and resource", async () => {
  const { client } = sessions.write;
  const tools = await client.listTools();
  const tool = tools.tools.find((t) => t.name === "preview_message");
  assert.deepEqual(tool._meta, { ui: { resourceUri: UI_URI } });
  assert.equal(tools.tools.filter((t) => t._meta?.ui).length, 1, "only preview_message links a UI");
  const resources = await client.listResources();
  const ui = resources.resources.find((r) => r.uri === UI_URI);
  assert.equal(ui?.mimeType, UI_MIME);
  const html = await panelHtml(client);
  assert.match(html, /connect-src 'none'/);
});

test("hostile text stays literal and nothing is fetched; one click sends once", async () => {
  const { client } = sessions.write;
  const html = await panelHtml(client);
  const toolInput = { message_type: "group", target_id: GROUP, text: HOSTILE, reply_to: REPLY_TO };
  const toolResult = await preview(client, toolInput);
  assert.equal(toolResult.structuredContent.result.can_send, true);
  let release;
  const held = new Promise((r) => {
    release = r;
  });
  const p = await openPanel({
    html,
    toolInput,
    toolResult,
    serverTools: true,
    onCall: async (params) => {
      await held; // the call stays in flight until the test has looked
      return client.callTool(params);
    },
  });
  const { frame, page } = p;
  // Literal text, nothing parsed out of it.
  assert.equal(await frame.locator("#text").evaluate((n) => n.textContent), HOSTILE);
  assert.equal(await frame.locator("img, svg, a, link, iframe, object, embed").count(), 0);
  assert.equal(await frame.locator("script").count(), 1, "only the panel's own script");
  assert.equal(await frame.locator("style").count(), 1, "only the panel's own style");
  assert.equal(await frame.locator("#target").textContent(), `group ${GROUP}`);
  assert.equal(await frame.locator("#reply").textContent(), `message ${REPLY_TO}`);
  assert.equal(await frame.locator("#bidi").isVisible(), true, "the bidi warning is shown");
  assert.match(await frame.locator("#notice").textContent(), /not proof of delivery/);
  // Loading sent nothing.
  assert.equal(p.calls.length, 0, "loading the panel calls no tool");
  const send = frame.locator("#send");
  await send.waitFor({ state: "visible" });
  assert.equal(await send.isEnabled(), true);
  await send.click();
  await frame.locator("#reason").filter({ hasText: "Sending" }).waitFor({ timeout: TIMEOUT });
  assert.equal(await send.isDisabled(), true, "disabled while the call is in flight");
  await send.dispatchEvent("click");
  release();
  await frame.locator("#outcome").filter({ hasText: "Acknowledged" }).waitFor({ timeout: TIMEOUT });
  assert.match(await frame.locator("#outcome").textContent(), /message_id -123456.*not proof of delivery/);
  assert.equal(await send.isDisabled(), true, "disabled after the send");
  await send.dispatchEvent("click");
  assert.equal(p.calls.length, 1, "one click, one tools/call");
  assert.equal(p.calls[0].name, "invoke_action");
  assert.ok(
    JSON.stringify(p.calls[0].arguments) === JSON.stringify(toolResult.structuredContent.result.invoke_action),
    "the call carries exactly the draft's invoke_action arguments",
  );
  assert.deepEqual(await page.evaluate(() => window.__pwned), [], "no injected markup ran");
  assert.deepEqual(p.network, [], "the page fetched nothing");
  // The document's policy holds even against script running in the panel:
  // an image, a fetch and a stylesheet it creates are refused before any
  // request exists.
  const panelFrame = page.frames().find((f) => f !== page.mainFrame());
  const violations = await panelFrame.evaluate(async () => {
    const seen = [];
    document.addEventListener("securitypolicyviolation", (e) => seen.push(e.violatedDirective));
    const img = document.createElement("img");
    img.src = "http://127.0.0.1:9/probe.png";
    document.body.append(img);
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = "http://127.0.0.1:9/probe.css";
    document.head.append(link);
    await fetch("http://127.0.0.1:9/probe").catch(() => {});
    await new Promise((r) => setTimeout(r, 200));
    img.remove();
    link.remove();
    return seen.sort();
  });
  assert.deepEqual(violations, ["connect-src", "img-src", "style-src-elem"], "the policy refused all three");
  // Chromium reports the refused image and stylesheet as requests that
  // failed with the error "csp"; none was routed, i.e. none left the page.
  assert.ok(!p.network.some((u) => u.startsWith("routed ")), `something was routed: ${p.network}`);
  for (const url of p.network) assert.equal(p.failed.get(url), "csp", url);
  const dir = process.env.PREVIEW_ARTIFACTS || join(here, "../../../target/test-artifacts");
  mkdirSync(dir, { recursive: true });
  await page.locator("#panel").screenshot({ path: join(dir, "preview-panel.png") });
  await p.context.close();
});

test("control: the network log sees what the host page itself fetches", async () => {
  const { client } = sessions.read;
  const toolInput = { message_type: "private", target_id: 30001, text: "hello" };
  const p = await openPanel({
    html: await panelHtml(client),
    toolInput,
    toolResult: await preview(client, toolInput),
    serverTools: true,
    onCall: () => assert.fail("no call expected"),
  });
  await p.page.evaluate(() => fetch("http://127.0.0.1:9/control").catch(() => {}));
  assert.deepEqual(p.network, ["http://127.0.0.1:9/control", "routed http://127.0.0.1:9/control"]);
  await p.context.close();
});

test("a double click sends once", async () => {
  const { client } = sessions.write;
  const toolInput = { message_type: "group", target_id: GROUP, text: HOSTILE, reply_to: REPLY_TO };
  const toolResult = await preview(client, toolInput);
  const p = await openPanel({
    html: await panelHtml(client),
    toolInput,
    toolResult,
    serverTools: true,
    onCall: (params) => client.callTool(params),
  });
  await p.frame.locator("#send").dblclick();
  // Two clicks in one task, too.
  await p.frame.locator("#send").evaluate((b) => {
    b.click();
    b.click();
  });
  await p.frame.locator("#outcome").filter({ hasText: "Acknowledged" }).waitFor({ timeout: TIMEOUT });
  assert.equal(p.calls.length, 1, "a double click is one tools/call");
  assert.deepEqual(p.network, []);
  await p.context.close();
});

test("read mode: sending is disabled with the reason", async () => {
  const { client } = sessions.read;
  const toolInput = { message_type: "private", target_id: 30001, text: "hello" };
  const toolResult = await preview(client, toolInput);
  assert.equal(toolResult.structuredContent.result.can_send, false);
  const p = await openPanel({
    html: await panelHtml(client),
    toolInput,
    toolResult,
    serverTools: true,
    onCall: () => assert.fail("no call expected"),
  });
  const send = p.frame.locator("#send");
  assert.equal(await send.isDisabled(), true);
  assert.match(await p.frame.locator("#reason").textContent(), /Sending is disabled: sending needs write mode/);
  await send.dispatchEvent("click");
  assert.equal(p.calls.length, 0);
  assert.deepEqual(p.network, []);
  await p.context.close();
});

test("a host without server tools: sending is disabled with the reason", async () => {
  const { client } = sessions.write;
  const toolInput = { message_type: "group", target_id: GROUP, text: "hello" };
  const toolResult = await preview(client, toolInput);
  assert.equal(toolResult.structuredContent.result.can_send, true);
  const p = await openPanel({
    html: await panelHtml(client),
    toolInput,
    toolResult,
    serverTools: false,
    onCall: () => assert.fail("no call expected"),
  });
  const send = p.frame.locator("#send");
  assert.equal(await send.isDisabled(), true);
  assert.match(await p.frame.locator("#reason").textContent(), /does not let the panel call server tools/);
  await send.dispatchEvent("click");
  assert.equal(p.calls.length, 0);
  await p.context.close();
});

test("an error result is shown with the diagnostics' message and not retried", async () => {
  // The draft comes from the write session, but the click reaches the
  // read-mode session, whose write gate refuses invoke_action.
  const toolInput = { message_type: "group", target_id: GROUP, text: "hello" };
  const toolResult = await preview(sessions.write.client, toolInput);
  const p = await openPanel({
    html: await panelHtml(sessions.write.client),
    toolInput,
    toolResult,
    serverTools: true,
    onCall: (params) => sessions.read.client.callTool(params),
  });
  await p.frame.locator("#send").click();
  const outcome = p.frame.locator("#outcome");
  await outcome.filter({ hasText: "Not sent" }).waitFor({ timeout: TIMEOUT });
  assert.match(await outcome.textContent(), /写操作未启用：需设置 SNOWLUMA_MCP_MODE=write。/);
  assert.equal(await p.frame.locator("#send").isDisabled(), true, "no retry");
  await p.frame.locator("#send").dispatchEvent("click");
  assert.equal(p.calls.length, 1);
  await p.context.close();
});

test("a host error leaves the outcome unknown and the button disabled", async () => {
  const toolInput = { message_type: "group", target_id: GROUP, text: "hello" };
  const toolResult = await preview(sessions.write.client, toolInput);
  const p = await openPanel({
    html: await panelHtml(sessions.write.client),
    toolInput,
    toolResult,
    serverTools: true,
    onCall: () => {
      throw new Error("the connection to the server was lost");
    },
  });
  await p.frame.locator("#send").click();
  const outcome = p.frame.locator("#outcome");
  await outcome.filter({ hasText: "Outcome unknown" }).waitFor({ timeout: TIMEOUT });
  assert.match(await outcome.textContent(), /may or may not have been sent/);
  assert.equal(await p.frame.locator("#send").isDisabled(), true);
  assert.equal(p.calls.length, 1);
  await p.context.close();
});
