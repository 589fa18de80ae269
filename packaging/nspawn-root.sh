#!/usr/bin/env bash
# Builds (once) a Debian bookworm root with systemd for the package tests, cached in
# .cache/nspawn/bookworm (git-ignored); prints its path. Rebuilt when this script changes.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=.cache/nspawn
ROOT="$CACHE/bookworm"
STAMP="$CACHE/bookworm.stamp"
want=$(sha256sum "$0" | cut -d' ' -f1)
if [ -x "$ROOT/lib/systemd/systemd" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "$ROOT"; exit 0
fi
MIRROR=${METALGUARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
rm -rf "$ROOT"; mkdir -p "$CACHE"
# polkitd (with libpam-systemd for logind): the agent's systemd etcd launcher runs `systemctl
# start etcd` as user metalguard, which systemd authorizes through polkit and the package's rule.
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,procps,adduser,libc-bin,polkitd,libpam-systemd \
  bookworm "$ROOT" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
  || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
# No getty or network setup inside the container: the tests drive it with systemd-run/machinectl-less exec.
rm -f "$ROOT/etc/systemd/system/getty.target.wants/"* || true
echo "metalguard-test" > "$ROOT/etc/hostname"
echo "$want" > "$STAMP"
echo "$ROOT"
