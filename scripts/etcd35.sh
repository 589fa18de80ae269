#!/usr/bin/env bash
# Fetch an etcd 3.5 build from Debian (trixie, else sid) without touching the system's apt
# configuration: a temporary sources list pointing at the mirror this machine already uses,
# `apt-get download`, and `dpkg -x` into .tools/etcd35/. The static Go binaries run on bookworm.
#
# Prints the path to export as METALGUARD_ETCD_BIN, e.g.
#   export METALGUARD_ETCD_BIN="$(scripts/etcd35.sh)"
#   cargo nextest run -p metalguard-etcd
# (the harness finds etcdctl next to the etcd binary).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/etcd35"
bin="$dest/usr/bin/etcd"

# The version is read whole before it is matched: under pipefail, `etcd --version | grep -q`
# fails when grep exits before etcd wrote its last line (SIGPIPE), as it did once on a fresh
# clone while the machine was busy.
if [[ -x "$bin" ]] && grep -q '^etcd Version: 3\.5\.' <<<"$("$bin" --version 2>/dev/null)"; then
    echo "$bin"
    exit 0
fi

# The Debian mirror this machine is configured with (deb822 or one-line format).
mirror="$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1 || true)"
if [[ -z "$mirror" ]]; then
    mirror="$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -n1 || true)"
fi
if [[ -z "$mirror" ]]; then
    echo "etcd35.sh: no Debian mirror found in the apt configuration" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/debs"

fetch() {
    local suite="$1"
    cat >"$work/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main
EOF
    local opts=(
        -o "Dir::Etc::SourceList=$work/sources.list"
        -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$work/lists"
        -o "Dir::Cache::Archives=$work/archives"
        -o "Dir::Cache::pkgcache="
        -o "Dir::Cache::srcpkgcache="
        -o "APT::Sandbox::User=root"
    )
    apt-get "${opts[@]}" -qq update >&2 || return 1
    (cd "$work/debs" && apt-get "${opts[@]}" -qq download etcd-server etcd-client >&2) || return 1
}

if ! fetch trixie; then
    echo "etcd35.sh: trixie failed, trying sid" >&2
    rm -f "$work"/debs/*.deb
    fetch sid
fi

rm -rf "$dest"
mkdir -p "$dest"
for deb in "$work"/debs/*.deb; do
    dpkg -x "$deb" "$dest"
done
if ! grep -q '^etcd Version: 3\.5\.' <<<"$("$bin" --version)"; then
    echo "etcd35.sh: $bin is not an etcd 3.5 build:" >&2
    "$bin" --version >&2
    exit 1
fi
echo "$bin"
