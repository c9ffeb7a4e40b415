# shellcheck shell=bash
# check-packaging, part 5 (boot test, with --boot): installs the .deb in a
# throwaway container that boots systemd (systemd-nspawn over an overlay of
# / whose writes go to a tmpfs) and runs real sessions through the hardened
# units: docs, read and write mode, who may connect, what the processes run
# as, the audit peer, purge. Reads: $deb. Sets: $mounts.
[[ ${BASH_SOURCE[0]} != "$0" ]] || { echo "${0##*/}: part of scripts/check-packaging; run that" >&2; exit 2; }

section "boot test: the .deb under a real systemd (throwaway container)"
cargo build -q --locked -p snowluma-fake --bin snowluma-fake
fake=$(cargo metadata -q --locked --format-version 1 --no-deps | sed 's/.*"target_directory":"\([^"]*\)".*/\1/')/debug/snowluma-fake
out=$tmp/boot-out
mkdir -p "$out"
cp "$deb" "$out/pkg.deb"
cp "$fake" "$out/snowluma-fake"
# Runs inside the container as a oneshot unit; one ok:/FAIL: line per
# check in result.txt, command output in detail.txt; powers off at exit.
cat >"$out/test.sh" <<'IN_CONTAINER'
#!/bin/bash
exec >/out/result.txt 2>>/out/detail.txt
trap 'echo END; systemctl poweroff --no-block' EXIT
t() { local what=$1; shift; if "$@" >>/out/detail.txt 2>&1; then echo "ok: $what"; else echo "FAIL: $what"; fi; }
SOCK=/run/snowluma-mcp/mcp.sock
ENV_FILE=/etc/snowluma-mcp/snowluma-mcp.env
# session.sh CALL: as the calling user, initialize and one tools/call through
# socat; prints both responses, then holds the session open until
# /tmp/release exists (or 10 s), so that its processes can be inspected.
cat >/tmp/session.sh <<'S'
#!/bin/bash
coproc B { exec socat STDIO UNIX-CONNECT:/run/snowluma-mcp/mcp.sock; }
printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"boot-test","version":"1"}}}' >&"${B[1]}"
IFS= read -r -t 20 l1 <&"${B[0]}"; printf '%s\n' "$l1"
printf '%s\n%s\n' '{"jsonrpc":"2.0","method":"notifications/initialized"}' "$1" >&"${B[1]}"
IFS= read -r -t 20 l2 <&"${B[0]}"; printf '%s\n' "$l2"
touch /tmp/held
for _ in $(seq 100); do [[ -e /tmp/release ]] && break; sleep 0.1; done
eval "exec ${B[1]}>&-"
wait
S
chmod 755 /tmp/session.sh
# session USER CALL: run session.sh as USER; inspect while held; wait for it.
session() {
    rm -f /tmp/held /tmp/release /tmp/session.out
    su "$1" -s /bin/bash -c "/tmp/session.sh '$2'" >/tmp/session.out 2>>/out/detail.txt &
    local pid=$! n
    for n in $(seq 200); do [[ -e /tmp/held ]] && break; sleep 0.1; done
    [[ -e /tmp/held ]] && inspect
    touch /tmp/release
    wait "$pid"
    cat /tmp/session.out >>/out/detail.txt
}
inspect() { :; }

t "dpkg -i installs the package" dpkg -i /out/pkg.deb
t "system user snowluma-mcp: home /nonexistent, no login" \
    bash -c '[[ $(getent passwd snowluma-mcp | cut -d: -f6,7) == /nonexistent:/usr/sbin/nologin ]]'
t "group snowluma-mcp-clients exists" getent group snowluma-mcp-clients
t "env file is root:snowluma-mcp 0640" bash -c '[[ $(stat -c %U:%G:%a '"$ENV_FILE"') == root:snowluma-mcp:640 ]]'
t "snowluma-mcp.socket is enabled" systemctl is-enabled --quiet snowluma-mcp.socket
t "snowluma-mcp-http.service is installed, neither enabled nor started (opt-in)" \
    bash -c '[[ $(systemctl is-enabled snowluma-mcp-http.service) == disabled ]] && ! systemctl is-active --quiet snowluma-mcp-http.service'
t "snowluma-mcp.socket starts" systemctl start snowluma-mcp.socket
t "socket is root:snowluma-mcp-clients 0660" bash -c '[[ $(stat -c %U:%G:%a '"$SOCK"') == root:snowluma-mcp-clients:660 ]]'
useradd -m alice && useradd -m bob && adduser --quiet alice snowluma-mcp-clients

# docs mode (the template configures nothing)
inspect() {
    local svc_uid p ps=0 bad=0
    svc_uid=$(id -u snowluma-mcp)
    for p in $(pgrep -u snowluma-mcp); do
        ps=$((ps + 1))
        grep -qx "NoNewPrivs:[[:space:]]*1" /proc/$p/status || bad=1
        grep -qx "Seccomp:[[:space:]]*2" /proc/$p/status || bad=1
    done
    t "session: supervisor and worker run as snowluma-mcp ($ps processes)" test "$ps" -ge 2
    t "session: every process has no_new_privs and a seccomp filter" test "$bad" = 0
    t "session: a catalog worker runs" pgrep -u snowluma-mcp -f "__snowluma-worker catalog"
}
session alice '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_categories","arguments":{}}}'
inspect() { :; }
t "docs: initialize answered through the socket" grep -q '"serverInfo":{"name":"snowluma-mcp"' /tmp/session.out
t "docs: list_categories answered" grep -q '"id":2,"result":{.*"structuredContent"' /tmp/session.out
gone() { local n; for n in $(seq 50); do [[ -z $(systemctl list-units --all --no-legend 'snowluma-mcp@*') ]] && return 0; sleep 0.1; done; return 1; }
t "the session's unit is gone after the client disconnects" gone

# read mode against the fake SnowLuma on loopback (IPAddressAllow=localhost)
runuser -u nobody -- /out/snowluma-fake --token boot-test-token --port 3999 >/tmp/fake.url 2>>/out/detail.txt &
for n in $(seq 50); do [[ -s /tmp/fake.url ]] && break; sleep 0.1; done
printf '%s\n' SNOWLUMA_MCP_ENDPOINT=http://127.0.0.1:3999/ SNOWLUMA_MCP_MODE=read SNOWLUMA_MCP_TOKEN=boot-test-token >>"$ENV_FILE"
inspect() { t "read: a network worker runs" pgrep -u snowluma-mcp -f "__snowluma-worker network"; }
session alice '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"query_action","arguments":{"action":"get_status"}}}'
inspect() { :; }
t "read: query_action get_status reached SnowLuma" grep -q '"id":2,"result":{.*"diagnostics":{"outcome":"success"' /tmp/session.out

# write mode: a download lands in the unit's StateDirectory, written by the
# file-transfer worker under ProtectSystem=strict
head -c 300000 /dev/urandom >/out/dl.bin
chmod 644 /out/dl.bin
pkill -u nobody -f snowluma-fake; sleep 0.2; rm -f /tmp/fake.url
runuser -u nobody -- /out/snowluma-fake --token boot-test-token --port 3999 --file dl.bin=/out/dl.bin >/tmp/fake.url 2>>/out/detail.txt &
for n in $(seq 50); do [[ -s /tmp/fake.url ]] && break; sleep 0.1; done
echo SNOWLUMA_MCP_MODE=write >>"$ENV_FILE"
inspect() { t "write: a file-transfer worker runs" pgrep -u snowluma-mcp -f "__snowluma-worker files"; }
session alice '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"invoke_action","arguments":{"action":"download_file_stream","params":{"file":"dl.bin","chunk_size":65536}}}}'
inspect() { :; }
dl_path=$(grep -o '"file_path":"[^"]*"' /tmp/session.out | head -n 1 | cut -d'"' -f4)
t "write: download_file_stream saved into /var/lib/snowluma-mcp/downloads" \
    bash -c "[[ '$dl_path' == /var/lib/snowluma-mcp/downloads/* ]]"
t "write: the downloaded file is intact, 0600 snowluma-mcp" \
    bash -c "cmp -s /out/dl.bin '$dl_path' && [[ \$(stat -c %U:%a '$dl_path') == snowluma-mcp:600 ]]"

# who may connect, who may read the token
t "a user outside snowluma-mcp-clients cannot connect" bash -c "! su bob -s /bin/bash -c 'socat -u OPEN:/dev/null UNIX-CONNECT:$SOCK'"
t "a socket client cannot read the env file" bash -c "! su alice -s /bin/bash -c 'cat $ENV_FILE'"

# audit: the shared log, the connecting user as peer, an intact chain
AUDIT=/var/log/snowluma-mcp/audit.jsonl
t "audit log, head and key are 0600 snowluma-mcp" \
    bash -c "[[ \$(stat -c %U:%a $AUDIT $AUDIT.head $AUDIT.key | sort -u) == snowluma-mcp:600 ]]"
t "audit records the connecting uid ($(id -u alice), alice)" grep -q "\"peer\":{\"uid\":$(id -u alice)," "$AUDIT"
t "audit chain verifies" snowluma-mcp audit verify "$AUDIT"
echo "info: online $(systemd-analyze security --no-pager snowluma-mcp@x.service 2>/dev/null | tail -n 1)"

# purge
t "dpkg --purge removes the package" dpkg --purge snowluma-mcp
t "purge removed the user and both groups" bash -c '! getent passwd snowluma-mcp && ! getent group snowluma-mcp && ! getent group snowluma-mcp-clients'
t "purge removed /var/lib/snowluma-mcp and /etc/snowluma-mcp" bash -c '[[ ! -e /var/lib/snowluma-mcp && ! -e /etc/snowluma-mcp ]]'
t "purge removed the socket's enablement" bash -c '! ls /etc/systemd/system/sockets.target.wants/snowluma-mcp.socket'
echo "--- journal of the sessions" >>/out/detail.txt
journalctl --no-pager -o cat -u 'snowluma-mcp@*' 2>&1 | tail -n 25 >>/out/detail.txt
IN_CONTAINER
chmod 755 "$out/test.sh"
printf '[Unit]\nDescription=check-packaging boot test\nAfter=multi-user.target\n[Service]\nType=oneshot\nExecStart=/out/test.sh\n' >"$out/boot-test.service"
# The container's root: an overlay of / whose writes land in a tmpfs, so
# nothing the test installs touches this machine.
ovl=$tmp/ovl
mkdir -p "$ovl"
if mount -t tmpfs -o size=2G,mode=0755 tmpfs "$ovl"; then
    mounts+=("$ovl")
    mkdir -p "$ovl/upper" "$ovl/work" "$ovl/root"
    if mount -t overlay overlay -o "lowerdir=/,upperdir=$ovl/upper,workdir=$ovl/work" "$ovl/root"; then
        mounts+=("$ovl/root")
    else
        fail "cannot mount an overlay of / (overlayfs)"
    fi
else
    fail "cannot mount a tmpfs for the container"
fi
if mountpoint -q "$ovl/root"; then
    # Without a host systemd, nspawn leaves empty "payload"/"supervisor"
    # cgroups and a propagation directory behind: remove the new ones.
    cgroups_before=$(ls -d /sys/fs/cgroup/payload /sys/fs/cgroup/supervisor /sys/fs/cgroup/*/payload /sys/fs/cgroup/*/supervisor 2>/dev/null || true)
    boot_rc=0
    # nspawn's own syscall filter predates Landlock: let the container use it,
    # as a host systemd does for the unit's SystemCallFilter=.
    timeout 300 systemd-nspawn --quiet -D "$ovl/root" --machine=snowluma-mcp-check --register=no --keep-unit --private-network \
        --system-call-filter="landlock_create_ruleset landlock_add_rule landlock_restrict_self" \
        --link-journal=no --bind="$out:/out" --bind-ro="$out/boot-test.service:/etc/systemd/system/boot-test.service" \
        -b -- systemd.wants=boot-test.service </dev/null >"$tmp/boot-console.log" 2>&1 || boot_rc=$?
    for d in /sys/fs/cgroup/payload /sys/fs/cgroup/supervisor /sys/fs/cgroup/*/payload /sys/fs/cgroup/*/supervisor; do
        [[ -d $d ]] && ! grep -qxF "$d" <<<"$cgroups_before" && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
    rmdir /run/systemd/nspawn/propagate/snowluma-mcp-check 2>/dev/null || true
    if [[ ! -f $out/result.txt ]]; then
        fail "the container ran no test (systemd-nspawn rc $boot_rc)"
        tail -n 20 "$tmp/boot-console.log" | sed 's/^/    /'
    else
        while IFS= read -r line; do
            case $line in
                ok:*) ok "${line#ok: }" ;;
                FAIL:*) fail "${line#FAIL: }" ;;
                info:*) echo "    ${line#info: }" ;;
            esac
        done <"$out/result.txt"
        grep -qx END "$out/result.txt" || fail "the container's test did not finish (systemd-nspawn rc $boot_rc)"
        if grep -q '^FAIL' "$out/result.txt" || ! grep -qx END "$out/result.txt"; then
            echo "  container detail:"; tail -n 50 "$out/detail.txt" | sed 's/^/    /'
        fi
    fi
fi
