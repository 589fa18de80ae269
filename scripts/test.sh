#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: set-up, formatting, lints, then every unit,
# integration and end-to-end test with cargo-nextest against real etcd and BMC emulators.
set -euo pipefail
cd "$(dirname "$0")/.."
# The prebuilt tools setup.sh links (cargo-nextest, scripts/requirements-tools.txt).
export PATH="$PWD/.tools/bin:$PATH"

# The Kubernetes and etcd 3.6 binaries the tests run (scripts/kube-build.sh --node: Go, ~10
# minutes of both cores on a cold machine) build beside set-up, the lints, the packages and
# the previous release, which all leave a core idle for stretches (a crate's single-threaded
# build, a link, debootstrap, a container's boot); nothing before the test run needs them.
mkdir -p .tools
kube_log=.tools/kube-build.log
scripts/kube-build.sh --node >"$kube_log" 2>&1 &
kube_build=$!
trap 'pkill -P "$kube_build" 2>/dev/null; kill "$kube_build" 2>/dev/null; true' EXIT

scripts/setup.sh --kube-elsewhere

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The standalone-only controller (no Kubernetes types) that scripts/lab.sh builds.
cargo clippy -p metalguard-controller --all-targets --no-default-features --locked -- -D warnings

echo "== packages under a real systemd (systemd-nspawn)"
packaging/test-packages.sh

# The controller's image from the test build's binary (issue 26, item 1), for
# tests/tests/image.rs: imported into containerd and run. The release image is the musl build
# (packaging/build-image.sh without --profile).
echo "== the controller's image (the test build's binary)"
packaging/build-image.sh --profile dev
METALGUARD_IMAGE_ARCHIVE="$PWD/target/image/metalguard-controller-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1).tar"
export METALGUARD_IMAGE_ARCHIVE

# The etcd matrix (issue 17): the whole suite runs on etcd 3.6 (the release Kubernetes ships,
# built by setup.sh with scripts/kube-build.sh); metalguard-etcd's own suite runs again on
# Debian's 3.4 (PATH) and on a 3.5 build (scripts/etcd35.sh, fetched by setup.sh). Every run
# uses the one build of the workspace's tests: the later runs select a package with a filter
# instead of `-p`, which could resolve features differently and build again.
# The previous release's agent and controller, for the mixed-version tests (issue 26,
# tests/tests/lab_upgrade.rs): built from the commit packaging/releases.tsv records, in this
# tree's target directory so that shared dependencies are built once.
echo "== the previous release ($(scripts/previous-release.sh --version)) for the mixed-version tests"
METALGUARD_PREVIOUS_BIN_DIR="$(scripts/previous-release.sh)"
export METALGUARD_PREVIOUS_BIN_DIR

echo "== the Kubernetes and etcd 3.6 test binaries (built beside the steps above)"
if ! wait "$kube_build"; then
  cat "$kube_log"
  echo "scripts/kube-build.sh --node failed (its output is above)" >&2
  exit 1
fi
trap - EXIT
cat "$kube_log"
eval "$(scripts/kube-build.sh --print-env | sed 's/^/export /')"
etcd36="$METALGUARD_ETCD36_BIN"
etcd35="$(scripts/etcd35.sh)"
etcd34="$(command -v etcd)"

profile=default
[ "${CI:-}" = "true" ] && profile=ci

# Runs nextest with `etcd` (etcdctl beside it) and a label naming the version it reports; a
# failed run is remembered and the next release still runs, so one log shows every release.
failed=()
nextest_on() {
  local etcd="$1"; shift
  local version
  version="$("$etcd" --version | sed -n 's/^etcd Version: //p')"
  echo "== cargo nextest run${*:+ $*} on etcd $version ($etcd)"
  METALGUARD_ETCD_BIN="$etcd" METALGUARD_ETCDCTL_BIN="$(dirname "$etcd")/etcdctl" \
    cargo nextest run --workspace --locked --profile "$profile" "$@" \
    || failed+=("etcd $version: cargo nextest run${*:+ $*}")
}

nextest_on "$etcd36"
nextest_on "$etcd34" -E 'package(metalguard-etcd)'
nextest_on "$etcd35" -E 'package(metalguard-etcd)'

# The nemesis soak (issue 24), short, with fixed seeds: five hosts, two controllers, random
# faults within what quorum tolerates, and the history checker; same binaries as the suite.
echo "== nemesis soak: standalone and Kubernetes, fixed seeds"
# `--workspace` resolves features as the test build did, so the soak binary is that build's.
cargo build --locked --workspace --bin metalguard-soak
scripts/soak.sh --no-build --seed 3 --duration 75 --out target/soak/ci-standalone-seed-3 \
  || failed+=("soak: standalone, seed 3 (scripts/soak.sh --seed 3 --duration 75)")
scripts/soak.sh --no-build --kubernetes --seed 3 --duration 75 --out target/soak/ci-kubernetes-seed-3 \
  || failed+=("soak: kubernetes, seed 3 (scripts/soak.sh --kubernetes --seed 3 --duration 75)")

echo "== leftover processes"
# Every test cleans up what it started; harness processes carry "mg-harness-" in their paths.
if leftovers=$(pgrep -af 'mg-harness-' | grep -v pgrep); then
  echo "processes left behind by the tests:"
  echo "$leftovers"
  exit 1
fi
echo "none"

if [ "${#failed[@]}" -gt 0 ]; then
  echo "== failed runs"
  printf '%s\n' "${failed[@]}"
  exit 1
fi
