#!/usr/bin/env bash
# The main job: the local lab. On a fresh Debian 12 machine it installs what the lab needs
# (scripts/setup.sh --lab), builds the three binaries once, and runs the lab:
#   scripts/lab.sh            the demo: every scenario in turn, then a summary table
#   scripts/lab.sh up         a lab left running, with a cheat-sheet to poke it (Ctrl-C stops it)
#   scripts/lab.sh run hang   chosen scenarios (hang, double-failure, admin-fence, bad-bmc,
#                             replace, controller-crash, partition, swapped-bmc,
#                             rotate-credentials, locked-account, drill)
#   scripts/lab.sh run replace --etcd-layout static-pod
#                             the spare's etcd as kubeadm's static Pod (the agent writes the
#                             manifest, the lab is the host's kubelet); default env-file
#   scripts/lab.sh --kubernetes, scripts/lab.sh run hang --kubernetes, scripts/lab.sh up --kubernetes
#                             Kubernetes mode: the lab's etcd is also a real kube-apiserver's
#                             store (kube-controller-manager too, a Node per host whose kubelet
#                             follows the host's power), and the controller runs with
#                             --backend=kubernetes on GuardedHosts. Needs the Kubernetes binaries
#                             (scripts/kube-build.sh, Go; built once) and the controller's
#                             default feature. As root the controller runs as the shipped
#                             Deployment's two Pods on two real nodes (containerd, kubelet,
#                             kube-proxy; its image built by packaging/build-image.sh) and the
#                             agents reach the leader through its NodePort Service; not root,
#                             or with --controller-processes, as processes on the machine.
# Everything the lab starts binds 127.0.0.1 (or addresses inside network namespaces it
# creates) and is stopped when it ends, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
kubernetes=false
processes=false
args=()
for arg in "$@"; do
  case "$arg" in
    --kubernetes) kubernetes=true; args+=("$arg") ;;
    --controller-processes) processes=true ;;
    *) args+=("$arg") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
pods=false
if $kubernetes && ! $processes; then
  if [ "$(id -u)" -eq 0 ]; then
    pods=true
  else
    echo "lab.sh --kubernetes: not root, so no real nodes (bridges, iptables, containerd): the controller runs as processes"
  fi
fi
if $pods; then scripts/setup.sh --lab-pods; else scripts/setup.sh --lab; fi
echo "== cargo build (agent, controller, lab)"
if $kubernetes; then
  # kube-apiserver, kube-controller-manager and kubectl of the pinned release: built once into
  # .tools/ (skipped when present), found through the variables --print-env prints.
  kube_dir="$(scripts/kube-build.sh --print-env | sed -n 's/^METALGUARD_KUBE_BIN_DIR=//p')"
  if [ ! -x "$kube_dir/kube-apiserver" ] && ! command -v go >/dev/null 2>&1; then
    echo "lab.sh --kubernetes: $kube_dir has no kube-apiserver and Go 1.26, which builds it, is not installed (scripts/setup.sh)" >&2
    exit 1
  fi
  if $pods; then
    # kubelet, kube-scheduler, kube-proxy and the sandbox program as well.
    scripts/kube-build.sh --node
  else
    scripts/kube-build.sh
  fi
  eval "$(scripts/kube-build.sh --print-env | sed 's/^/export /')"
  # The Kubernetes backend is the controller's default feature.
  cargo build --locked -p metalguard-e2e -p metalguard-agent -p metalguard-controller --bins
  if $pods; then
    echo "== the controller's image (packaging/build-image.sh --profile dev)"
    packaging/build-image.sh --profile dev
    version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
    set -- "$@" --controller-image "$PWD/target/image/metalguard-controller-$version.tar"
  fi
else
  # The standalone controller is all the lab runs: without the Kubernetes types (the
  # controller's default feature; no other crate here has default features) it builds minutes
  # faster, no k8s-openapi. One invocation, so both cores stay busy across the three.
  cargo build --locked -p metalguard-e2e -p metalguard-agent -p metalguard-controller --bins --no-default-features
fi
# No command, or options only (scripts/lab.sh --etcd-layout static-pod): the demo.
case "${1:-}" in ""|-*) set -- demo "$@" ;; esac
exec target/debug/metalguard-lab "$@"
