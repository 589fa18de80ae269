#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: set-up, formatting, lints, then every unit,
# integration and end-to-end test with cargo-nextest against real etcd and BMC emulators.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The standalone-only controller (no Kubernetes types) that scripts/lab.sh builds.
cargo clippy -p metalguard-controller --all-targets --no-default-features --locked -- -D warnings

echo "== packages under a real systemd (systemd-nspawn)"
packaging/test-packages.sh

echo "== cargo nextest run"
profile=default
[ "${CI:-}" = "true" ] && profile=ci
cargo nextest run --workspace --locked --profile "$profile"

echo "== leftover processes"
# Every test cleans up what it started; harness processes carry "mg-harness-" in their paths.
if leftovers=$(pgrep -af 'mg-harness-' | grep -v pgrep); then
  echo "processes left behind by the tests:"
  echo "$leftovers"
  exit 1
fi
echo "none"
