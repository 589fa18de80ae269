#!/usr/bin/env bash
# Builds the packages from a clean checkout:
#   target/debian/metalguard-agent_<version>-1_amd64.deb      (cargo-deb)
#   target/generate-rpm/metalguard-agent-<version>-1.x86_64.rpm (cargo-generate-rpm)
#   target/x86_64-unknown-linux-musl/release/metalguard-agent  (static, for older glibc)
#   target/debian/metalguard-controller_<version>-1_amd64.deb and
#   target/generate-rpm/metalguard-controller-<version>-1.x86_64.rpm (standalone hosts: built
#   without the Kubernetes backend, `--no-default-features`)
# Usage: packaging/build-packages.sh [--no-musl]
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[packages] %s\n' "$*"; }

for tool in cargo-deb cargo-generate-rpm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    say "installing $tool"
    cargo install --locked "$tool"
  fi
done

say "release build"
cargo build --release --locked -p metalguard-agent
strip -s target/release/metalguard-agent
target/release/metalguard-agent generate-assets target/package-assets >/dev/null

say "deb"
cargo deb -p metalguard-agent --no-build --no-strip --locked
say "rpm"
cargo generate-rpm -p agent

say "controller: release build (standalone, no Kubernetes backend)"
cargo build --release --locked -p metalguard-controller --no-default-features
strip -s target/release/metalguard-controller
cargo deb -p metalguard-controller --no-build --no-strip --locked
cargo generate-rpm -p controller

if [ "${1:-}" != "--no-musl" ]; then
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
