#!/usr/bin/env bash
# Installs what the preview panel's build and browser test need:
#   * ui/preview/node_modules (npm ci from package-lock.json): the official
#     Apps client (@modelcontextprotocol/ext-apps) and its peers, esbuild,
#     playwright-core (which downloads no browser);
#   * Debian's chromium (/usr/bin/chromium), installed with apt when missing
#     and running as root; otherwise the script stops and says what to install.
# npm ci is skipped while the lockfile is unchanged since it last succeeded.
# Run by ./scripts/test and scripts/check-ui-asset. It never skips silently.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
top="$(cd "$here/../.." && pwd)"
state="$top/target/ui-preview"
mkdir -p "$state"

need() {
    local path="$1" pkgs="$2"
    command -v "$path" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ui/preview setup: $path is missing; installing Debian packages: $pkgs" >&2
        apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >&2
    fi
    if ! command -v "$path" >/dev/null 2>&1; then
        echo "ui/preview setup: '$path' is required; install $pkgs (Debian/Ubuntu: apt-get install $pkgs)" >&2
        exit 1
    fi
}

need node nodejs
need npm npm
if [ "${1:-}" != "--no-browser" ]; then
    need /usr/bin/chromium chromium
fi

stamp="$state/npm.stamp"
lock_sum="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
if [ ! -d "$here/node_modules" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
    echo "ui/preview setup: npm ci in ui/preview" >&2
    (cd "$here" && npm ci --no-audit --no-fund --loglevel=error >&2)
    echo "$lock_sum" >"$stamp"
fi
echo "ui/preview setup: ready" >&2
