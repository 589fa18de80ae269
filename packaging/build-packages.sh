#!/usr/bin/env bash
# Builds the packages from a clean checkout:
#   target/debian/metalguard-agent_<version>-1_amd64.deb      (cargo-deb)
#   target/generate-rpm/metalguard-agent-<version>-1.x86_64.rpm (cargo-generate-rpm)
#   target/x86_64-unknown-linux-musl/release/metalguard-agent  (static, for older glibc)
#   target/debian/metalguard-controller_<version>-1_amd64.deb and
#   target/generate-rpm/metalguard-controller-<version>-1.x86_64.rpm (standalone hosts: built
#   without the Kubernetes backend, `--no-default-features`)
# The binaries packed are copied to target/package-assets/bin/ first (and stripped there for
# a release), so packing never changes a binary cargo built, whatever its profile.
# Usage: packaging/build-packages.sh [--no-musl] [--profile NAME]
#   --profile dev packs the binaries of the test build instead of a release build: the
#   package test (packaging/test-packages.sh, run by scripts/test.sh) checks the packaging,
#   which is the same for every profile, and shares the one build of the test command instead
#   of two release builds (~10 minutes of both cores on a cold machine, docs/benchmarks.md).
#   Packages to ship are built with the default, release.
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

for tool in cargo-deb cargo-generate-rpm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    say "installing $tool"
    cargo install --locked "$tool"
  fi
done

# pack_binary NAME: copies the built binary NAME where the packages' assets name it.
pack_binary() {
  mkdir -p "$bin"
  install -m 0755 "$out/$1" "$bin/$1"
  if [ "$profile" = release ]; then strip -s "$bin/$1"; fi
}

say "agent: $profile build"
cargo build --profile "$profile" --locked -p metalguard-agent
pack_binary metalguard-agent
"$bin/metalguard-agent" generate-assets target/package-assets >/dev/null

say "deb"
cargo deb -p metalguard-agent --no-build --no-strip --locked
say "rpm"
cargo generate-rpm -p agent

say "controller: $profile build (standalone, no Kubernetes backend)"
cargo build --profile "$profile" --locked -p metalguard-controller --no-default-features
pack_binary metalguard-controller
cargo deb -p metalguard-controller --no-build --no-strip --locked
cargo generate-rpm -p controller

if $musl; then
  say "static musl build"
  rustup target list --installed | grep -q x86_64-unknown-linux-musl \
    || rustup target add x86_64-unknown-linux-musl
  command -v musl-gcc >/dev/null 2>&1 || { say "musl-gcc missing: apt-get install musl-tools"; exit 1; }
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked -p metalguard-agent --target x86_64-unknown-linux-musl
  file target/x86_64-unknown-linux-musl/release/metalguard-agent | grep -q "static" \
    || { say "musl binary is not static"; exit 1; }
fi
ls -l target/debian/*.deb target/generate-rpm/*.rpm
