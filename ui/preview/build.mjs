// Builds the preview panel into one self-contained HTML file,
// supervisor/assets/preview-panel.html, which the binary compiles in.
//
//   node build.mjs          write the asset
//   node build.mjs --check  exit 1 when the committed asset differs from
//                           what these sources build (scripts/check-ui-asset)
//
// The script and the style are inlined and allowed by their SHA-256 in the
// document's Content-Security-Policy, which forbids everything else: no
// other script, style, image, font, media, frame or connection. The last
// line seals the file with the SHA-256 of everything before it; the server
// refuses to serve a file whose seal does not match (a packaging error).
// The output is deterministic: same sources and lockfile, same bytes.
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "../../supervisor/assets/preview-panel.html");

const bundle = await build({
  entryPoints: [join(here, "src/panel.js")],
  bundle: true,
  minify: true,
  format: "iife",
  platform: "browser",
  target: "es2020",
  legalComments: "none",
  charset: "utf8",
  write: false,
  logLevel: "warning",
});
const script = bundle.outputFiles[0].text.trimEnd();
const style = readFileSync(join(here, "src/panel.css"), "utf8").trimEnd();
if (/<\/script/i.test(script) || /<\/style/i.test(style)) {
  throw new Error("the inlined script or style contains a closing tag");
}

const sha = (text) => "'sha256-" + createHash("sha256").update(text, "utf8").digest("base64") + "'";
const csp = [
  "default-src 'none'",
  `script-src ${sha(script)}`,
  `style-src ${sha(style)}`,
  "img-src 'none'",
  "font-src 'none'",
  "media-src 'none'",
  "connect-src 'none'",
  "object-src 'none'",
  "frame-src 'none'",
  "worker-src 'none'",
  "manifest-src 'none'",
  "form-action 'none'",
  "base-uri 'none'",
].join("; ");

const template = readFileSync(join(here, "src/panel.html"), "utf8");
const parts = { "@CSP@": csp, "@STYLE@": style, "@SCRIPT@": script };
let body = template;
for (const [marker, value] of Object.entries(parts)) {
  const at = body.indexOf(marker);
  if (at < 0 || body.indexOf(marker, at + 1) >= 0) throw new Error(`template marker ${marker} must appear once`);
  // Split and join: a replacement string would interpret "$" in the script.
  body = body.slice(0, at) + value + body.slice(at + marker.length);
}
const seal = `<!-- snowluma-mcp preview panel sha256=${createHash("sha256").update(body, "utf8").digest("hex")} -->\n`;
const asset = body + seal;

if (process.argv.includes("--check")) {
  let current = null;
  try {
    current = readFileSync(out, "utf8");
  } catch {
    // missing: stale
  }
  if (current !== asset) {
    console.error(
      "supervisor/assets/preview-panel.html is not what ui/preview builds: run `npm --prefix ui/preview ci && npm --prefix ui/preview run build` and commit it",
    );
    process.exit(1);
  }
  console.error(`preview panel asset is fresh (${asset.length} bytes)`);
} else {
  writeFileSync(out, asset);
  console.error(`wrote supervisor/assets/preview-panel.html (${asset.length} bytes)`);
}
