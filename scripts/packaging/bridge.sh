# shellcheck shell=bash
# check-packaging, part 4: a bridge smoke test: the packaged binary
# behind a per-connection Unix socket (systemd-socket-activate --accept, as
# snowluma-mcp.socket does), reached through socat and nc -U as
# packaging/bridge/README.md says. Reads: $root. Sets: $activator_pid.
[[ ${BASH_SOURCE[0]} != "$0" ]] || { echo "${0##*/}: part of scripts/check-packaging; run that" >&2; exit 2; }

section "bridge smoke test (packaged binary behind a per-connection socket)"
sock_path=$tmp/mcp.sock
init='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"check-packaging","version":"1"}}}'
inited='{"jsonrpc":"2.0","method":"notifications/initialized"}'
call='{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_categories","arguments":{}}}'
smoke() { # smoke NAME COMMAND...: one MCP session through a bridge command
    local name=$1; shift
    local line1="" line2="" rc=0
    coproc BRIDGE { exec "$@" 2>>"$tmp/bridge.log"; }
    local in=${BRIDGE[1]} out=${BRIDGE[0]} pid=$BRIDGE_PID
    printf '%s\n' "$init" >&"$in"
    IFS= read -r -t 15 line1 <&"$out" || true
    printf '%s\n%s\n' "$inited" "$call" >&"$in"
    IFS= read -r -t 15 line2 <&"$out" || true
    exec {in}>&-   # the client closes its stdin: the session must end
    local waited=0
    while kill -0 "$pid" 2>/dev/null && ((waited < 50)); do sleep 0.1; waited=$((waited + 1)); done
    if kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null; rc=1; fi
    wait "$pid" 2>/dev/null || true
    if [[ $line1 == *'"id":1'*'"serverInfo":{"name":"snowluma-mcp"'* ]]; then
        ok "$name: initialize answered"
    else
        fail "$name: no initialize response (got: ${line1:0:120})"
    fi
    if [[ $line2 == *'"id":2'*'"structuredContent"'* ]]; then
        ok "$name: tools/call list_categories answered"
    else
        fail "$name: no tools/call response (got: ${line2:0:120})"
    fi
    if ((rc == 0)); then ok "$name: exited after the client closed its input"; else fail "$name: still running 5 s after the client closed its input"; fi
}
if ! command -v systemd-socket-activate >/dev/null; then
    echo "  note: systemd-socket-activate missing, smoke test skipped"
elif ! command -v socat >/dev/null && ! command -v nc >/dev/null; then
    echo "  note: neither socat nor nc available, smoke test skipped"
else
    # As snowluma-mcp.socket does: accept each connection and start one
    # server with the connection as stdin and stdout; an empty environment
    # means docs mode.
    systemd-socket-activate --inetd --accept --listen="$sock_path" \
        env -i SNOWLUMA_MCP_LOG=info "$root/usr/bin/snowluma-mcp" >"$tmp/server.log" 2>&1 &
    activator_pid=$!
    for _ in $(seq 50); do [[ -S $sock_path ]] && break; sleep 0.1; done
    if [[ ! -S $sock_path ]]; then
        fail "systemd-socket-activate did not listen on $sock_path"
    else
        if command -v socat >/dev/null; then
            smoke "socat" socat STDIO "UNIX-CONNECT:$sock_path"
        else
            echo "  note: socat missing, its smoke test skipped"
        fi
        if command -v nc >/dev/null && grep -q 'OpenBSD netcat' <<<"$(nc -h 2>&1 || true)"; then
            smoke "nc -N -U" nc -N -U "$sock_path"
        else
            echo "  note: OpenBSD nc missing, its smoke test skipped"
        fi
    fi
    if ((failed > 0)); then
        echo "  server log:"; sed 's/^/    /' "$tmp/server.log" | tail -n 20
    fi
fi
