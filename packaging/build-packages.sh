#!/usr/bin/env bash
# Builds the packages from a clean checkout:
#   target/debian/metalguard-agent_<version>-1_amd64.deb      (cargo-deb)
#   target/rpm/metalguard-agent-<version>-1.x86_64.rpm            (rpmbuild, packaging/build-rpm.py)
#   target/x86_64-unknown-linux-musl/release/metalguard-agent  (static, for older glibc)
#   target/debian/metalguard-controller_<version>-1_amd64.deb and
#   target/rpm/metalguard-controller-<version>-1.x86_64.rpm (standalone hosts: built
#   without the Kubernetes backend, `--no-default-features`)
# The binaries packed are copied to target/package-assets/bin/ first and stripped there, so
# packing never changes a binary cargo built, whatever its profile.
# Usage: packaging/build-packages.sh [--no-musl] [--profile NAME]
#   --profile dev packs the binaries of the test build instead of a release build: the
#   package test (packaging/test-packages.sh, run by scripts/test.sh) checks the packaging,
#   which is the same for every profile, and shares the one build of the test command instead
#   of two release builds (~10 minutes of both cores on a cold machine, docs/benchmarks.md).
#   Packages to ship are built with the default, release. With --profile dev both binaries
#   are built with the workspace's features (`--workspace --bin ...`) as the test build
#   resolves them, so that they are that build's artifacts: the controller so packed also
#   carries the Kubernetes backend, which a standalone configuration never starts. A `-p`
#   build per package resolves features for that package alone and built most dependencies
#   again (6.6 min on a cold 2-core machine, issue 29).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[packages] %s\n' "$*"; }

musl=true
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --no-musl) musl=false ;;
    --profile) profile="${2:?--profile needs a name}"; shift ;;
    *) echo "usage: $0 [--no-musl] [--profile NAME]" >&2; exit 2 ;;
  esac
  shift
done
# Cargo's output directory for a profile: `dev` builds into target/debug.
out="target/$([ "$profile" = dev ] && echo debug || echo "$profile")"
bin=target/package-assets/bin

if ! command -v cargo-deb >/dev/null 2>&1; then
  say "installing cargo-deb"
  cargo install --locked cargo-deb
fi
command -v rpmbuild >/dev/null 2>&1 || { say "rpmbuild missing: apt-get install rpm"; exit 1; }
# The package test's builds compress fast: only their contents are checked.
deb_fast=(); rpm_fast=()
if [ "$profile" = dev ]; then deb_fast=(--fast); rpm_fast=(--fast); fi

# pack_binary NAME: copies the built binary NAME where the packages' assets name it.
pack_binary() {
  mkdir -p "$bin"
  install -m 0755 "$out/$1" "$bin/$1"
  strip -s "$bin/$1"
}

if [ "$profile" = dev ]; then
  say "agent and controller: the test build's binaries (workspace features)"
  cargo build --profile dev --locked --workspace --bin metalguard-agent --bin metalguard-controller
else
  say "agent: $profile build"
  cargo build --profile "$profile" --locked -p metalguard-agent
fi
pack_binary metalguard-agent
"$bin/metalguard-agent" generate-assets target/package-assets >/dev/null

say "deb"
cargo deb -p metalguard-agent --no-build --no-strip --locked "${deb_fast[@]}"
say "rpm"
packaging/build-rpm.py metalguard-agent "${rpm_fast[@]}"

if [ "$profile" != dev ]; then
  say "controller: $profile build (standalone, no Kubernetes backend)"
  cargo build --profile "$profile" --locked -p metalguard-controller --no-default-features
fi
pack_binary metalguard-controller
cargo deb -p metalguard-controller --no-build --no-strip --locked "${deb_fast[@]}"
packaging/build-rpm.py metalguard-controller "${rpm_fast[@]}"

if $musl; then
  say "static musl build"
  grep -q x86_64-unknown-linux-musl <<<"$(rustup target list --installed)" \
    || rustup target add x86_64-unknown-linux-musl
  command -v musl-gcc >/dev/null 2>&1 || { say "musl-gcc missing: apt-get install musl-tools"; exit 1; }
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked -p metalguard-agent --target x86_64-unknown-linux-musl
  grep -q "static" <<<"$(file target/x86_64-unknown-linux-musl/release/metalguard-agent)" \
    || { say "musl binary is not static"; exit 1; }
fi
ls -l target/debian/*.deb target/rpm/*.rpm
