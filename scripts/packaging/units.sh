# shellcheck shell=bash
# check-packaging, part 2 (unit lint): the systemd units pass
# `systemd-analyze verify`, the service's offline exposure is at most 1.5,
# and the directives the program depends on are present (its syscalls
# allowed, no PrivateNetwork=, ...); the environment-file template documents
# every SNOWLUMA_MCP_* variable, all commented out; the client snippets are
# valid JSON. The same for snowluma-mcp-http.service (serve-http), whose
# hardening must be the session unit's. Sets: $overall (the session
# service's exposure), $overall_http (the HTTP service's).
[[ ${BASH_SOURCE[0]} != "$0" ]] || { echo "${0##*/}: part of scripts/check-packaging; run that" >&2; exit 2; }

# Syscalls the program makes that a unit filter must leave allowed: worker
# start (socketpair, clone, close_range, execveat of the binary's descriptor), worker
# self-confinement (prctl, Landlock, seccomp), the shared audit log (flock,
# fdatasync, ftruncate, pwrite64), the audit peer (getsockopt SO_PEERCRED) and file transfer
# (openat2 beneath a directory descriptor, renameat2 RENAME_NOREPLACE,
# descriptors passed with sendmsg/recvmsg), serve-http's listener (bind,
# listen, accept4) and its per-token pacing state (the launcher's memfd_create;
# the sessions' flock, pread64, pwrite64 on it).
REQUIRED_SYSCALLS="socketpair clone clone3 close_range execveat prctl landlock_create_ruleset landlock_add_rule
    landlock_restrict_self seccomp flock fdatasync ftruncate pwrite64 getsockopt openat2 renameat2 sendmsg recvmsg
    bind listen accept4 memfd_create pread64"

section "systemd units: systemd-analyze verify"
# An alternative root holding the host's own units (for sysinit.target and
# friends), ours, and a stand-in /usr/bin/snowluma-mcp: verify checks that
# ExecStart= names an executable, and the real binary is not built yet.
vroot=$tmp/verify-root
mkdir -p "$vroot/usr/lib/systemd" "$vroot/usr/bin" "$vroot/etc/systemd/system"
cp -a /usr/lib/systemd/system "$vroot/usr/lib/systemd/"
cp "$SRC/$UNIT_SOCKET" "$SRC/$UNIT_SERVICE" "$SRC/$UNIT_HTTP" "$vroot/usr/lib/systemd/system/"
printf '#!/bin/sh\nexit 0\n' >"$vroot/usr/bin/snowluma-mcp"
chmod 755 "$vroot/usr/bin/snowluma-mcp"
# verify exits 0 on unknown keys and unparsable values (it only warns), so any
# output at all counts as a failure.
if out=$(systemd-analyze verify --man=no --root="$vroot" "$UNIT_SOCKET" "$UNIT_SERVICE" "$UNIT_HTTP" 2>&1) && [[ -z $out ]]; then
    ok "verify --root: $UNIT_SOCKET $UNIT_SERVICE $UNIT_HTTP (no diagnostics)"
else
    fail "verify --root: $UNIT_SOCKET $UNIT_SERVICE $UNIT_HTTP"
    printf '%s\n' "$out" | sed 's/^/    /'
fi

# ---------------------------------------------------------------------------
section "systemd units: systemd-analyze security --offline=yes (service exposure <= 1.5)"
exposure() { # exposure UNIT: checks it, prints the overall score on stdout's last line
    local unit=$1 sec_rc=0 sec_out score tenths
    sec_out=$(systemd-analyze security --offline=yes --no-pager --threshold="$MAX_EXPOSURE" \
        "$vroot/usr/lib/systemd/system/$unit" 2>&1) || sec_rc=$?
    score=$(printf '%s\n' "$sec_out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\) .*/\1/p')
    printf '%s\n' "$sec_out" | grep '✗' | sed "s/^/    $unit deduction: /" | tr -s ' ' || true
    if [[ -z $score ]]; then
        fail "$unit: no overall exposure in systemd-analyze's output"
        printf '%s\n' "$sec_out" | tail -n 5 | sed 's/^/    /'
    else
        tenths=$(awk -v e="$score" 'BEGIN { printf "%d", e * 10 + 0.5 }')
        echo "    $unit overall exposure: $score"
        if ((sec_rc == 0 && tenths <= MAX_EXPOSURE)); then
            ok "$unit exposure $score <= 1.5 (--threshold=$MAX_EXPOSURE passed)"
        else
            fail "$unit exposure $score > 1.5 (systemd-analyze rc $sec_rc)"
        fi
    fi
    exposure_score=$score
}
exposure_score=
exposure "$UNIT_SERVICE"
overall=$exposure_score
exposure "$UNIT_HTTP"
overall_http=$exposure_score

# ---------------------------------------------------------------------------
section "systemd units: what the program needs"
# The effective (comment-free) value lines of a unit, "Key=value".
directives() { sed -e 's/^[[:space:]]*//' -e '/^[#;]/d' -e '/^\[/d' -e '/^$/d' "$1"; }
svc=$(directives "$SRC/$UNIT_SERVICE")
sock=$(directives "$SRC/$UNIT_SOCKET")
has() { grep -qxF -- "$2" <<<"$1"; }
for d in ExecStart=/usr/bin/snowluma-mcp StandardInput=socket StandardOutput=socket StandardError=journal \
    User=snowluma-mcp Group=snowluma-mcp EnvironmentFile=-/etc/snowluma-mcp/snowluma-mcp.env \
    MemoryDenyWriteExecute=yes NoNewPrivileges=yes IPAddressDeny=any \
    LogsDirectory=snowluma-mcp Environment=SNOWLUMA_MCP_AUDIT_LOG=/var/log/snowluma-mcp/audit.jsonl; do
    check "service: $d" has "$svc" "$d"
done
check "service: no PrivateNetwork= (the network worker needs TCP)" \
    bash -c '! grep -qiE "^PrivateNetwork=(yes|true|on|1)" <<<"$1"' _ "$svc"
check "service: RestrictAddressFamilies= keeps AF_UNIX AF_INET AF_INET6" \
    bash -c 'grep -qxE "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6" <<<"$1"' _ "$svc"
check "service: no RuntimeDirectory= (it would delete the socket's directory)" \
    bash -c '! grep -q "^RuntimeDirectory=" <<<"$1"' _ "$svc"
check "service: no PrivateUsers= (the audit peer uid would read as nobody)" \
    bash -c '! grep -qiE "^PrivateUsers=(yes|true|on|1|self|identity)" <<<"$1"' _ "$svc"
check "service: no RestrictSUIDSGID= (it makes openat2 fail with ENOSYS)" \
    bash -c '! grep -qiE "^RestrictSUIDSGID=(yes|true|on|1)" <<<"$1"' _ "$svc"
http=$(directives "$SRC/$UNIT_HTTP")
# The HTTP service: serve-http on a loopback port with the token file as a
# credential, restarted on failure, configured like the sessions.
for d in "ExecStart=/usr/bin/snowluma-mcp serve-http --listen 127.0.0.1:8765 --http-token-file=%d/http-tokens" \
    LoadCredential=http-tokens:/etc/snowluma-mcp/http-tokens Restart=on-failure StandardError=journal \
    User=snowluma-mcp Group=snowluma-mcp EnvironmentFile=-/etc/snowluma-mcp/snowluma-mcp.env \
    Environment=SNOWLUMA_MCP_STREAM_DIR=/var/lib/snowluma-mcp/downloads \
    Environment=SNOWLUMA_MCP_AUDIT_LOG=/var/log/snowluma-mcp/audit.jsonl \
    "StateDirectory=snowluma-mcp snowluma-mcp/downloads" LogsDirectory=snowluma-mcp UMask=0077 \
    WantedBy=multi-user.target; do
    check "http service: $d" has "$http" "$d"
done
check "http service: no StandardInput=socket, no --allow-remote by default" \
    bash -c '! grep -qE "^StandardInput=|--allow-remote" <<<"$1"' _ "$http"
check "http service: TasksMax= and MemoryMax= set (all sessions share its cgroup)" \
    bash -c 'grep -qE "^TasksMax=[0-9]+$" <<<"$1" && grep -qE "^MemoryMax=[0-9]+[KMGT]?$" <<<"$1"' _ "$http"
# The sandbox sections (network, privileges, filesystem, system calls) are
# the session unit's, directive for directive.
sandbox() { sed -n '/^# --- Network/,/^# --- Resources/p' "$1" | sed -e 's/^[[:space:]]*//' -e '/^[#;]/d' -e '/^$/d'; }
if diff_out=$(diff <(sandbox "$SRC/$UNIT_SERVICE") <(sandbox "$SRC/$UNIT_HTTP")) && [[ -n $(sandbox "$SRC/$UNIT_HTTP") ]]; then
    ok "http service: the sandbox directives are exactly $UNIT_SERVICE's ($(sandbox "$SRC/$UNIT_HTTP" | wc -l))"
else
    fail "http service: the sandbox directives differ from $UNIT_SERVICE's"
    printf '%s\n' "$diff_out" | sed 's/^/    /'
fi
for d in ListenStream=/run/snowluma-mcp/mcp.sock Accept=yes SocketMode=0660; do
    check "socket: $d" has "$sock" "$d"
done
socket_group=$(sed -n 's/^SocketGroup=//p' <<<"$sock")
check "socket: SocketGroup=$socket_group is created by postinst" \
    grep -qE "addgroup .*--system ${socket_group:-MISSING}\$" packaging/debian/postinst

# Expand syscall groups as systemd 252+ knows them.
declare -A group_cache
expand_syscalls() { # expand_syscalls NAME...: one syscall per line
    local n x
    for n in "$@"; do
        if [[ $n == @* ]]; then
            if [[ -z ${group_cache[$n]+set} ]]; then
                group_cache[$n]=$(systemd-analyze syscall-filter --no-pager "$n" | sed -n '2,$p' | awk '$1 !~ /^#/ && NF { print $1 }')
            fi
            for x in ${group_cache[$n]}; do expand_syscalls "$x"; done
        else
            echo "$n"
        fi
    done
}
allowed=$(for v in $(sed -n 's/^SystemCallFilter=\([^~]\)/\1/p' <<<"$svc"); do expand_syscalls "$v"; done | sort -u)
denied=$(for v in $(sed -n 's/^SystemCallFilter=~//p' <<<"$svc"); do expand_syscalls "$v"; done | sort -u)
for s in $REQUIRED_SYSCALLS; do
    if grep -qxF "$s" <<<"$allowed" && ! grep -qxF "$s" <<<"$denied"; then
        ok "SystemCallFilter= allows $s"
    else
        fail "SystemCallFilter= does not allow $s"
    fi
done

# ---------------------------------------------------------------------------
section "environment template and client snippets"
vars=$({ grep -oE '^\| `SNOWLUMA_MCP_[A-Z_]+`' README.md | tr -d '|` '
         grep -ohE 'env = "SNOWLUMA_MCP_[A-Z_]+"' config/src/*.rs | sed 's/.*"\(.*\)"/\1/'; } | sort -u)
[[ -n $vars ]] || fail "found no SNOWLUMA_MCP_* variables in README.md or config/src"
missing=""
for v in $vars; do grep -qE "^#$v=" "$env_file" || missing+=" $v"; done
if [[ -z $missing ]]; then ok "$env_file documents all $(wc -w <<<"$vars") variables"; else fail "$env_file lacks:$missing"; fi
check "$env_file sets nothing (every assignment commented out)" \
    bash -c '! grep -vqE "^[[:space:]]*(#|$)" "$1"' _ "$env_file"
if command -v python3 >/dev/null; then
    for f in packaging/clients/*.json; do
        check "valid JSON: $f" python3 -m json.tool "$f" /dev/null
    done
else
    echo "  note: python3 missing, JSON snippets not checked"
fi
