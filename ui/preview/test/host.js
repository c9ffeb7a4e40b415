// The test host: the host side of the MCP Apps protocol, with the official
// AppBridge, in a page of its own. It embeds the panel the way hosts do (a
// sandboxed iframe without same-origin), answers ui/initialize with the
// capabilities a scenario gives, sends the tool input and result, and hands
// every tools/call the panel makes to window.hostCallTool, which the
// Node test exposes (it records the call and forwards it to a real
// snowluma-mcp session, or answers as the scenario says).
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

// Messages any injected markup might post to its parent.
window.__pwned = [];
window.addEventListener("message", (e) => {
  const d = e.data;
  if (d && typeof d === "object" && "pwned" in d) window.__pwned.push(String(d.pwned));
});

window.startHost = async ({ html, toolInput, toolResult, serverTools }) => {
  const iframe = document.createElement("iframe");
  iframe.id = "panel";
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.style.cssText = "width: 640px; height: 620px; border: 1px solid #888;";
  const caps = serverTools ? { serverTools: {} } : {};
  const bridge = new AppBridge(null, { name: "snowluma-test-host", version: "1.0.0" }, caps);
  if (serverTools) bridge.oncalltool = (params) => window.hostCallTool(params);
  const initialized = new Promise((resolve) => {
    bridge.oninitialized = resolve;
  });
  iframe.srcdoc = html;
  document.body.appendChild(iframe);
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  await initialized;
  await bridge.sendToolInput({ arguments: toolInput });
  await bridge.sendToolResult(toolResult);
  window.__bridge = bridge;
  return "started";
};
