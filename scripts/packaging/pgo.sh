# shellcheck shell=bash
# check-packaging, part 0 (profile-guided builds): the rustc wrapper every
# build goes through (.cargo/config.toml) adds the profile to optimised
# compilations only, and only for a compiler whose LLVM can read it; the
# profile and the LLVM version it needs are in the repository.
[[ ${BASH_SOURCE[0]} != "$0" ]] || { echo "${0##*/}: part of scripts/check-packaging; run that" >&2; exit 2; }

section "profile-guided builds (packaging/pgo/rustc)"
wrapper=packaging/pgo/rustc
check "cargo's rustc wrapper is packaging/pgo/rustc" grep -qx 'rustc-wrapper = "packaging/pgo/rustc"' .cargo/config.toml
check "the profile is in the repository" test -s packaging/pgo/snowluma-mcp.profdata
check "the LLVM version it needs is a number" grep -qx '[0-9][0-9]*' packaging/pgo/llvm-version
need=$(cat packaging/pgo/llvm-version)
# A stand-in compiler: prints its arguments, and an LLVM version for -vV.
cat >"$tmp/fake-rustc" <<'SH'
#!/bin/sh
if [ "$1" = "-vV" ]; then echo "rustc 0.0.0"; echo "LLVM version: $FAKE_LLVM.1.0"; exit 0; fi
echo "$*"
SH
chmod +x "$tmp/fake-rustc"
profiled() { FAKE_LLVM=$1 "$wrapper" "$tmp/fake-rustc" "${@:2}" | grep -q -- "-Cprofile-use=$PWD/packaging/pgo/snowluma-mcp.profdata -Cllvm-args=-no-pgo-warn-mismatch"; }
check "opt-level=3 is built with the profile" profiled "$need" --crate-name x -C opt-level=3
not_profiled() { ! profiled "$@"; }
check "so it is by a newer LLVM" profiled $((need + 1)) --crate-name x -C opt-level=3
check "not by an older LLVM, which cannot read it" not_profiled $((need - 1)) --crate-name x -C opt-level=3
check "not at opt-level=0 (tests, debug builds)" not_profiled "$need" --crate-name x -C opt-level=0
check "not in the instrumented training build" not_profiled "$need" -Cprofile-generate=/x -C opt-level=3
check "the arguments pass through unchanged otherwise" \
    test "$(FAKE_LLVM=$need "$wrapper" "$tmp/fake-rustc" --crate-name 'a b' -C opt-level=0)" = "--crate-name a b -C opt-level=0"
check "rustc here can read the profile (LLVM >= $need)" \
    test "$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')" -ge "$need"
