# shellcheck shell=bash
# Shared by the parts of scripts/check-packaging (sourced, in one shell):
# the unit and package names, the ok/FAIL counters and their helpers, and
# the temporary directory with what must be undone at exit (the bridge's
# socket activator, the boot test's mounts).
[[ ${BASH_SOURCE[0]} != "$0" ]] || { echo "${0##*/}: part of scripts/check-packaging; run that" >&2; exit 2; }

MAX_EXPOSURE=15            # systemd-analyze's 0..100 scale: 15 is "1.5"
CARGO_DEB_VERSION=3.8.0    # the version whose behaviour the metadata relies on
UNIT_SOCKET=snowluma-mcp.socket
UNIT_SERVICE=snowluma-mcp@.service
UNIT_HTTP=snowluma-mcp-http.service   # serve-http; opt-in, shipped as a plain file
SRC=packaging/systemd
env_file=$SRC/snowluma-mcp.env

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "  ok: $*"; }
fail() { failed=$((failed + 1)); echo "  FAIL: $*"; }
section() { echo; echo "== $*"; }
die() { echo "check-packaging: $*" >&2; echo "check-packaging: $passed passed, $((failed + 1)) failed"; exit 1; }
check() { # check DESCRIPTION COMMAND...: ok/FAIL by the command's status
    local what=$1; shift
    if "$@"; then ok "$what"; else fail "$what"; fi
}

tmp=$(mktemp -d)
activator_pid=
mounts=()   # mount points to undo, innermost last
cleanup() {
    if [[ -n $activator_pid ]]; then kill "$activator_pid" 2>/dev/null || true; wait "$activator_pid" 2>/dev/null || true; fi
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true; done
    # Never recurse into a mount that is still there (the overlay shows all of /).
    for i in "${mounts[@]}"; do
        if mountpoint -q "$i"; then echo "check-packaging: $i is still mounted; left $tmp in place" >&2; return; fi
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
