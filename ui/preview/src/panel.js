// The message preview panel: shows the draft from preview_message's result
// and, only when the user clicks, asks the host to call invoke_action with
// the draft's own arguments. Every string from outside (the draft, the
// diagnostics, the host's errors) is shown through textContent, never as
// HTML. Nothing is sent on load, nothing is retried, and one click sends
// at most once.
import { App } from "@modelcontextprotocol/ext-apps";

const SEND_ACTIONS = new Set(["send_group_msg", "send_private_msg"]);
// Bidirectional controls: they change how the text around them displays.
const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/u;

const el = (id) => document.getElementById(id);
const show = (id, text, cls) => {
  const node = el(id);
  node.textContent = text;
  node.className = cls || "";
};

// waiting → ready → sending → done (success, failure or unknown); or
// invalid when the tool result cannot be used. Only ready can send.
let phase = "waiting";
let preview = null;
let serverTools = false;

function previewFrom(result) {
  const sc = result && result.structuredContent;
  if (result && result.isError) {
    const d = sc && sc.diagnostics;
    return { error: (d && typeof d.message === "string" && d.message) || "preview_message failed" };
  }
  const r = sc && sc.result;
  const args = r && r.invoke_action;
  const ok =
    r &&
    typeof r.text === "string" &&
    typeof r.target_id === "number" &&
    (r.message_type === "group" || r.message_type === "private") &&
    typeof r.can_send === "boolean" &&
    args &&
    SEND_ACTIONS.has(args.action) &&
    args.params &&
    typeof args.params === "object";
  return ok ? { draft: r } : { error: "the tool result is not a message preview" };
}

function render() {
  const button = el("send");
  let reason = "";
  if (!preview) {
    reason = phase === "invalid" ? "Nothing to send." : "Waiting for the draft.";
  } else if (!preview.can_send) {
    reason = "Sending is disabled: " + (preview.send_blocked_by || "this server would not send it") + ".";
  } else if (!serverTools) {
    reason = "Sending is disabled: this host does not let the panel call server tools.";
  } else if (phase === "sending") {
    reason = "Sending…";
  } else if (phase === "done") {
    reason = "This draft was already sent once; create a new draft to send again.";
  }
  button.disabled = !(phase === "ready" && preview && preview.can_send && serverTools);
  show("reason", reason);
}

function showDraft(d) {
  show("target", (d.message_type === "group" ? "group " : "user ") + String(d.target_id));
  show("reply", d.reply_to === null || d.reply_to === undefined ? "–" : "message " + String(d.reply_to));
  show("action", String(d.invoke_action.action));
  show("text", d.text);
  const bidi = el("bidi");
  bidi.hidden = !BIDI.test(d.text);
  bidi.textContent = bidi.hidden
    ? ""
    : "The text contains bidirectional control characters: it may read differently in QQ than it looks here.";
}

function onResult(result) {
  if (phase !== "waiting") return; // one draft per panel
  const p = previewFrom(result);
  if (p.error) {
    phase = "invalid";
    show("status", "No draft: " + p.error, "error");
  } else {
    preview = p.draft;
    phase = "ready";
    showDraft(preview);
    show("status", "Draft ready. Nothing has been sent.");
  }
  render();
}

function outcomeOf(result) {
  const sc = result && result.structuredContent;
  const d = (sc && sc.diagnostics) || {};
  const message = typeof d.message === "string" ? d.message : "";
  if (result && result.isError) {
    const unknown = d.outcome === "unknown";
    return [
      (unknown ? "Outcome unknown: " : "Not sent: ") + (message || "invoke_action failed") +
        (unknown ? " The message may or may not have been sent; check before creating a new draft." : ""),
      "error",
    ];
  }
  const env = sc && sc.result;
  if (d.outcome === "success") {
    const id = env && env.data && env.data.message_id;
    return ["Acknowledged by SnowLuma" + (id === undefined ? "" : " (message_id " + String(id) + ")") +
      ". This is not proof of delivery.", "ok"];
  }
  if (d.outcome === "failed") {
    const code = env && env.retcode !== undefined ? " (retcode " + String(env.retcode) + ")" : "";
    return ["SnowLuma refused the message" + code + (message ? ": " + message : "."), "error"];
  }
  return ["Outcome unknown" + (message ? ": " + message : "") +
    ". The message may or may not have been sent; check before creating a new draft.", "error"];
}

async function send(app) {
  if (phase !== "ready" || !preview || !preview.can_send || !serverTools) return;
  phase = "sending"; // before anything else: a second click finds it taken
  render();
  const args = preview.invoke_action;
  let text;
  let cls;
  try {
    const result = await app.callServerTool({
      name: "invoke_action",
      arguments: { action: args.action, params: args.params },
    });
    [text, cls] = outcomeOf(result);
  } catch (e) {
    text = "Outcome unknown: the host reported an error (" + String((e && e.message) || e) +
      "). The message may or may not have been sent; check before creating a new draft.";
    cls = "error";
  }
  phase = "done";
  show("status", cls === "ok" ? "Sent once; see the outcome below." : "Send attempted once; see the outcome below.");
  show("outcome", text, cls);
  render();
}

const app = new App({ name: "snowluma-mcp-preview-panel", version: "1.0.0" }, {}, { autoResize: true });
app.ontoolresult = onResult;
app.ontoolcancelled = () => {
  if (phase === "waiting") {
    phase = "invalid";
    show("status", "The preview was cancelled.", "error");
    render();
  }
};
el("send").addEventListener("click", () => {
  send(app);
});
render();
app.connect().then(
  () => {
    const caps = app.getHostCapabilities();
    serverTools = !!(caps && caps.serverTools);
    render();
  },
  (e) => {
    show("status", "Cannot talk to the host: " + String((e && e.message) || e), "error");
  },
);
