#!/usr/bin/env bash
# Installs, idempotently, everything metalguard's build, tests and lab need on Debian 12:
# apt packages, a Python venv under .tools/ (git-ignored) with pinned sushy-tools and pyghmi,
# and cargo tools. Safe to run again: it only installs what is missing.
# `setup.sh --lab` installs only what the local lab needs (scripts/lab.sh): no packaging,
# benchmark or test-only tools, so a first lab run stays within minutes. `setup.sh --lab-pods`
# adds what runs the controller as Pods on real nodes (scripts/lab.sh --kubernetes as root):
# umoci and skopeo for its image, containerd, runc, the CNI plugins, iptables, conntrack, socat.
# Without --lab it also builds, when missing, the real Kubernetes control plane and the etcd 3.6
# the Kubernetes tests and the default suite run (scripts/kube-build.sh; Go 1.26 needed; the
# first build takes ~18 min and ~2.5 GB of memory on 2 cores, docs/benchmarks.md; later runs
# reuse it), and fetches the etcd 3.5 of the etcd matrix (scripts/etcd35.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
LAB_ONLY=false
# Prebuilt tools (scripts/requirements-tools.txt) are linked here; scripts/test.sh puts it
# first on PATH too.
export PATH="$PWD/.tools/bin:$PATH"
[ "${1:-}" = "--lab" ] && LAB_ONLY=true
LAB_PODS=false
if [ "${1:-}" = "--lab-pods" ]; then LAB_ONLY=true; LAB_PODS=true; fi
# --kube-elsewhere: the caller builds the Kubernetes binaries itself (scripts/test.sh runs
# scripts/kube-build.sh beside set-up, clippy and the packages, issue 29).
KUBE_HERE=true
[ "${1:-}" = "--kube-elsewhere" ] && KUBE_HERE=false

APT_PACKAGES=(
  etcd-server etcd-client      # real etcd 3.4 for every etcd test
  protobuf-compiler libprotobuf-dev # etcd-client's build script needs protoc and the well-known .proto files
  openipmi                     # ipmi_sim, the faithful IPMI simulator
  ipmitool freeipmi-tools      # independent IPMI clients for harness self-tests and benchmarks
  curl                         # independent Redfish client for harness self-tests
  python3-venv                 # venv for sushy-tools and pyghmi
  openssl iproute2 procps      # certificates, network namespaces, process checks
  libxml2-utils                # xmllint for the fence-agent metadata test
  fence-agents                 # its metadata.rng schema (test) and fence_ipmilan/fence_redfish (benchmarks)
  debootstrap systemd-container # a bookworm root booted with systemd-nspawn for the package tests
  rpm                          # rpmbuild builds the .rpm (packaging/build-rpm.py); rpm -qlp / --scripts check it
  musl-tools                   # the static (musl) agent build
  prometheus                   # promtool: checks and unit-tests the shipped alert rules (controller/tests/alerts.rs)
  umoci skopeo                 # the controller's image without Docker (packaging/build-image.sh)
  containerd runc              # the container runtime that imports and runs it (tests/tests/image.rs)
  containernetworking-plugins iptables conntrack socat # real nodes' Pod network, kube-proxy and the in-cluster API (tests/src/node)
)

LAB_PACKAGES=(
  etcd-server etcd-client protobuf-compiler libprotobuf-dev openipmi python3-venv
  openssl iproute2 procps
)
if $LAB_PODS; then
  LAB_PACKAGES+=(umoci skopeo containerd runc containernetworking-plugins iptables conntrack socat)
fi
if $LAB_ONLY; then
  APT_PACKAGES=("${LAB_PACKAGES[@]}")
fi

say() { printf '[setup] %s\n' "$*"; }

need_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
  # A container runtime already installed from another package (Docker's containerd.io, which
  # conflicts with Debian's containerd) serves the image test as well: keep it.
  if [[ "$pkg" == containerd || "$pkg" == runc ]] \
    && command -v containerd >/dev/null && command -v ctr >/dev/null \
    && command -v containerd-shim-runc-v2 >/dev/null && command -v runc >/dev/null; then
    continue
  fi
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" || need_apt+=("$pkg")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
  say "apt: installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Only promtool is wanted from the prometheus package: on a host booted with systemd its
  # postinst also starts a Prometheus server on :9090, which the tests never use.
  if [[ " ${need_apt[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    say "apt: stopping and disabling the prometheus service the package started (only promtool is used)"
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
  # Likewise containerd: the image test starts a private one (tests/src/containerd.rs).
  if [[ " ${need_apt[*]} " == *" containerd "* ]] && [ -d /run/systemd/system ]; then
    say "apt: stopping and disabling the containerd service the package started (the tests run their own)"
    $SUDO systemctl disable --now containerd.service >/dev/null 2>&1 || true
  fi
else
  say "apt: all packages present"
fi

VENV=.tools/venv
REQ=scripts/requirements-test.txt
STAMP="$VENV/.requirements.sha256"
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python3" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  say "python: creating $VENV from $REQ"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ"
  echo "$want" > "$STAMP"
else
  say "python: $VENV up to date"
fi

if $LAB_ONLY; then
  say "done (lab only)"
  exit 0
fi

# The cargo tools are built with a light release profile (opt-level 1, no LTO, 16 codegen
# units, no debug info): each runs for seconds per test run, and building them fully optimized
# was the larger part of their ~15 minutes on a cold 2-core machine (issue 29,
# docs/benchmarks.md). Per-package settings of a tool's own manifest still apply.
cargo_install() {
  say "cargo: installing $*"
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo install --locked "$@"
}

# kube-apiserver, kube-controller-manager, kubectl, kubelet, kube-scheduler, kube-proxy, etcd
# and etcdctl of the pinned releases
# (tests/kube/*/go.mod) into .tools/, keyed by version; kube-build.sh skips what is built.
# It runs beside the cargo installs below: each leaves a core idle for stretches (a
# crate's single-threaded build, a link), so together they take less than one after the
# other on 2 cores (issue 29, docs/benchmarks.md).
if ! command -v go >/dev/null 2>&1; then
  echo "[setup] go not found: Go 1.26 is needed to build the Kubernetes test binaries (tests/kube/)" >&2
  exit 1
fi
kube_build=
if $KUBE_HERE; then
  say "kube: building or reusing the Kubernetes and etcd 3.6 test binaries (in the background)"
  # --node: kubelet, kube-scheduler, kube-proxy and the sandbox program too, for the tests on
  # real nodes (issue 26, tests/src/node).
  scripts/kube-build.sh --node &
  kube_build=$!
else
  say "kube: the caller builds the Kubernetes and etcd 3.6 test binaries"
fi
# The package test's bookworm root (packaging/nspawn-root.sh, cached in .cache/nspawn): its
# debootstrap waits on the network and the disk for ~1.5 min, so it runs beside the builds.
say "packages: building or reusing the package test's bookworm root (in the background)"
packaging/nspawn-root.sh >/dev/null &
nspawn_root=$!
# A set-up that fails meanwhile does not leave either running.
trap 'pkill -P "${kube_build:+$kube_build,}$nspawn_root" 2>/dev/null; kill $kube_build "$nspawn_root" 2>/dev/null; true' EXIT

# cargo-deb builds the .deb; the .rpm is rpmbuild's (apt `rpm`, packaging/build-rpm.py).
command -v cargo-deb >/dev/null 2>&1 || cargo_install cargo-deb

# etcd 3.5 for the etcd matrix of scripts/test.sh (3.4 is Debian's, 3.6 the build above):
# Debian trixie's package unpacked into .tools/etcd35/; kept when present.
say "etcd: fetching or reusing etcd 3.5 (scripts/etcd35.sh)"
scripts/etcd35.sh >/dev/null

# cargo-nextest: the prebuilt, hash-pinned build of scripts/requirements-tools.txt (seconds)
# when it can be installed; otherwise built from crates.io (9.5 min on a cold 2-core machine).
TOOLS_REQ=scripts/requirements-tools.txt
TOOLS_VENV=.tools/tools-venv
tools_want=$(sha256sum "$TOOLS_REQ" | cut -d' ' -f1)
if [ ! -x .tools/bin/cargo-nextest ] || [ "$(cat "$TOOLS_VENV/.requirements.sha256" 2>/dev/null)" != "$tools_want" ]; then
  say "cargo-nextest: installing the prebuilt build pinned in $TOOLS_REQ"
  rm -rf "$TOOLS_VENV" .tools/bin/cargo-nextest
  python3 -m venv "$TOOLS_VENV"
  if "$TOOLS_VENV/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes -r "$TOOLS_REQ" \
      && "$TOOLS_VENV/bin/cargo-nextest" nextest --version >/dev/null 2>&1; then
    mkdir -p .tools/bin
    ln -s ../tools-venv/bin/cargo-nextest .tools/bin/cargo-nextest
    echo "$tools_want" > "$TOOLS_VENV/.requirements.sha256"
  else
    say "cargo-nextest: the prebuilt build cannot be installed here; building it from crates.io"
    rm -rf "$TOOLS_VENV"
  fi
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  # Without the self-update feature (an HTTP client, archive formats): ~40 crates fewer, and
  # the test command never updates its tools.
  cargo_install cargo-nextest --no-default-features --features default-no-update
else
  say "cargo: nextest present ($(cargo nextest --version 2>/dev/null | head -n 1))"
fi

if [ -n "$kube_build" ] && ! wait "$kube_build"; then
  echo "[setup] scripts/kube-build.sh failed (its output is above)" >&2
  exit 1
fi
if ! wait "$nspawn_root"; then
  echo "[setup] packaging/nspawn-root.sh failed (its output is above)" >&2
  exit 1
fi
trap - EXIT
say "done"
