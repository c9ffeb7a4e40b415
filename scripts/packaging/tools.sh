# shellcheck shell=bash
# check-packaging, part 1: the tools the checks need, installed when
# missing (Debian packages systemd, socat and netcat-openbsd, and for --boot
# systemd-container; cargo-deb from crates.io). Reads: $boot.
[[ ${BASH_SOURCE[0]} != "$0" ]] || { echo "${0##*/}: part of scripts/check-packaging; run that" >&2; exit 2; }

section "tools"
apt_updated=no
apt_install() { # apt_install PACKAGE...: install what is missing (root only)
    local missing=() p
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    ((${#missing[@]} == 0)) && return 0
    if [[ $(id -u) != 0 ]]; then echo "  missing Debian packages ${missing[*]} (run as root, or install them)"; return 1; fi
    if [[ $apt_updated == no ]]; then apt-get update -qq >/dev/null && apt_updated=yes || return 1; fi
    echo "  installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
command -v systemd-analyze >/dev/null || apt_install systemd || die "systemd-analyze is unavailable (Debian package systemd)"
command -v dpkg-deb >/dev/null || die "dpkg-deb is unavailable: this check needs a Debian-based machine"
sd_version=$(systemd-analyze --version | awk 'NR == 1 { print $2 }')
[[ $sd_version =~ ^[0-9]+$ ]] && ((sd_version >= 250)) || die "systemd-analyze $sd_version has no --offline (needs systemd >= 250)"
ok "systemd-analyze (systemd $sd_version)"
# Optional: the bridge smoke test uses them when they can be had.
apt_install socat netcat-openbsd || echo "  note: socat/netcat-openbsd not installable; bridge smoke tests will be skipped"
if ! cargo deb --version >/dev/null 2>&1; then
    echo "  installing cargo-deb $CARGO_DEB_VERSION (cargo install --locked)"
    cargo install cargo-deb --locked --version "$CARGO_DEB_VERSION" --quiet || die "cannot install cargo-deb"
fi
ok "$(cargo deb --version)"
if [[ $boot == yes ]]; then
    [[ $(id -u) == 0 ]] || die "--boot needs root (mounts and systemd-nspawn)"
    command -v systemd-nspawn >/dev/null || apt_install systemd-container || die "systemd-nspawn is unavailable (Debian package systemd-container)"
    command -v socat >/dev/null || die "--boot needs socat"
    ok "systemd-nspawn ($(systemd-nspawn --version | awk 'NR == 1 { print $2 }'))"
fi
