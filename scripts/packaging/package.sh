# shellcheck shell=bash
# check-packaging, part 3 (package contents): `cargo deb -p snowluma-mcp`
# builds, and the package holds exactly the expected files with the
# expected modes, control fields, conffiles and maintainer scripts.
# Sets: $deb (the package), $root (its files, extracted).
[[ ${BASH_SOURCE[0]} != "$0" ]] || { echo "${0##*/}: part of scripts/check-packaging; run that" >&2; exit 2; }

section "cargo deb -p snowluma-mcp"
deb=$(cargo deb -p snowluma-mcp --locked 2>"$tmp/cargo-deb.log" | tail -n 1) || {
    cat "$tmp/cargo-deb.log" >&2
    die "cargo deb failed"
}
[[ -f $deb ]] || die "cargo deb printed no package path"
ok "built ${deb#"$PWD"/}"

# ---------------------------------------------------------------------------
section "package contents (dpkg-deb -c)"
dpkg-deb -c "$deb" | awk '{ print "    " $1, $2, $6 }'
declare -A expect=(
    [./usr/bin/snowluma-mcp]=-rwxr-xr-x
    [./usr/lib/systemd/system/$UNIT_SOCKET]=-rw-r--r--
    [./usr/lib/systemd/system/$UNIT_SERVICE]=-rw-r--r--
    [./usr/lib/systemd/system/$UNIT_HTTP]=-rw-r--r--
    [./etc/snowluma-mcp/snowluma-mcp.env]=-rw-r-----
    [./usr/share/doc/snowluma-mcp/copyright]=-rw-r--r--
    [./usr/share/doc/snowluma-mcp/README.md]=-rw-r--r--
    [./usr/share/doc/snowluma-mcp/bridge.md]=-rw-r--r--
)
for f in packaging/clients/*; do expect[./usr/share/doc/snowluma-mcp/clients/${f##*/}]=-rw-r--r--; done
declare -A seen=()
while read -r mode owner _ _ _ path _; do
    if [[ $mode == d* ]]; then
        # A directory is expected when some expected file lies under it.
        match=no
        for p in "${!expect[@]}"; do [[ $p == "$path"* ]] && match=yes && break; done
        [[ $match == yes ]] || fail "unexpected directory $path"
        continue
    fi
    [[ $owner == 0/0 ]] || fail "$path is owned by $owner, not root"
    if [[ -z ${expect[$path]+set} ]]; then
        fail "unexpected file $path"
    elif [[ $mode != "${expect[$path]}" ]]; then
        fail "$path has mode $mode, expected ${expect[$path]}"
    else
        seen[$path]=1
    fi
done < <(dpkg-deb -c "$deb")
for p in "${!expect[@]}"; do
    [[ -n ${seen[$p]+set} ]] || fail "missing or wrong: $p"
done
ok "${#seen[@]} files present with the expected modes and owners, nothing else"

root=$tmp/pkg
dpkg-deb -x "$deb" "$root"
for u in "$UNIT_SOCKET" "$UNIT_SERVICE" "$UNIT_HTTP"; do
    check "packaged $u is $SRC/$u" cmp -s "$root/usr/lib/systemd/system/$u" "$SRC/$u"
done
check "packaged env template is $env_file" cmp -s "$root/etc/snowluma-mcp/snowluma-mcp.env" "$env_file"
if v=$("$root/usr/bin/snowluma-mcp" --version 2>&1); then ok "packaged binary runs: $v"; else fail "packaged binary does not run: $v"; fi

# ---------------------------------------------------------------------------
section "control fields, conffiles and maintainer scripts (dpkg-deb -I)"
dpkg-deb -I "$deb" | sed 's/^/    /'
field() { dpkg-deb -f "$deb" "$1"; }
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
check "Package: snowluma-mcp" test "$(field Package)" = snowluma-mcp
check "Version: $version-1" test "$(field Version)" = "$version-1"
check "Architecture: $(dpkg --print-architecture)" test "$(field Architecture)" = "$(dpkg --print-architecture)"
check "Maintainer is set" test -n "$(field Maintainer)"
check "Description is set" test -n "$(field Description)"
for dep in libc6 adduser init-system-helpers; do
    check "Depends on $dep" grep -qE "(^|, )$dep( |,|$)" <<<"$(field Depends)"
done
ctl=$tmp/control
dpkg-deb -e "$deb" "$ctl"
check "conffiles is exactly /etc/snowluma-mcp/snowluma-mcp.env" \
    test "$(cat "$ctl/conffiles")" = /etc/snowluma-mcp/snowluma-mcp.env
for s in postinst prerm postrm; do
    check "$s is executable and parses (sh -n)" bash -c 'test -x "$1" && sh -n "$1"' _ "$ctl/$s"
    check "$s had its DEBHELPER token replaced" bash -c '! grep -q "#DEBHELPER#" "$1"' _ "$ctl/$s"
done
check "postinst creates the system user" \
    grep -q 'adduser --quiet --system --group --no-create-home --home /nonexistent' "$ctl/postinst"
check "postinst sets the env file to root:snowluma-mcp 0640" \
    bash -c 'grep -q "chown root:snowluma-mcp" "$1" && grep -q "chmod 0640" "$1"' _ "$ctl/postinst"
check "postinst enables $UNIT_SOCKET" grep -q "deb-systemd-helper enable $UNIT_SOCKET" "$ctl/postinst"
check "no maintainer script starts a unit on installation" \
    bash -c '! grep -hE "deb-systemd-invoke (start|restart) " "$@"' _ "$ctl/postinst" "$ctl/prerm" "$ctl/postrm"
check "the template service is never enabled or started by the package" \
    bash -c '! grep -h "snowluma-mcp@" "$@" | grep -qE "deb-systemd-(helper|invoke)"' _ "$ctl/postinst" "$ctl/prerm" "$ctl/postrm"
check "$UNIT_HTTP is never enabled or started by the package" \
    bash -c '! grep -hE "deb-systemd-helper (enable|update-state).*snowluma-mcp-http|deb-systemd-invoke (start|restart) .*snowluma-mcp-http|systemctl (enable|start) .*snowluma-mcp-http" "$@"' \
    _ "$ctl/postinst" "$ctl/prerm" "$ctl/postrm"
check "postinst try-restarts $UNIT_HTTP on upgrade only" \
    bash -c 'grep -q "deb-systemd-invoke try-restart snowluma-mcp-http.service" "$1" && grep -q "\[ -n \"\$2\" \]" "$1"' _ "$ctl/postinst"
check "prerm stops $UNIT_HTTP on removal" grep -q "deb-systemd-invoke stop snowluma-mcp-http.service" "$ctl/prerm"
check "postrm removes the user on purge" grep -q 'deluser --quiet --system snowluma-mcp' "$ctl/postrm"
